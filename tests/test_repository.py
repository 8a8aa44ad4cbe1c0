"""What git keeps out of a checkout: the folders that `make install` and the runs fill, whether they are folders or
links to folders elsewhere (a second worktree links the first's ``.venv`` and ``.cache``). A link that git tracked
would, on the next checkout in the first worktree, replace the folder it points at, and git deletes the ignored files
in a folder it replaces: everything installed would be gone."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INSTALLED = (".venv", ".cache", "runs", "outputs")


def test_installed_folders_are_ignored_as_folders_and_as_links(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "checkout"
    repo.mkdir()
    shutil.copy(ROOT / ".gitignore", repo / ".gitignore")
    elsewhere = tmp_path / "elsewhere"
    for name in INSTALLED:
        (elsewhere / name).mkdir(parents=True)
        (elsewhere / name / "file").write_text("installed")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    for as_link in (True, False):
        for name in INSTALLED:
            target = repo / name
            if target.is_symlink():
                target.unlink()
            elif target.exists():
                shutil.rmtree(target)
            if as_link:
                target.symlink_to(elsewhere / name, target_is_directory=True)
            else:
                shutil.copytree(elsewhere / name, target)
        added = subprocess.run(["git", "add", "--all", "--dry-run"], cwd=repo, capture_output=True, text=True,
                               check=True).stdout.split()
        assert not [path for path in added if path.strip("'").split("/")[0] in INSTALLED], (as_link, added)
        assert "'.gitignore'" in added  # the dry run does list what is not ignored
