"""t2s: agentic text-to-SQL models trained with GRPO on TRL.

Importing the package is cheap: no torch, transformers or trl import happens until a command needs it.
"""

__version__ = "0.1.0"
