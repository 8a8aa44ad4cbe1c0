"""Training and evaluation data: loaders (BIRD, Spider, SQaLe, SynSQL) into one row shape, difficulty estimation,
gold hygiene, database probes, the demo data generator, and ``data convert`` (``convert``, ``engine_copy``): a SQLite
benchmark copied to DuckDB files or PostgreSQL databases with its gold SQL transpiled and checked.

It imports the environment (databases, schema) and the foundation modules.
"""
