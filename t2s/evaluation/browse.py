"""Reading a run's episodes: an eval folder (every mode or some), one mode folder, an episodes file, or a training
run's output_dir (the episodes it logged with ``log_completions: true``); which of them to show (``select``, the
questions that ``flipped`` between two runs; ``check_filters`` refuses a filter naming what the run does not hold),
in data order (``in_data_order``), and the one-line-per-episode lists of ``t2s show`` (``print_list``,
``print_pairs``).
"""

from __future__ import annotations

import itertools
from pathlib import Path

from t2s.evaluation.run_folders import (EPISODES, RunFolderError, eval_modes, has_training_episodes, read_episodes,
                              read_training_episodes)

ASCII_DIGITS = frozenset("0123456789")


def run_episodes(path, modes: list[str] | None = None) -> list[dict]:
    """Every episode record of a run (see the module docstring), each with its ``mode``."""
    path = Path(path)
    if has_training_episodes(path):
        return read_training_episodes(path)
    if path.is_file():
        return read_episodes(path)
    if not path.exists():
        raise RunFolderError(f"Error: run not found: {path}")
    if (path / EPISODES).is_file():
        return read_episodes(path / EPISODES)
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
        lines += [{**line, "mode": line.get("mode") or mode} for line in read_episodes(path / mode / EPISODES)]
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


def flipped(lines_a: list[dict], lines_b: list[dict], metric: str = "official") -> list[tuple[str, dict, dict]]:
    """(``only_a`` or ``only_b``, line A, line B) of each question scored in both (its lowest-numbered sample) that
    is right (``metric`` 1) in one run only, as ``compare`` counts them."""
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
        if key in b and a[key].get(metric) is not None and b[key].get(metric) is not None:
            right_a, right_b = a[key][metric] >= 1, b[key][metric] >= 1
            if right_a != right_b:
                out.append(("only_a" if right_a else "only_b", a[key], b[key]))
    return out


ID_NUMBER_DIGITS = 64  # a longer run of digits in an id is compared as text


def id_order(question_id) -> tuple:
    """Sort key of a question id in data order, for any id: its numbers (runs of ASCII digits, up to
    ``ID_NUMBER_DIGITS``) compared as numbers (BIRD's ``2`` before ``10``, ``spider_dev:9`` before ``spider_dev:17``),
    the rest as text after them (other digits, as ``²`` or ``٣``, are text too)."""
    key = []
    for digits, group in itertools.groupby(str(question_id), key=ASCII_DIGITS.__contains__):
        part = "".join(group)
        key.append((0, int(part), part) if digits and len(part) <= ID_NUMBER_DIGITS else (1, 0, part))
    return tuple(key)


def in_data_order(lines: list[dict]) -> list[dict]:
    """The lines mode by mode (in the run's order), then training step, question (data order) and sample: not the
    order in which the episodes finished."""
    modes = {mode: rank for rank, mode in enumerate(dict.fromkeys(line.get("mode") for line in lines))}
    return sorted(lines, key=lambda line: (modes[line.get("mode")], int(line.get("step") or 0),
                                           id_order(line.get("question_id")), int(line.get("sample") or 0)))


def check_filters(lines: list[dict], run: str, *, ids=None, db=None, tier=None, sample=None) -> None:
    """Refuse a filter naming what the run does not hold (a question id, a database, a reward tier or a sample): an
    ``Error:`` naming what it has. A filter that matches nothing by chance (``--wrong`` on a run with no wrong
    answer) is not an error."""
    from t2s.ui.console import some

    def check(what: str, wanted, present, order=str) -> None:
        present = {str(value) for value in present if value is not None}
        unknown = [str(value) for value in wanted if str(value) not in present]
        if unknown:
            raise RunFolderError(f"Error: {run} has no {what} {', '.join(unknown)} (it has {len(present)}: "
                                 f"{some(sorted(present, key=order))})")

    check("question id", ids or [], (line.get("question_id") for line in lines), id_order)
    check("database", [db] if db is not None else [], (line.get("db_id") for line in lines))
    check("reward tier", [tier] if tier is not None else [], (line.get("tier") for line in lines))
    check("sample", [sample] if sample is not None else [], (int(line.get("sample") or 0) for line in lines), int)


QUESTION_WIDTH = 60  # characters of the question shown in a list


def _summary_row(line: dict) -> dict[str, str]:
    score = line.get("official")
    if score is None and line.get("tier") is not None:
        score = f"{line['tier']} {line.get('reward', '')}".strip()
    def one_line(value) -> str:  # a line break in any field would start a row of its own
        return " ".join(str(value).split())

    question = one_line(line.get("question") or "")
    if len(question) > QUESTION_WIDTH:
        question = question[: QUESTION_WIDTH - 1] + "…"
    counters = line.get("counters") or {}
    return {"id": one_line(line.get("question_id")), "sample/step": str(line.get("sample") or line.get("step") or 0),
            "mode": one_line(line.get("mode") or ""), "db": one_line(line.get("db_id") or ""),
            "difficulty": one_line(line.get("difficulty") or ""), "question": question,
            "score": "-" if score is None else str(score), "turns": str(counters.get("turns", "")),
            "final SQL": str(line.get("final_sql_source") or "")}


LIST_COLUMNS = ("id", "sample/step", "mode", "db", "difficulty", "question", "score", "turns", "final SQL")


def _print_rows(console, title: str, columns, rows) -> None:
    """A table of plain-text cells: ids, questions and database names are shown as written (controls as escapes),
    never read as markup."""
    from rich.table import Table

    from t2s.ui.console import print_table, untrusted

    table = Table(title=untrusted(title))
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(untrusted(cell) for cell in row))
    print_table(console, table)


def print_list(console, lines: list[dict], title: str) -> None:
    """One line per episode: id, sample or step, mode, database, difficulty, question, score, turns, final SQL's
    source."""
    rows = [_summary_row(line) for line in lines]
    _print_rows(console, title, LIST_COLUMNS, [[row[c] for c in LIST_COLUMNS] for row in rows])


def print_pairs(console, pairs: list[tuple[str, dict, dict]], title: str) -> None:
    """One line per flipped question (``flipped``), with both runs' score and final SQL's source."""
    columns = ("flip", "id", "mode", "db", "difficulty", "question", "score A", "score B", "final SQL A",
               "final SQL B")
    rows = []
    for label, line_a, line_b in pairs:
        a, b = _summary_row(line_a), _summary_row(line_b)
        rows.append([label, a["id"], a["mode"], a["db"], a["difficulty"], a["question"], a["score"], b["score"],
                     a["final SQL"], b["final SQL"]])
    _print_rows(console, title, columns, rows)
