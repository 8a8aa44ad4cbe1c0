"""Exporting (``t2s export``): a model folder that vLLM loads directly, from a trained checkpoint.

What the folder holds:
- the weights, with LoRA adapters merged (peft), under the base checkpoint's architecture and weight names. Training
  loads Qwen3.5 as the text-only ``Qwen3_5ForCausalLM``; when the base checkpoint is the multimodal
  ``Qwen3_5ForConditionalGeneration``, the trained language-model tensors are renamed to the base's names and every
  tensor training never saw (the vision tower, the MTP head) is copied unchanged from the base's safetensors, so
  vLLM serves the same architecture the base shipped with. A checkpoint with no composite base keeps its own
  architecture (the tiny test model does);
- ``generation_config.json`` stopping on the chat template's stop tokens (``t2s.env.chat_format``; for Qwen3.5
  ``<|im_end|>`` and ``<|endoftext|>``), and
  sampling as ``eval`` samples by default (T 0.6, top-p 0.95, top-k 20), so a plain client samples as the figures were;
- the tokenizer and chat template;
- the weights written by ``huggingface_hub.save_torch_state_dict``: one ``model.safetensors``, or shards of at most
  ``--max-shard-size`` plus ``model.safetensors.index.json``;
- ``t2s_export.json``: the fingerprint of the checkpoint's weights, so that an eval of this folder counts as an eval
  of that checkpoint when it is exported again (``--force --eval``), and of no other;
- ``system_prompt.txt``: the system prompt the model was trained with (the recipe's ``system_prompt_file``, else
  t2s's own prompt for the recipe's tool set and call format; an SFT recipe's come from its ``rl_recipe``; without
  ``--recipe``, the default exec_plan prompt, and the export says so);
- a model card (``README.md``, ``t2s.export.model_card``) whose metadata names the ``base_model`` (a hub id)
  and, given an eval folder of these weights (its recorded ``weights_sha256`` is the checkpoint's, or that of an
  earlier export into the same folder), a ``model-index`` of its scores; its body holds a usage snippet that runs as
  written
  (``eval`` and ``ask`` pass ``system_prompt.txt`` and the recipe's tool set and call format), the recipe and the
  eval summary table. It names no local paths.

The export is verified by reloading it with transformers and generating a few tokens from a chat prompt.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from t2s.backends.base import SamplingSettings
from t2s.errors import ExportError
from t2s.export.model_card import (SYSTEM_PROMPT_FILE, check_eval_of, model_card, override_values, recorded_overrides,
                                   trained_prompt)
from t2s.settings import match_umask




WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


MAX_SHARD_SIZE = "5GB"
EXPORT_SOURCE = "t2s_export.json"  # which checkpoint's weights the folder's were exported from (its fingerprint)




# Files of the base checkpoint that describe its (multimodal) architecture and are kept as they are.
_BASE_CONFIG_FILES = ("config.json", "preprocessor_config.json", "video_preprocessor_config.json")


# ----------------------------------------------------------------------------------------------------------- inputs
def resolve_model_dir(name_or_path: str) -> Path:
    """A local folder for a path or hub id (the hub cache is used; offline runs need it cached)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path.resolve()
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name_or_path))
    except Exception as exc:  # noqa: BLE001 - any hub failure is one user-facing line
        raise ExportError(f"cannot find model {name_or_path!r} locally or in the hub cache ({exc})") from exc


def _read_json(path: Path) -> dict:
    """The JSON object a file holds ({} when it is absent); an ExportError naming it for any other content."""
    if not path.is_file():
        return {}
    from t2s.data.rows import DataError, read_json_object

    try:
        return read_json_object(path)
    except DataError as exc:
        raise ExportError(f"{path.parent}: {exc}") from None


def is_adapter(folder: Path) -> bool:
    return (folder / "adapter_config.json").is_file()


def base_name(checkpoint: Path, base: str | None) -> str | None:
    """The base as given: ``--base``, else the base path or hub id a LoRA adapter recorded."""
    if base or not is_adapter(checkpoint):
        return base
    recorded = _read_json(checkpoint / "adapter_config.json").get("base_model_name_or_path") or None
    if recorded is not None and not isinstance(recorded, str):
        raise ExportError(f"{checkpoint}/adapter_config.json records a base model that is not a name: {recorded!r}"
                          "; pass --base")
    return recorded


def export_base_dir(checkpoint: Path, base: str | None) -> Path | None:
    """The base model's folder: ``--base``, else the one a LoRA adapter records (None for full weights without
    ``--base``)."""
    if not is_adapter(checkpoint):
        return resolve_model_dir(base) if base else None
    base_name_ = base_name(checkpoint, base)
    if not base_name_:
        raise ExportError(f"{checkpoint} is a LoRA adapter with no base model recorded; pass --base")
    return resolve_model_dir(base_name_)


