"""The benchmarks behind ``t2s bench``: environment overhead against plain sqlite3, rollout scheduling on a simulated
engine, and the CPU learning proofs; each reports its figures as ratios measured in one run.

They import every library package below the commands.
"""
