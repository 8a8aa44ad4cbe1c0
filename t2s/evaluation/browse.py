"""Reading a run's episodes: an eval folder (every mode or some), one mode folder, an episodes file, or a training
run's output_dir (the episodes it logged with ``log_completions: true``); which of them to show (``select``, the
questions that ``flipped`` between two runs) and the one-line-per-episode list (``t2s show``, ``compare.html``).
"""

from __future__ import annotations


from pathlib import Path

from t2s.evaluation.run_folders import (EPISODES, RunFolderError, eval_modes, has_training_episodes, read_jsonl,
                              read_training_episodes)


def run_episodes(path, modes: list[str] | None = None) -> list[dict]:
    """Every episode record of a run (see the module docstring), each with its ``mode``."""
    path = Path(path)
    if has_training_episodes(path):
        return read_training_episodes(path)
    if path.is_file():
        return read_jsonl(path)
    if not path.exists():
        raise RunFolderError(f"Error: run not found: {path}")
    if (path / EPISODES).is_file():
        return read_jsonl(path / EPISODES)
    found = eval_modes(path)
    if not found:
        raise RunFolderError(f"Error: {path} holds no {EPISODES} nor completions/*.parquet (an eval folder, a mode "
                             "folder, or a training run with log_completions: true)")
    chosen = modes or found
    unknown = [m for m in chosen if m not in found]
    if unknown:
        raise RunFolderError(f"Error: {path} has no mode {', '.join(unknown)} (it has {', '.join(found)})")
    lines = []
    for mode in chosen:
        lines += [{**line, "mode": line.get("mode") or mode} for line in read_jsonl(path / mode / EPISODES)]
    return lines


def is_wrong(line: dict) -> bool:
    """An episode that did not answer: official 0 (eval), or a tier below equivalent (training)."""
    if line.get("official") is not None:
        return not line["official"]
    return line.get("tier") not in (None, "equivalent")


def select(lines: list[dict], *, wrong=False, tier=None, db=None, ids=None) -> list[dict]:
    """The lines that pass every given filter."""
    ids = {str(i) for i in ids or []}
    return [
        line for line in lines
        if (not wrong or is_wrong(line)) and (tier is None or line.get("tier") == tier)
        and (db is None or line.get("db_id") == db) and (not ids or str(line.get("question_id")) in ids)
    ]  # fmt: skip


def flipped(lines_a: list[dict], lines_b: list[dict]) -> list[tuple[str, dict, dict]]:
    """(``only_a`` or ``only_b``, line A, line B) of each question scored in both whose official score differs."""
    def first(lines):
        chosen: dict[str, dict] = {}
        for line in lines:
            key = str(line.get("question_id"))
            if key not in chosen or int(line.get("sample") or 0) < int(chosen[key].get("sample") or 0):
                chosen[key] = line
        return chosen

    a, b = first(lines_a), first(lines_b)
    out = []
    for key in a:
        if key in b and a[key].get("official") is not None and b[key].get("official") is not None:
            if bool(a[key]["official"]) != bool(b[key]["official"]):
                out.append(("only_a" if a[key]["official"] else "only_b", a[key], b[key]))
    return out


def _summary_row(line: dict) -> list[str]:
    score = line.get("official")
    if score is None and line.get("tier") is not None:
        score = f"{line['tier']} {line.get('reward', '')}".strip()
    counters = line.get("counters") or {}
    return [str(line.get("question_id")), str(line.get("sample") or line.get("step") or 0), str(line.get("mode") or ""),
            str(line.get("db_id") or ""), str(line.get("difficulty") or ""), "-" if score is None else str(score),
            str(counters.get("turns", "")), str(line.get("final_sql_source") or "")]


def print_list(console, lines: list[dict], title: str, labels: list[str] | None = None) -> None:
    from rich.table import Table

    from t2s.ui.console import print_table

    table = Table(title=title)
    columns = (["flip"] if labels else []) + ["id", "sample/step", "mode", "db", "difficulty", "score", "turns", "final SQL"]
    for column in columns:
        table.add_column(column)
    for index, line in enumerate(lines):
        table.add_row(*(([labels[index]] if labels else []) + _summary_row(line)))
    print_table(console, table)
