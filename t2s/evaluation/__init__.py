"""Evaluation: the policy options, the runner (output folder, resume) and its progress, eval policies, episode
records, reports (``summary.*``, ``report.html``), the one transcript renderer, reading runs, compare, score and the
pass-rate filter.

It plays episodes through ``t2s.rollout``, the driver training plays through too. ``questions`` holds the seeded
``--n`` pick and the rule for questions on a missing database. It imports training (checkpoint fingerprints, the
CPU kernels' settings), rollout, backends, scoring, data, the environment and the foundation modules.
"""
