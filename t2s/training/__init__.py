"""Training: recipe configs, the GRPO trainer subclass, the rollout that plays episodes through a backend and returns
what TRL's ``rollout_func`` returns, checkpoints, the supervised warm start, the run pipeline from recipe to model,
the step printer, the learning experiment of the demo, and the tiny test model.

It imports backends, scoring, data, the environment and the foundation modules.
"""