def load_merged_model(checkpoint: Path, base: str | None):
    """The trained model with any LoRA adapter merged, in float32 for an exact merge; plus the base folder used."""
    import torch
    from transformers import AutoModelForCausalLM

    base_dir = export_base_dir(checkpoint, base)
    if not is_adapter(checkpoint):
        model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
        return model, base_dir
    from peft import PeftModel

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(model, checkpoint).merge_and_unload()
    return model, base_dir


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def load_tokenizer(checkpoint: Path, base_dir: Path | None):
    from transformers import AutoTokenizer

    for folder in (checkpoint, base_dir):
        if folder is not None and any((folder / name).is_file() for name in TOKENIZER_FILES):
            return AutoTokenizer.from_pretrained(folder)
    raise ExportError(f"no tokenizer in {checkpoint}" + (f" or {base_dir}" if base_dir else ""))


def stop_token_ids(tokenizer) -> list[int]:
    """The chat template's stop ids, its end of turn first (``chat_format``)."""
    from t2s.env.chat_format import ChatFormatError, chat_format

    try:
        return [int(i) for i in chat_format(tokenizer).stop_ids]
    except ChatFormatError as exc:
        raise ExportError(str(exc).removeprefix("Error: ")) from None


# ---------------------------------------------------------------------------------------------------------- weights
def read_safetensors(folder: Path) -> dict:
    """Every tensor of a folder's safetensors files, by name."""
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ExportError(f"{folder} has no .safetensors weights")
    tensors = {}
    for file in files:
        tensors.update(load_file(str(file)))
    return tensors


def text_relative_name(name: str) -> str:
    """A language-model weight name with its container prefix removed (``model.language_model.`` or ``model.``)."""
    for prefix in ("model.language_model.", "model."):
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def map_to_base_names(trained: dict, base_names: list[str]) -> dict[str, str]:
    """trained name -> base name. Names match exactly, or after removing the language-model container prefix."""
    by_relative: dict[str, str] = {}
    for name in base_names:
        if name.startswith("model.visual.") or name.startswith("mtp."):
            continue
        by_relative.setdefault(text_relative_name(name), name)
    mapping, unknown = {}, []
    base_set = set(base_names)
    for name in trained:
        if name in base_set:
            mapping[name] = name
        elif text_relative_name(name) in by_relative:
            mapping[name] = by_relative[text_relative_name(name)]
        else:
            unknown.append(name)
    if unknown:
        raise ExportError(
            f"{len(unknown)} trained weights have no counterpart in the base checkpoint (e.g. {unknown[:3]}); "
            "is --base the model this checkpoint was trained from?"
        )
    return mapping


def compose_with_base(trained: dict, base_dir: Path) -> tuple[dict, dict]:
    """Tensors under the base's names: trained language-model weights plus the base's untouched ones.

    Returns (tensors, report) where report counts replaced and carried-over tensors by top-level prefix.
    """
    base = read_safetensors(base_dir)
    mapping = map_to_base_names(trained, list(base))
    combined = dict(base)
    for name, base_name in mapping.items():
        tensor, reference = trained[name], base[base_name]
        if tuple(tensor.shape) != tuple(reference.shape):
            raise ExportError(
                f"weight {name} has shape {tuple(tensor.shape)} but the base's {base_name} has {tuple(reference.shape)}"
            )
        combined[base_name] = tensor.to(reference.dtype).contiguous()
    replaced = set(mapping.values())
    carried: dict[str, int] = {}
    for name in base:
        if name not in replaced:
            key = ".".join(name.split(".")[:2]) if name.startswith("model.") else name.split(".")[0]
            carried[key] = carried.get(key, 0) + 1
    untouched_text = [n for n in base
                      if n not in replaced and not (n.startswith("model.visual.") or n.startswith("mtp."))]
    tied = [n for n in untouched_text if n == "lm_head.weight"]
    missing = [n for n in untouched_text if n not in tied]
    if missing:
        raise ExportError(
            f"the checkpoint lacks {len(missing)} language-model weights of the base (e.g. {missing[:3]}); "
            "is --base the model this checkpoint was trained from?"
        )
    return combined, {"replaced": len(replaced), "carried_over": carried}


