"""Generation backends: the vLLM server (HTTP), vLLM colocate, transformers ``generate``, any OpenAI-compatible
endpoint (chat and function calling), and scripted policies; each turns prompts into model turns.

They import the environment (protocol, call formats, schema) and the foundation modules.
"""
