"""Packaging beyond pyproject.toml: the wheel carries the files the code reads from the repository.

Every ``recipes/*.yaml``, ``recipes/*.txt`` and ``recipes/chat_templates/*.jinja`` and everything in ``data/demo`` are
installed under ``t2s/bundled/`` with their repository paths (``t2s/bundled/recipes/smoke.yaml``, ``t2s/bundled/data/demo/dev.json``), where
``t2s.settings.shipped`` finds them in a non-editable install.
"""

from setuptools import find_packages, setup

# repository folder -> the files of it that the wheel carries
BUNDLED = {"recipes": ["*.yaml", "*.txt", "chat_templates/*.jinja"], "data/demo": ["**/*"]}


def bundled_package(folder: str) -> str:
    return "t2s.bundled." + folder.replace("/", ".")


setup(
    packages=find_packages(include=["t2s", "t2s.*"]) + [bundled_package(folder) for folder in BUNDLED],
    package_dir={bundled_package(folder): folder for folder in BUNDLED},
    package_data={"t2s": ["*.txt", "*.md", "**/*.txt"], **{bundled_package(f): globs for f, globs in BUNDLED.items()}},
    include_package_data=False,  # exactly the files above (data folders are not packages)
)
