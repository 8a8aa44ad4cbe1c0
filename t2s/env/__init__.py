"""The environment: databases (read-only opening, the sandbox, deadlines, fetching; SQLite, DuckDB and PostgreSQL
through one engine layer), schema (tables, DDL, foreign
keys, join paths, BIRD column descriptions), the protocol and its call formats (prompts, reading a turn into calls,
rendering observations; JSON and native XML), the tools of each tool set, and the episode state machine.

It knows nothing of models or tokens, and imports only the foundation modules (``t2s.errors``, ``t2s.settings``).
"""
