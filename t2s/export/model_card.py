"""The model card of an export (``t2s export``): a ``huggingface_hub.ModelCard`` whose metadata names the
``base_model`` (a hub id) and, given an eval folder, a ``model-index`` of its scores; its body holds a usage snippet
that runs as written, the recipe and the eval summary table, and names no local paths.

The snippet serves the model with vLLM, fetches ``system_prompt.txt`` (the system prompt the model was trained with,
``trained_prompt``, which the export writes beside the card) and runs ``t2s eval`` and ``t2s ask`` with it, in the
tool set and call format the recipe trained.
"""

from __future__ import annotations

import json
from pathlib import Path

from t2s.errors import ExportError

SYSTEM_PROMPT_FILE = "system_prompt.txt"
EVAL_METRICS = (("execution_accuracy_official", "official EX"), ("strict", "strict EX"), ("soft_f1", "Soft-F1"))


def hub_id(name_or_path: str | None) -> str | None:
    """The hub repo id of a base given as one, or as a snapshot folder of the hub cache; None for another folder."""
    if not name_or_path:
        return None
    path = Path(name_or_path).expanduser()
    if not path.is_dir():
        return name_or_path  # resolve_model_dir found it in the hub cache under this id
    snapshots = path.resolve().parent
    if snapshots.name == "snapshots" and snapshots.parent.name.startswith("models--"):
        return snapshots.parent.name[len("models--") :].replace("--", "/")
    return None


EPISODE_PROMPT_KEYS = ("dialect", "tool_format", "system_prompt_file")


def _recipe_keys(path) -> dict:
    import yaml

    keys = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    return keys if isinstance(keys, dict) else {}


def trained_prompt(recipe: str | None, overrides: dict[str, str] | None = None) -> tuple[str, list[str]]:
    """(the system prompt a recipe trains with, the ``eval``/``ask`` flags of its tool set and call format when they
    are not the defaults). The recipe's keys are read from its YAML as ``train`` reads them (an SFT recipe's through
    its ``rl_recipe``, as ``sft`` reads them), then the run's ``overrides`` of them; the prompt file is found as
    ``train`` finds it."""
    from t2s.env.protocol import default_system_prompt
    from t2s.evaluation.config import read_system_prompt
    from t2s.training.pipeline import resolve_path

    keys = _recipe_keys(recipe) if recipe else {}
    if keys.get("rl_recipe"):  # an SFT recipe: its episodes are the GRPO recipe's, unless it sets them itself
        path = resolve_path(keys["rl_recipe"])
        if path is None:
            raise ExportError(f"the recipe's rl_recipe {keys['rl_recipe']!r} not found")
        keys = {**_recipe_keys(path), **{k: v for k, v in keys.items() if k in EPISODE_PROMPT_KEYS}}
    keys.update({k: v for k, v in (overrides or {}).items() if k in EPISODE_PROMPT_KEYS})  # the run's own flags
    dialect, tool_format = keys.get("dialect") or "exec_plan", keys.get("tool_format") or "json"
    flags = (["--dialect", dialect] if dialect != "exec_plan" else []) + (
        ["--tool-format", tool_format] if tool_format != "json" else [])
    if not keys.get("system_prompt_file"):
        return default_system_prompt(dialect, tool_format), flags
    path = resolve_path(keys["system_prompt_file"])
    if path is None:
        raise ExportError(f"the recipe's system_prompt_file {keys['system_prompt_file']!r} not found")
    return read_system_prompt(path), flags


