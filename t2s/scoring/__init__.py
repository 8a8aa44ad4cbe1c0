"""Scoring: execution metrics (official, strict, Soft-F1, behaviour), the reward functions of training and voting at k;
pure functions over execution results.

It imports the environment (databases, schema) and the foundation modules.
"""
