"""Training: recipe configs, the GRPO trainer subclass (its ``rollout_func`` plays through ``t2s.rollout``),
checkpoints, the supervised warm start, the run pipeline from recipe to model, the step printer, the learning
experiment of the demo, and the tiny test model.

It imports rollout, backends, scoring, data, the environment and the foundation modules.
"""
