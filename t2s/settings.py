"""Where things are: the repository's shipped files (the recipes and the demo data, from a checkout or a wheel),
where repository-relative outputs go, the shared benchmark data, and the variables that keep a run offline.

The code reads files that live beside the package in the repository: the recipes (``recipes/*.yaml`` and
``recipes/*.txt``) and the demo data (``data/demo``). A wheel carries copies of them under ``t2s/bundled/`` (see
setup.py); a checkout or an editable install has no ``t2s/bundled`` and uses the repository's own. Every place that
locates a recipe or the demo data goes through :func:`shipped`.

The shared data directory (real BIRD and Spider files) is found from ``T2S_DATA_DIR`` or, by default,
``../shared/data`` beside the repository. Tests that need it skip with a visible reason when it is absent.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent
BUNDLED_DIR = PACKAGE_DIR / "bundled"


def installed_from_wheel() -> bool:
    """True when t2s runs from a non-editable install (the package carries its own copies of the shipped files)."""
    return BUNDLED_DIR.is_dir()


def shipped(relative: str | Path) -> Path:
    """A shipped file or folder by its repository path (``recipes/smoke.yaml``, ``data/demo``): the checkout's, or
    the installed package's copy."""
    return (BUNDLED_DIR if installed_from_wheel() else REPO_ROOT) / relative


def workspace() -> Path:
    """Where repository-relative outputs and caches go (``runs/``, ``.cache/``, ``data/``): the checkout, or the
    working directory when t2s runs from a wheel."""
    return Path.cwd() if installed_from_wheel() else REPO_ROOT


DEMO_DIR = shipped("data/demo")
RECIPES_DIR = shipped("recipes")


def shared_data_dir() -> Path:
    """The folder of real public benchmark files (may not exist)."""
    env = os.environ.get("T2S_DATA_DIR")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "data"


def command_environment() -> None:
    """Keep a command quiet (idempotent) without forcing the hub offline: ``--model`` and ``--base`` may name hub ids,
    downloaded unless ``HF_HUB_OFFLINE=1`` is set (as ``train`` does)."""
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def offline_environment() -> None:
    """``command_environment`` and the hub offline: a run that downloads nothing (idempotent)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    command_environment()