def model_card(*, repo_id: str, checkpoint: Path, base: str | None, architecture: str, stop_ids: list[int],
               recipe: str | None, eval_dir: str | None, adapter: bool, tool_flags: list[str] = (),
               stop_tokens: tuple[str, ...] = ("<|im_end|>", "<|endoftext|>"), thinking: bool = True):
    """The export's ``huggingface_hub.ModelCard``: ``base_model`` and ``model-index`` metadata, then the text."""
    from huggingface_hub import ModelCard, ModelCardData

    base_id = hub_id(base)
    data = ModelCardData(
        library_name="transformers", pipeline_tag="text-generation", tags=["text-to-sql", "agentic", "grpo", "t2s"],
        base_model=base_id, model_name=repo_id, eval_results=eval_results(eval_dir) if eval_dir else None,
    )
    base_line = f"`{base_id}`" if base_id else (f"a local folder, `{Path(base).name}`" if base else "not given")
    lines = [
        f"# {repo_id}",
        "",
        "An agentic text-to-SQL model trained with GRPO on the t2s exec_plan protocol: it explores a SQLite database "
        "through tools (`list_tables`, `describe_table`, `run_query`, ...) and submits a final query with "
        "`submit_sql`.",
        "",
        f"- architecture: `{architecture}`",
        f"- base model: {base_line}",
        f"- trained checkpoint: `{checkpoint.name}`" + (" (LoRA adapter, merged)" if adapter else ""),
        f"- generation stops on {' and '.join(f'`{t}`' for t in stop_tokens)} (ids {stop_ids})",
        ("- prompts must be rendered with `enable_thinking=True` (the generation prompt ends in `<think>\\n`)"
         if thinking else "- the chat template opens no think block: turns are read without thinking"),
        "",
        "## Use",
        "",
        "Serve it with vLLM (by its hub id, or from the folder above this one), then evaluate it on BIRD-style data or "
        f"ask any SQLite file with t2s. `{SYSTEM_PROMPT_FILE}` (in this repository) is the system prompt the model was "
        "trained with: the commands pass it, as they pass the tool set and call format it was trained in.",
        "",
        "```bash",
        *usage_commands(repo_id, tool_flags),
        "```",
    ]
    if recipe:
        recipe_path = Path(recipe)
        if not recipe_path.is_file():
            raise ExportError(f"recipe file not found: {recipe}")
        lines += ["", f"## Recipe (`{recipe_path.name}`)", "", "```yaml", recipe_path.read_text().rstrip(), "```"]
        lines += run_overrides_lines(recorded_overrides(checkpoint))
    if eval_dir:
        lines += ["", "## Evaluation", "", eval_markdown(eval_dir).rstrip()]
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines) + "\n")


def recorded_overrides(checkpoint: Path) -> list[str] | None:
    """The ``train`` flags the run used on top of its recipe (``train_summary.json``'s ``overrides``, in the checkpoint
    folder or, for a ``checkpoint-N``, the run folder above it); None when nothing recorded them."""
    for folder in (checkpoint, checkpoint.parent):
        path = folder / "train_summary.json"
        if path.is_file():
            try:
                summary = json.loads(path.read_text(encoding="utf-8"))
            except ValueError:
                return None
            overrides = summary.get("overrides") if isinstance(summary, dict) else None
            return [str(flag) for flag in overrides] if isinstance(overrides, list) else None
    return None


def override_values(flags: list[str]) -> dict[str, str]:
    """``{recipe key: value}`` of override flags (``--key value``, ``--key=value``, hyphens or underscores)."""
    values: dict[str, str] = {}
    for index, flag in enumerate(flags):
        if not flag.startswith("--"):
            continue
        name, has_value, value = flag[2:].partition("=")
        if not has_value:
            following = flags[index + 1] if index + 1 < len(flags) else ""
            value = "" if following.startswith("--") else following
        values[name.replace("-", "_")] = value
    return values


def _shown(flag: str) -> str:
    """A flag or value as a card shows it: a path by its last part (``--key=/a/b`` as ``--key=b``)."""
    name, has_value, value = flag.partition("=") if flag.startswith("--") else ("", False, flag)
    if value and (Path(value).is_absolute() or value.startswith(".") or Path(value).exists()):  # not a hub id
        value = Path(value).name
    return f"{name}={value}" if has_value else (value if not flag.startswith("--") else flag)


