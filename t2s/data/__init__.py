"""Training and evaluation data: loaders (BIRD, Spider, SQaLe, SynSQL) into one row shape, difficulty estimation,
gold hygiene, database probes and the demo data generator.

It imports the environment (databases, schema) and the foundation modules.
"""
