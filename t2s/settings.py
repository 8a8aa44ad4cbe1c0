"""Where things are: the repository, the embedded demo data and recipes (found by ``t2s.resources.shipped`` in a
checkout or an installed wheel), and the shared benchmark data.

The shared data directory (real BIRD and Spider files) is found from ``T2S_DATA_DIR`` or, by default,
``../shared/data`` beside the repository. Tests that need it skip with a visible reason when it is absent.
"""

from __future__ import annotations

import os
from pathlib import Path

from t2s.resources import REPO_ROOT, shipped

DEMO_DIR = shipped("data/demo")
RECIPES_DIR = shipped("recipes")


def shared_data_dir() -> Path:
    """The folder of real public benchmark files (may not exist)."""
    env = os.environ.get("T2S_DATA_DIR")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "data"


def offline_environment() -> None:
    """Set the variables that keep a run off the network and quiet (idempotent)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
