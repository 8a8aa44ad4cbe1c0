"""Evaluation: the policy options, the runner (output folder, resume) and its progress, eval policies, episode
records, reports (``summary.*``, ``report.html``), the one transcript renderer, reading runs, compare, score and the
pass-rate filter.

It plays episodes through ``t2s.rollout``, the driver training plays through too; it imports training (the model
folders it evaluates and exports), rollout, backends, scoring, data, the environment and the foundation modules.
"""
