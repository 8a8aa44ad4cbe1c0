"""Which training checkpoints can be resumed, and what a checkpoint recorded.

A checkpoint folder (``checkpoint-N``) is *complete* when HF Trainer can resume from it exactly:

- ``trainer_state.json`` reads as JSON with a ``global_step`` (HF writes it last, after everything else);
- model weights that ``Trainer._load_from_checkpoint`` accepts (``model.safetensors``, ``pytorch_model.bin``, their
  sharded indexes with every shard present, LoRA adapter weights, or FSDP model state), each file whole;
- unless the run saves the model only: the optimizer and scheduler state (``optimizer.pt``/``.bin`` or FSDP optimizer
  state, and ``scheduler.pt``). HF resumes silently without them, with fresh optimizer moments and schedule, so a
  checkpoint that lacks them is not complete. A DeepSpeed checkpoint keeps both in its ``global_step*`` folder.

"Whole" is checked cheaply: a safetensors file's header must parse and its size match the tensors it lists; a
``torch.save`` file must end in a zip directory. A save cut off by a crash fails one of these.

The KL controller's β is saved beside each checkpoint (``t2s_kl_controller.json``) and read back by ``restored_beta``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import struct
import zipfile
from pathlib import Path

log = logging.getLogger(__name__)

TRAINER_STATE = "trainer_state.json"
SCHEDULER = "scheduler.pt"
SAFE_WEIGHTS, SAFE_INDEX = "model.safetensors", "model.safetensors.index.json"
BIN_WEIGHTS, BIN_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
OPTIMIZER_FILES = ("optimizer.pt", "optimizer.bin")
FSDP_MODEL = "pytorch_model_fsdp"
CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")  # transformers.trainer_utils' own pattern


def _weights_file_problem(path: Path) -> str | None:
    """Why a weights or state file is not whole, or None."""
    try:
        size = path.stat().st_size
        if size == 0:
            return f"{path.name} is empty"
        if path.suffix == ".safetensors":
            with open(path, "rb") as f:
                (header_len,) = struct.unpack("<Q", f.read(8))
                if 8 + header_len > size:
                    return f"{path.name} is cut off: its header runs past the end"
                header = json.loads(f.read(header_len))
            end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
            if size != 8 + header_len + end:
                return f"{path.name} is cut off: {size} bytes where its tensors need {8 + header_len + end}"
        elif path.suffix in (".pt", ".bin", ".pth"):
            return _torch_file_problem(path)
    except (OSError, ValueError, KeyError, TypeError, IndexError, struct.error, zipfile.BadZipFile) as exc:
        return f"{path.name} is unreadable: {type(exc).__name__}"
    return None


def _torch_file_problem(path: Path) -> str | None:
    """Why ``path`` is no ``torch.save`` file, read from its first bytes and its zip directory only: a zip archive
    holding a ``data.pkl``, or the legacy format, a pickle (its first byte 0x80)."""
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            if not any(name.rsplit("/", 1)[-1] == "data.pkl" for name in archive.namelist()):
                return f"{path.name} is not a torch file: a zip archive without data.pkl"
        return None
    with open(path, "rb") as f:
        head = f.read(2)
    if head == b"PK":  # a torch.save zip whose end (the central directory) is missing
        return f"{path.name} is cut off"
    if head[:1] != b"\x80":
        return f"{path.name} is not a torch file"
    return None


def _index_problem(folder: Path, index: str) -> str | None:
    try:
        shards = set(json.loads((folder / index).read_text())["weight_map"].values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"{index} is unreadable: {type(exc).__name__}"
    for shard in sorted(shards):
        if not (folder / shard).is_file():
            return f"{index} lists {shard}, which is missing"
        problem = _weights_file_problem(folder / shard)
        if problem:
            return problem
    return None


def _weights_problem(folder: Path, subdirs: list[Path]) -> str | None:
    if any(FSDP_MODEL in d.name for d in subdirs) or (folder / f"{FSDP_MODEL}.bin").is_file():
        return None
    for index in (SAFE_INDEX, BIN_INDEX):
        if (folder / index).is_file():
            return _index_problem(folder, index)
    candidates = [folder / name for name in (SAFE_WEIGHTS, BIN_WEIGHTS, *ADAPTER_WEIGHTS)]
    candidates += [d / name for d in subdirs for name in ADAPTER_WEIGHTS]  # several adapters: one folder each
    present = [path for path in candidates if path.is_file()]
    if not present:
        return "no model weights: model.safetensors is missing"
    for path in present:
        problem = _weights_file_problem(path)
        if problem:
            return problem
    return None


def _optimizer_problem(folder: Path, subdirs: list[Path]) -> str | None:
    if any(d.name.startswith("global_step") and any(d.iterdir()) for d in subdirs):  # DeepSpeed's own state
        return None
    files = [folder / name for name in OPTIMIZER_FILES if (folder / name).is_file()]
    if not files and not any("optimizer" in d.name for d in subdirs):
        return "no optimizer state: optimizer.pt is missing"
    if not (folder / SCHEDULER).is_file():
        return f"no scheduler state: {SCHEDULER} is missing"
    states = sorted(folder.glob("rng_state*.pth")) + [p for p in (folder / "scaler.pt",) if p.is_file()]
    for path in [*files, folder / SCHEDULER, *states]:  # HF Trainer loads each of them with no check of its own
        problem = _weights_file_problem(path)
        if problem:
            return problem
    return None


def model_folder_problem(folder: str | os.PathLike) -> str | None:
    """Why a local model folder cannot be loaded, found before any library reads it (a hub id or a path that is not a
    folder: None, left to the loader): ``config.json`` (or a LoRA adapter's ``adapter_config.json``) that is not a
    JSON object, weights that are missing or not whole (as for a checkpoint)."""
    folder = Path(folder)
    if folder.is_file():
        return "it is a file, not a model folder"
    if not folder.is_dir():
        return None
    configs = [folder / name for name in ("config.json", "adapter_config.json") if (folder / name).is_file()]
    if not configs:
        return "it holds neither config.json nor adapter_config.json"
    from t2s.data.rows import DataError, read_json_object

    for path in configs:
        try:
            read_json_object(path)
        except DataError as exc:
            return str(exc)
    return _weights_problem(folder, [d for d in folder.iterdir() if d.is_dir()])


def check_model_folder(model_path) -> None:
    """A ConfigError naming a local model folder that cannot be loaded (:func:`model_folder_problem`): ``train`` and
    ``sft`` check it before the data or the model loads."""
    from t2s.errors import ConfigError

    problem = model_folder_problem(model_path)
    if problem:
        raise ConfigError(f"Error: cannot load the model {model_path}: {problem}")
    config_path = os.path.join(model_path, "config.json")
    if os.path.isfile(config_path) and "auto_map" not in _json_keys(config_path):  # a field of the wrong kind,
        # found by the config class (a model with custom code is left to the loader: its config runs that code)
        from transformers import AutoConfig

        from t2s.errors import first_line

        try:
            AutoConfig.from_pretrained(model_path)
        except Exception as exc:  # noqa: BLE001 - huggingface_hub's StrictDataclassError is no ValueError
            raise ConfigError(f"Error: cannot load the model {model_path}: {first_line(exc)}") from None


def _json_keys(path) -> set[str]:
    """The top-level keys of a JSON object file (none when it is not one: model_folder_problem said so already)."""
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return set()
    return set(value) if isinstance(value, dict) else set()


@contextlib.contextmanager
def loading_model(model_path):
    """Around loading the weights: what torch and transformers raise on a folder whose ``config.json`` does not fit
    its weights (a RuntimeError: a ``vocab_size`` that is negative, or not the embedding's rows) becomes a ConfigError
    naming the folder. Any other error (out of memory, a missing implementation, a bug) goes on as it is."""
    from t2s.errors import ConfigError, first_line

    try:
        yield
    except RuntimeError as exc:
        if not _a_config_at_odds(exc):
            raise
        raise ConfigError(f"Error: cannot load the model {model_path}: {first_line(exc)}") from None


def _a_config_at_odds(exc: RuntimeError) -> bool:
    text = str(exc)
    return type(exc) is RuntimeError and ("size mismatch" in text or "ignore_mismatched_sizes" in text
                                          or "negative dimension" in text)


def read_trainer_state(folder: str | os.PathLike) -> dict | None:
    """The checkpoint's ``trainer_state.json`` as a dict, or None when absent or unreadable."""
    try:
        state = json.loads(Path(folder, TRAINER_STATE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def checkpoint_problem(folder: str | os.PathLike, *, model_only: bool = False) -> str | None:
    """Why HF Trainer could not resume exactly from ``folder``, or None when it is complete.

    ``model_only``: the run saves no optimizer state (``save_only_model``), so none is required.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return "not a folder"
    state = read_trainer_state(folder)
    if state is None:
        return f"{TRAINER_STATE} is {'unreadable' if (folder / TRAINER_STATE).is_file() else 'missing'}"
    step = state.get("global_step")
    if not isinstance(step, int) or isinstance(step, bool):
        return f"{TRAINER_STATE} has no global_step"
    if step < 0:
        return f"{TRAINER_STATE} has a negative global_step ({step})"
    if not isinstance(state.get("log_history", []), list):  # the trainer appends each step's log to it
        return f"{TRAINER_STATE} has a log_history that is not a list"
    subdirs = [d for d in folder.iterdir() if d.is_dir()]
    problem = _weights_problem(folder, subdirs)
    if problem is None and not model_only:
        problem = _optimizer_problem(folder, subdirs)
    return problem


def checkpoints_newest_first(output_dir: str | os.PathLike) -> list[Path]:
    """``checkpoint-N`` folders of ``output_dir``, highest N first."""
    if not os.path.isdir(output_dir):
        return []
    found = [(int(m.group(1)), Path(output_dir, name)) for name in os.listdir(output_dir)
             if (m := CHECKPOINT_NAME.match(name)) and Path(output_dir, name).is_dir()]
    return [path for _, path in sorted(found, reverse=True)]


def newest_complete_checkpoint(output_dir: str | os.PathLike, *, model_only: bool = False
                               ) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest complete checkpoint in ``output_dir`` (or None), and the newer incomplete ones with their problem."""
    skipped = []
    for folder in checkpoints_newest_first(output_dir):
        problem = checkpoint_problem(folder, model_only=model_only)
        if problem is None:
            return folder, skipped
        skipped.append((folder, problem))
    return None, skipped


def logged_beta(folder: str | os.PathLike) -> tuple[float, int | None] | None:
    """The last β the run logged before this checkpoint (``trainer_state.json`` log history), and its step."""
    state = read_trainer_state(folder)
    history = state.get("log_history") if state else None
    for entry in reversed(history if isinstance(history, list) else []):
        value = entry.get("beta") if isinstance(entry, dict) else None
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return float(value), entry.get("step")
    return None


KL_STATE_FILE = "t2s_kl_controller.json"


def restored_beta(checkpoint: str, initial: float) -> float:
    """β to resume with: the checkpoint's controller state, else the last β its log history holds (a warning),
    else ``initial`` (a warning)."""
    path = os.path.join(checkpoint, KL_STATE_FILE)
    try:
        with open(path) as f:
            beta = float(json.load(f)["beta"])
        if math.isfinite(beta) and beta > 0:
            log.info("KL controller: beta %.6g restored from %s", beta, path)
            return beta
        problem = f"holds beta {beta}"
    except FileNotFoundError:
        problem = "is missing"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        problem = f"is unreadable ({type(exc).__name__})"
    logged = logged_beta(checkpoint)
    if logged is not None:
        beta, step = logged
        log.warning("KL controller: %s %s; resuming with beta %.6g, the last logged (step %s) in its "
                    "trainer_state.json", path, problem, beta, step)
        return beta
    log.warning("KL controller: %s %s and trainer_state.json logs no beta; beta restarts at its initial %.6g",
                path, problem, initial)
    return initial


def weights_fingerprint(folder) -> str | None:
    """The sha256 of a model folder's weight files (``*.safetensors``, else ``*.bin``; names and contents, in name
    order): which weights an eval ran, and whether an export is of them. None for a folder without weight files (a
    hub id, an endpoint)."""
    import hashlib

    from t2s.env.databases import file_checksum

    folder = Path(folder)
    if not folder.is_dir():
        return None
    files = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("*.bin"))
    if not files:
        return None
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{path.name}\0{file_checksum(path)}\n".encode())
    return digest.hexdigest()


def fresh_run_problem(output_dir: str | os.PathLike, *, model_only: bool = False) -> str | None:
    """Why a fresh run (no ``resume_from_checkpoint``) cannot start in ``output_dir``, or None: the folder holds what
    an earlier run left, its ``checkpoint-N`` folders or its ``train_summary.json`` (beside its final model). A fresh
    run would write over those checkpoints, and a ``save_total_limit`` would delete the earlier run's."""
    held = [path.name for path in checkpoints_newest_first(output_dir)]
    held += ["train_summary.json"] * os.path.isfile(os.path.join(output_dir, "train_summary.json"))
    if not held:
        return None
    resumable = newest_complete_checkpoint(output_dir, model_only=model_only)[0] is not None
    return (f"Error: {output_dir} already holds a training run ({', '.join(held[:3])}): "
            + "continue it with --resume_from_checkpoint latest, or " * resumable
            + "start afresh in another --output_dir (or remove this one).")
