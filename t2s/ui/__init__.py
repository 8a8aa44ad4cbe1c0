"""What a user types and reads: argument types and the parser every command uses (``args``), and the console that
never wraps a path, an id or SQL (``console``).

A foundation package: it imports nothing else of t2s but ``t2s.errors`` and ``t2s.settings``.
"""