def write_safetensors(tensors: dict, out: Path, max_shard_size: int | str = MAX_SHARD_SIZE) -> list[str]:
    """Write tensors with ``huggingface_hub.save_torch_state_dict``: one ``model.safetensors``, or shards of at most
    ``max_shard_size`` plus ``model.safetensors.index.json``. Returns the weight files written."""
    from huggingface_hub import save_torch_state_dict

    save_torch_state_dict(tensors, out, max_shard_size=max_shard_size)
    match_umask(out)
    return sorted(path.name for path in out.glob("model*.safetensors"))


def _is_composite(base_dir: Path | None) -> bool:
    if base_dir is None:
        return False
    config = _read_json(base_dir / "config.json")
    architectures = config.get("architectures", [])
    return "text_config" in config and any(a.endswith("ForConditionalGeneration") for a in architectures)


# ---------------------------------------------------------------------------------------------------------- export
def export_model(checkpoint, output, *, base=None, eval_dir=None, recipe=None, verify=True, force=False,
                 repo_id=None, max_shard_size=MAX_SHARD_SIZE, chat_template=None) -> Path:
    """Write the export folder; returns its path. ``chat_template``: a Jinja file the exported tokenizer carries
    instead of its own (a base model has none)."""
    checkpoint = Path(checkpoint).expanduser().resolve()
    out = Path(output).expanduser().resolve()
    if not checkpoint.is_dir():
        raise ExportError(f"checkpoint folder not found: {checkpoint}")
    if not any((checkpoint / name).is_file() for name in ("config.json", "adapter_config.json")):
        raise ExportError(f"{checkpoint} holds no model: neither config.json nor adapter_config.json (is the "
                          "checkpoint complete?)")
    from t2s.training.checkpoints import model_folder_problem  # before any library reads the folder

    problem = model_folder_problem(checkpoint)
    if problem:
        raise ExportError(f"cannot load the model {checkpoint}: {problem}")
    if out.exists() and any(out.iterdir()) and not force:
        raise ExportError(f"output folder {out} is not empty (pass --force to write into it)")
    if recipe:  # found as train and sft find it: as given, else a shipped recipe path
        from t2s.training.pipeline import resolve_path

        found = resolve_path(recipe)
        if found is None or not found.is_file():
            raise ExportError(f"recipe file not found: {recipe}")
        recipe = str(found)
    system_prompt, tool_flags = trained_prompt(recipe, override_values(recorded_overrides(checkpoint) or []))
    if not recipe:
        print("note: no --recipe given: system_prompt.txt holds t2s's default exec_plan prompt; pass the recipe the "
              "model was trained with if it used another prompt, tool set or call format")
    from t2s.training.checkpoints import weights_fingerprint

    source = weights_fingerprint(checkpoint)
    if eval_dir:  # fails early: no summary, or an eval of other weights (this checkpoint, or an earlier export of it)
        earlier = weights_fingerprint(out) if exported_from(out) == source else None
        check_eval_of(eval_dir, {checkpoint: source, out: earlier})
    from t2s.env.chat_format import apply_chat_template_file, chat_format
    from t2s.errors import FileError, first_line

    try:  # the tokenizer and its chat format first: a model without a usable template is refused unloaded
        tokenizer = load_tokenizer(checkpoint, export_base_dir(checkpoint, base))
    except ExportError:
        raise
    except Exception as exc:  # noqa: BLE001 - a tokenizer (or the config it reads) the library refuses
        raise ExportError(f"cannot load the model {checkpoint}: {first_line(exc)}") from None
    try:
        apply_chat_template_file(tokenizer, chat_template)
    except FileError as exc:
        raise ExportError(str(exc).removeprefix("Error: ")) from None
    stop_ids = stop_token_ids(tokenizer)
    fmt = chat_format(tokenizer)
    try:
        model, base_dir = load_merged_model(checkpoint, base)
    except ExportError:
        raise
    except Exception as exc:  # noqa: BLE001 - a folder the libraries refuse (a config at odds with its weights)
        raise ExportError(f"cannot load the model {checkpoint}: {first_line(exc)}") from None
    out.mkdir(parents=True, exist_ok=True)  # once the model has loaded: a failed export leaves no folder
    composite = _is_composite(base_dir)

    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)  # the canonical on-disk names of the trained (merged) model
        trained = read_safetensors(Path(tmp))
        if composite:
            tensors, report = compose_with_base(trained, base_dir)
            for name in _BASE_CONFIG_FILES:
                if (base_dir / name).is_file():
                    shutil.copy2(base_dir / name, out / name)
            architecture = _read_json(base_dir / "config.json").get("architectures", ["?"])[0]
        else:
            dtype = getattr(model.config, "dtype", None) or getattr(model.config, "torch_dtype", None)
            source_config = _read_json((base_dir or checkpoint) / "config.json")
            stated = [source_config.get(key) for key in ("dtype", "torch_dtype")]
            target = next((value for value in stated if isinstance(value, str) and value), None) or str(dtype
                                                                                                      or "float32")
            tensors = {k: v.to(_torch_dtype(target)) for k, v in trained.items()}
            report = {"replaced": len(tensors), "carried_over": {}}
            config = json.loads((Path(tmp) / "config.json").read_text())
            config["dtype"] = target
            (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
            architecture = config.get("architectures", ["?"])[0]
    for stale in list(out.glob("*.safetensors")) + list(out.glob("*.safetensors.index.json")):
        stale.unlink()
    write_safetensors(tensors, out, max_shard_size)
    (out / EXPORT_SOURCE).write_text(json.dumps({"checkpoint_weights_sha256": source}) + "\n")
    del tensors, trained

    write_generation_config(out, checkpoint, base_dir, tokenizer, stop_ids)
    tokenizer.save_pretrained(out)
    for folder in (checkpoint, base_dir):
        if folder is not None and (folder / "chat_template.jinja").is_file():
            if not (out / "chat_template.jinja").is_file():
                shutil.copy2(folder / "chat_template.jinja", out / "chat_template.jinja")
            break
    card = model_card(repo_id=repo_id or out.name, checkpoint=checkpoint, base=base_name(checkpoint, base),
                      architecture=architecture, stop_ids=stop_ids, recipe=recipe, eval_dir=eval_dir,
                      adapter=is_adapter(checkpoint), tool_flags=tool_flags, stop_tokens=fmt.stop_tokens,
                      thinking=fmt.thinking)
    card.save(out / "README.md")
    (out / SYSTEM_PROMPT_FILE).write_text(system_prompt + "\n", encoding="utf-8")
    print(f"weights: {report['replaced']} trained tensors" + (
        ", carried over from the base: " + ", ".join(f"{k} ({n})" for k, n in sorted(report["carried_over"].items()))
        if report["carried_over"] else ""))
    if verify:
        verify_export(out, model, stop_ids)
    return out


def exported_from(folder: Path) -> str | None:
    """The weights fingerprint of the checkpoint an earlier export into ``folder`` was made from (None if none)."""
    try:
        return json.loads((folder / EXPORT_SOURCE).read_text(encoding="utf-8")).get("checkpoint_weights_sha256")
    except (OSError, ValueError, AttributeError):
        return None


def _torch_dtype(name: str):
    import torch

    name = str(name).replace("torch.", "")
    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}.get(name, torch.float32)


