"""The layout of the folders runs write, and reading them back (for ``compare``, ``show``, ``export`` and the report).

An ``eval --output DIR`` folder has one layout, whatever modes ran::

    DIR/<mode>/eval_config.json   the mode's configuration (a resumed run must match it)
    DIR/<mode>/episodes.jsonl     one scored episode per question and sample (``t2s.evaluation.records``)
    DIR/<mode>/scores.jsonl       the scoring keys of each episode
    DIR/summary.json              {"modes": {mode: summary}}
    DIR/summary.md  DIR/summary.png  DIR/report.html

A ``score --output DIR`` folder holds ``scores.jsonl`` at the top. A training run with ``log_completions: true``
writes TRL's ``<output_dir>/completions/completions_<step>.parquet``: one row per episode with its step, the episode
record (``episode``, JSON), each reward function's value, the advantage, and the episode's ``tier``, ``f1``,
``join``, ``consensus``, ``turns`` and ``submitted`` (:func:`read_training_episodes`).
"""

from __future__ import annotations

import json
from pathlib import Path

from t2s.errors import T2SError

EVAL_CONFIG = "eval_config.json"
EPISODES = "episodes.jsonl"
SCORES = "scores.jsonl"
#: with k > 1: each question's vote, one line each (``t2s.scoring.voting.question_votes``)
VOTES = "votes.jsonl"
SUMMARY = "summary.json"


class RunFolderError(T2SError, ValueError):
    """A path that is not a run this command can read; the message is one ``Error:`` line."""


def eval_modes(folder) -> list[str]:
    """The modes of an eval folder: its sub-folders holding ``eval_config.json`` (in summary.json's order)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = sorted(sub.name for sub in folder.iterdir() if (sub / EVAL_CONFIG).is_file())
    summary = folder / SUMMARY
    if summary.is_file():
        try:
            modes = json.loads(summary.read_text(encoding="utf-8")).get("modes")
        except (ValueError, AttributeError, RecursionError):  # not JSON, or not an object: the folders' order
            modes = None
        order = list(modes) if isinstance(modes, dict) else []
        found = [m for m in order if m in found] + [m for m in found if m not in order]
    return found


def check_eval_layout(folder) -> None:
    """Refuse a folder in an older layout, or a ``score`` run's (both write ``summary.json``). Any modes may run
    into a folder of this layout: each mode's folder resumes on its own (its ``eval_config.json`` must match),
    whatever modes ran there before or run next."""
    folder = Path(folder)
    if (folder / EVAL_CONFIG).is_file() or (folder / EPISODES).is_file():
        raise RunFolderError(f"Error: {folder} holds an eval in an older layout (episodes.jsonl at the top); "
                             "choose another --output")
    if (folder / SCORES).is_file():
        raise RunFolderError(f"Error: {folder} holds a score run ({SCORES} at the top), whose summary.json an eval "
                             "would replace; choose another --output")


def check_output_apart(output, data_file: Path, rows: list[dict], inputs: tuple = ()) -> None:
    """A RunFolderError when ``output`` (of ``eval`` or ``score``) is the data file's own folder, or lies in the
    databases' folder of BIRD's layout (``ROOT/<db_id>/<db_id>.sqlite``: its folders would sit among the databases,
    as more of them), or when a file it writes would replace ``inputs`` (the predictions file ``score`` reads)."""
    import os

    from t2s.env.databases import is_dsn

    out = Path(output).expanduser().resolve()
    files = [Path(row["db_path"]).resolve() for row in rows if row.get("db_path") and not is_dsn(row["db_path"])]
    roots = {file.parent.parent for file in files if file.parent.name == file.stem}
    inside = next((root for root in sorted(roots) if out == root or root in out.parents), None)
    if inside is not None or out == Path(data_file).resolve().parent:
        where = f"inside the databases' folder {inside}" if inside else f"the data's own folder {out}"
        raise RunFolderError(f"Error: --output {output} is {where}; write the results to another folder")
    for source in inputs:
        for name in (SCORES, SUMMARY, "problems.json"):
            try:
                same = (out / name).is_file() and os.path.samefile(out / name, source)
            except OSError:
                same = False
            if same:
                raise RunFolderError(f"Error: --output {output} would write {name} over {source}, which this run "
                                     "reads; write the results to another folder")


def check_score_folder(folder) -> None:
    """Refuse an eval's folder, or one of its mode folders, as ``score --output``: the score would replace the eval's
    summary.json or scores.jsonl."""
    folder = Path(folder)
    modes = eval_modes(folder)
    if modes or (folder / EVAL_CONFIG).is_file() or (folder / EPISODES).is_file():
        held = f"an eval (modes {', '.join(modes)})" if modes else "an eval's episodes"
        raise RunFolderError(f"Error: {folder} holds {held}, whose files a score would replace; choose another "
                             "--output")


def earlier_summaries(folder, modes: list[str]) -> dict[str, dict]:
    """{mode: summary} of the modes an eval folder finished before, other than ``modes``: they stay in its summary
    and reports when a run adds or resumes other modes."""
    folder = Path(folder)
    try:
        summaries = read_summaries(folder) if (folder / SUMMARY).is_file() else {}
    except RunFolderError:
        return {}
    return {mode: summary for mode, summary in summaries.items()
            if mode not in modes and isinstance(summary, dict) and (folder / mode / EVAL_CONFIG).is_file()}


def read_summaries(folder) -> dict[str, dict]:
    """{mode: summary} of an eval folder's summary.json."""
    path = Path(folder) / SUMMARY
    if not path.is_file():
        raise RunFolderError(f"Error: no {SUMMARY} in eval folder {folder}")
    try:
        modes = json.loads(path.read_text(encoding="utf-8")).get("modes")
    except (ValueError, AttributeError, RecursionError):
        modes = None
    if not isinstance(modes, dict):
        raise RunFolderError(f"Error: {path} is not an eval summary (no \"modes\")")
    return modes


