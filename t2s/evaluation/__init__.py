"""Evaluation: the policy options, the runner (output folder, resume) and its progress, eval policies, episode
records, reports (``summary.*``, ``report.html``), the one transcript renderer, reading runs, compare, score and the
pass-rate filter.

It plays episodes through the training rollout, so training and evaluation share one episode driver; it imports
training, backends, scoring, data, the environment and the foundation modules.
"""