def write_generation_config(out: Path, checkpoint: Path, base_dir: Path | None, tokenizer, stop_ids: list[int]) -> None:
    config = {}
    for folder in (checkpoint, base_dir):
        if folder is not None and (folder / "generation_config.json").is_file():
            config = _read_json(folder / "generation_config.json")
            break
    config["eos_token_id"] = stop_ids
    if tokenizer.pad_token_id is not None:
        config["pad_token_id"] = int(tokenizer.pad_token_id)
    evaluated = SamplingSettings.evaluation()  # what the card's figures were sampled with (eval's defaults)
    config.update(do_sample=True, temperature=evaluated.temperature, top_p=evaluated.top_p, top_k=evaluated.top_k)
    (out / "generation_config.json").write_text(json.dumps(config, indent=2) + "\n")


def verify_export(out: Path, trained_model, stop_ids: list[int]) -> None:
    """Reload the folder with transformers, check the trained weights came back, and generate a few tokens."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(out)
    expected = trained_model.state_dict()
    got = reloaded.state_dict()
    for name, tensor in expected.items():
        if name not in got:
            raise ExportError(f"verification failed: {name} missing after reload")
        if not torch.allclose(got[name].float(), tensor.float().to(got[name].dtype).float(), atol=1e-2, rtol=1e-2):
            raise ExportError(f"verification failed: {name} differs after reload")
    if sorted(reloaded.generation_config.eos_token_id or []) != sorted(stop_ids):
        raise ExportError("verification failed: generation_config does not stop on the chat template's stop tokens")
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "List the tables."}], add_generation_prompt=True, tokenize=False,
        enable_thinking=True,
    )
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        generated = reloaded.generate(**ids, max_new_tokens=8, do_sample=False)
    new_tokens = generated.shape[1] - ids["input_ids"].shape[1]
    if new_tokens < 1:
        raise ExportError("verification failed: the reloaded model generated nothing")
    print(f"verified: reloaded with transformers and generated {new_tokens} tokens")