def run_overrides_lines(overrides: list[str] | None) -> list[str]:
    """The card's lines on what the run changed from its recipe (paths shown by their last part)."""
    if overrides is None:
        return ["", "The run's overrides of this recipe were not recorded (no `train_summary.json` beside the "
                "checkpoint)."]
    text = " ".join(map(_shown, overrides)) if overrides else "none"
    return ["", f"The run's overrides of this recipe (`train` flags): `{text}`."]


def usage_commands(repo_id: str, tool_flags=()) -> list[str]:
    """The card's shell commands: serve the model with vLLM, fetch its system prompt, then ``t2s eval`` and
    ``t2s ask`` against the server with that prompt and the model's tool set and call format (``tool_flags``)."""
    import shlex

    repo = shlex.quote(repo_id)
    prompt = " ".join(["--system-prompt-file", SYSTEM_PROMPT_FILE, *map(shlex.quote, tool_flags)])
    return [
        f"vllm serve {repo} --enable-prefix-caching",
        f"hf download {repo} {SYSTEM_PROMPT_FILE} --local-dir .",
        f"python -m t2s eval --policy endpoint --endpoint http://localhost:8000 --data bird/dev.json {prompt} "
        "--output runs/eval-endpoint",
        f"python -m t2s ask --db my.sqlite --endpoint http://localhost:8000 {prompt} "
        "\"How many orders shipped in 2023?\"",
    ]


def eval_results(eval_dir) -> list:
    """The ``model-index`` entries of an eval folder: official EX, strict EX and Soft-F1 for each mode."""
    from huggingface_hub import EvalResult

    results = []
    for mode, summary in eval_summaries(eval_dir).items():
        config = summary.get("config") or {}
        mode = mode or config.get("mode") or "full"
        data_file = Path(config.get("data_file") or "data/dev.json")
        for key, name in EVAL_METRICS:
            if isinstance(summary.get(key), (int, float)):
                results.append(EvalResult(
                    task_type="text-generation", task_name=f"agentic text-to-SQL ({mode} schema, n={summary.get('n')})",
                    dataset_type=data_file.parent.name, dataset_name=f"{data_file.parent.name}/{data_file.name}",
                    dataset_split=data_file.stem, metric_type=key, metric_name=name, metric_value=float(summary[key]),
                ))  # fmt: skip
    return results


def eval_summaries(eval_dir) -> dict[str, dict]:
    """{mode: summary} of an `eval` output folder (its summary.json)."""
    from t2s.evaluation.run_folders import RunFolderError, read_summaries

    try:
        return read_summaries(eval_dir)
    except RunFolderError as exc:
        raise ExportError(str(exc).removeprefix("Error: ")) from None


def check_eval_of(eval_dir, weights: dict[str, str | None]) -> None:
    """ExportError unless every mode of the eval in ``eval_dir`` ran one of ``weights`` ({folder: fingerprint}, the
    checkpoint exported and an earlier export of it): the card's ``model-index`` must be this model's figures."""
    for mode, summary in eval_summaries(eval_dir).items():
        config = summary.get("config") or {}
        ran = config.get("weights_sha256")
        if ran is None:
            raise ExportError(f"the eval in {eval_dir} ({mode}) recorded no model weights (policy "
                              f"{config.get('policy')!r}, or an eval older than weight fingerprints), so its figures "
                              "cannot be shown to be this checkpoint's; evaluate the checkpoint with --policy model "
                              "or vllm, or export without --eval")
        if ran not in {fingerprint for fingerprint in weights.values() if fingerprint}:
            raise ExportError(f"the eval in {eval_dir} ({mode}) ran other weights than {', '.join(map(str, weights))}; "
                              "its figures are not this model's: evaluate this checkpoint, or export without --eval")


def eval_markdown(eval_dir) -> str:
    from t2s.evaluation.report import modes_markdown

    return modes_markdown(eval_summaries(eval_dir), public=True)  # a card names no local path
