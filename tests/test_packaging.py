"""Packaging: a non-editable install carries the recipes and the demo data, and t2s finds them from any folder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from t2s.settings import REPO_ROOT
from t2s.settings import DEMO_DIR, RECIPES_DIR

# what `pip install .` reads from a checkout
SOURCES = ("t2s", "recipes", "data/demo", "setup.py", "pyproject.toml", "README.md", "LICENSE")

PROBE = """
import json, t2s
from t2s.settings import installed_from_wheel, workspace
from t2s.settings import DEMO_DIR, RECIPES_DIR
from t2s.training.pipeline import resolve_path
print(json.dumps({
    "package": t2s.__file__, "installed": installed_from_wheel(), "workspace": str(workspace()),
    "recipes_dir": str(RECIPES_DIR), "recipes": sorted(p.name for p in RECIPES_DIR.iterdir() if p.is_file()),
    "chat_templates": sorted(p.name for p in (RECIPES_DIR / "chat_templates").glob("*.jinja")),
    "demo_dir": str(DEMO_DIR), "demo_files": sorted(p.relative_to(DEMO_DIR).as_posix() for p in DEMO_DIR.rglob("*")
                                                    if p.is_file()),
    "smoke_recipe": str(resolve_path("recipes/smoke.yaml")), "smoke_data": str(resolve_path("data/demo/dev.json")),
}))
"""


def _install(tmp_path) -> Path:
    """``pip install --no-deps --target`` of a copy of the checkout (the build writes beside its sources)."""
    source = tmp_path / "source"
    for name in SOURCES:
        if (REPO_ROOT / name).is_dir():
            shutil.copytree(REPO_ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / name, source / name)
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                           "--no-index", "--target", str(site), str(source)], capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr
    return site


@pytest.mark.timeout(400)
def test_a_wheel_install_carries_the_recipes_and_demo_data(tmp_path):
    site = _install(tmp_path)
    elsewhere = tmp_path / "elsewhere"  # not the checkout, nor a parent of the install
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}

    def t2s(*argv, **kwargs):
        return subprocess.run([sys.executable, *argv], cwd=elsewhere, env=env, capture_output=True, text=True,
                              timeout=240, **kwargs)

    probe = t2s("-c", PROBE)
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout)
    bundled = site / "t2s" / "bundled"
    assert Path(found["package"]) == site / "t2s" / "__init__.py" and found["installed"] is True
    assert Path(found["workspace"]) == elsewhere  # outputs and caches go to the working folder
    assert Path(found["recipes_dir"]) == bundled / "recipes" and Path(found["demo_dir"]) == bundled / "data" / "demo"
    shipped_recipes = sorted(p.name for p in RECIPES_DIR.iterdir() if p.suffix in (".yaml", ".txt"))
    assert "smoke.yaml" in shipped_recipes and found["recipes"] == shipped_recipes
    for name in shipped_recipes:
        assert (bundled / "recipes" / name).read_bytes() == (RECIPES_DIR / name).read_bytes()
    templates = sorted(p.name for p in (RECIPES_DIR / "chat_templates").glob("*.jinja"))
    assert "gemma3.jinja" in templates and found["chat_templates"] == templates
    demo_files = sorted(p.relative_to(DEMO_DIR).as_posix() for p in DEMO_DIR.rglob("*") if p.is_file())
    assert any(name.endswith(".sqlite") for name in demo_files) and found["demo_files"] == demo_files
    # the smoke recipe's repository paths resolve to the installed copies
    assert Path(found["smoke_recipe"]) == bundled / "recipes" / "smoke.yaml"
    assert Path(found["smoke_data"]) == bundled / "data" / "demo" / "dev.json"

    helped = t2s("-m", "t2s", "demo", "--help")
    assert helped.returncode == 0 and "--steps" in helped.stdout, helped.stderr
    # the installed demo data is usable: the harness's gold self-check scores 1.0 on it
    scored = t2s("-m", "t2s", "eval", "--policy", "gold", "--data", found["demo_dir"], "--n", "3", "--output", "gold",
                 "--quiet")
    assert scored.returncode == 0, scored.stderr
    summary = json.loads((elsewhere / "gold" / "summary.json").read_text())["modes"]["full"]
    assert summary["n"] == 3 and summary["execution_accuracy_official"] == 1.0
