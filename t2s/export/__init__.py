"""Exporting a trained model (``t2s export``): ``folder`` writes a model folder vLLM and transformers load directly
(merged weights under the base's architecture, both stop tokens, the evaluated sampling defaults, the system prompt
the model was trained with), and ``model_card`` its card. It imports evaluation (an eval folder's summaries for the
card), training (recipe paths), the environment and the foundation modules.
"""