def mode_folder(path) -> Path:
    """The folder of one run's per-question files: ``path`` itself when it holds them, else the single mode of an eval
    folder (an eval of several modes must be named by its mode folder)."""
    path = Path(path)
    if not path.exists():
        raise RunFolderError(f"Error: run not found: {path}")
    if (path / SCORES).is_file() or (path / EPISODES).is_file():
        return path
    modes = eval_modes(path)
    if len(modes) == 1:
        return path / modes[0]
    if modes:
        raise RunFolderError(f"Error: {path} is an eval of several modes: name one of "
                             + ", ".join(str(path / m) for m in modes))
    raise RunFolderError(f"Error: {path} holds neither {SCORES} nor {EPISODES}, nor eval mode folders")


def _numbered_jsonl(path) -> list[tuple[int, object]]:
    """(line number, value) of a JSONL file (a last line cut off by a killed run is left out: one without its newline
    that is no JSON, since no part of an object is one); RunFolderError otherwise."""
    from t2s.data.rows import DataError, jsonl_values, read_text_file

    path = Path(path)
    try:
        text = read_text_file(path, what="run")
        if text and not text.endswith("\n"):
            try:
                json.loads(text[text.rfind("\n") + 1:])
            except (ValueError, RecursionError):
                text = text[: text.rfind("\n") + 1]  # the last write was cut off
        return list(jsonl_values(text, path))
    except DataError as exc:
        raise RunFolderError(str(exc)) from None


def read_jsonl(path) -> list[dict]:
    """The JSON objects of a JSONL file (a line cut off by a killed run is left out); RunFolderError otherwise."""
    return [value for _, value in _numbered_jsonl(path) if isinstance(value, dict)]


def read_episodes(path) -> list[dict]:
    """The lines of an ``episodes.jsonl`` (or ``scores.jsonl``), as :func:`read_jsonl` reads them; a RunFolderError
    naming the file, the line and the key for a line a reader would fail on (``records.line_problem``)."""
    from t2s.evaluation.records import line_problem

    lines = []
    for number, value in _numbered_jsonl(path):
        if problem := line_problem(value):
            raise RunFolderError(f"Error: {path} line {number}: {problem}")
        lines.append(value)
    return lines


def read_training_episodes(path) -> list[dict]:
    """The episode records a training run logged with its completions (a run folder, its ``completions`` folder or
    one parquet file), each with ``step``, ``reward`` (and ``rewards`` by function), ``advantage``, ``tier``, ``f1``,
    ``join`` and ``consensus``. A file that is not parquet (cut off by a killed run, say), or a row whose episode a
    reader would fail on, is a RunFolderError naming the file and the row."""
    import pandas as pd

    from t2s.scoring.rewards import REWARD_FUNCS

    path = Path(path)
    folder = path / "completions" if (path / "completions").is_dir() else path
    files = [path] if path.is_file() else sorted(folder.glob("completions_*.parquet"))
    records = []
    for file in files:
        try:
            table = pd.read_parquet(file)
        except Exception as exc:  # noqa: BLE001 - pyarrow's errors (ArrowInvalid, OSError, ...): one clear line
            raise RunFolderError(f"Error: {file} cannot be read as parquet: {exc}") from None
        if "episode" not in table.columns:
            raise RunFolderError(f"Error: {file} holds no episode records (completions logged by another trainer)")
        for number, row in enumerate(table.to_dict("records"), 1):
            records.append(_training_record(row, REWARD_FUNCS, f"Error: {file} row {number}"))
    return records


def _training_record(row: dict, reward_funcs, where: str) -> dict:
    """The episode record of one completions row, with its step, rewards and scores; RunFolderError ``where: ...``."""
    import numbers

    from t2s.evaluation.records import line_problem

    try:
        record = json.loads(row["episode"])
    except (ValueError, TypeError, RecursionError):
        raise RunFolderError(f"{where}: 'episode' is not an episode record in JSON") from None
    step = row.get("step")
    step = 0 if step is None else step
    if isinstance(step, float) and step.is_integer():
        step = int(step)
    if not isinstance(step, numbers.Integral) or isinstance(step, bool):
        raise RunFolderError(f"{where}: 'step' must be a whole number, got {str(step)[:60]}")
    rewards = {name: row[name] for name in reward_funcs if name in row}
    if not all(isinstance(value, numbers.Real) and not isinstance(value, bool) for value in rewards.values()):
        raise RunFolderError(f"{where}: the rewards must be numbers, got {str(rewards)[:60]}")
    if isinstance(record, dict):
        record.update(step=int(step), rewards=rewards, advantage=row.get("advantage"),
                      reward=next(iter(rewards.values())) if len(rewards) == 1 else sum(rewards.values()))
        record.update({key: row[key] for key in ("tier", "f1", "join", "consensus") if key in row})
    if problem := line_problem(record):
        raise RunFolderError(f"{where}: {problem}")
    return record


def has_training_episodes(path) -> bool:
    path = Path(path)
    return (path.is_file() and path.suffix == ".parquet") or any((path / "completions").glob("completions_*.parquet"))


def write_jsonl(path, lines) -> None:
    from t2s.errors import writing

    with writing(path), open(path, "w", encoding="utf-8") as handle:
        for line in lines:
            handle.write(json.dumps(line, ensure_ascii=False, default=str) + "\n")
