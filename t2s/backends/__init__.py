"""Generation backends: vLLM server (HTTP), vLLM colocate, transformers ``generate``, and scripted policies."""
