"""Where the repository's shipped files are, and where repository-relative outputs go, from a checkout or a wheel.

The code reads files that live beside the package in the repository: the recipes (``recipes/*.yaml`` and
``recipes/*.txt``) and the demo data (``data/demo``). A wheel carries copies of them under ``t2s/bundled/`` (see
setup.py); a checkout or an editable install has no ``t2s/bundled`` and uses the repository's own. Every place that
locates a recipe or the demo data goes through :func:`shipped`.
"""

from __future__ import annotations

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
