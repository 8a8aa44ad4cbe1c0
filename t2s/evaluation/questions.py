"""Which questions a command plays or scores: one meaning of ``--n`` and one rule for a missing database.

- ``--n N --seed S`` (``eval``, ``data check``, ``data passrate``): :func:`select_rows`, N rows picked by S from
  the whole data file, kept in file order; every row when N is 0 or absent.
- A question whose database is missing (no file, or a server without it) or cannot be read (``data.db_probe``):
  :func:`playable_rows` stops with an error naming the databases, or, with ``--skip-missing-dbs``, leaves their
  questions out and counts them (:func:`skipped_summary` writes the count into a summary). ``eval`` and ``score``
  follow it, so a figure's denominator never depends on what was predicted.
- A question the data repeats word for word is played, scored and counted once (:func:`once_each`).
"""

from __future__ import annotations

import random
from pathlib import Path

from t2s.errors import EvalError


def select_rows(rows: list[dict], n: int | None, seed: int) -> list[dict]:
    """``n`` rows picked by ``seed`` from the whole data file (kept in file order); all rows when n is 0 or None.

    The pick depends only on the file's length, n and seed, so runs of different models pair question by question.
    """
    if not n or n <= 0 or n >= len(rows):
        return list(rows)
    positions = sorted(random.Random(seed).sample(range(len(rows)), n))
    return [rows[i] for i in positions]


def once_each(rows, selected: list[dict]) -> tuple[list[dict], list[str]]:
    """(``selected`` with each question once, the ids among them that the data repeats word for word): such a row
    (``RowList.repeated_ids``; BIRD mini-dev has two) is played, scored and counted once, at its first position."""
    unique: dict[str, dict] = {}
    for row in selected:
        unique.setdefault(row["question_id"], row)
    repeated = sorted(set(unique) & set(getattr(rows, "repeated_ids", None) or ()))
    return list(unique.values()), repeated


def playable_rows(rows, selected: list[dict], *, skip_missing_dbs: bool, db_root=None) -> tuple[list[dict], dict]:
    """(the ``selected`` rows whose databases are present and readable, what was skipped).

    ``rows``: the loaded data (a ``RowList``: its ``missing_databases`` name the databases a server lacks, its
    ``db_root`` the folder searched). A missing or unreadable database is an EvalError naming it; with
    ``skip_missing_dbs`` its questions are left out and counted in the returned dict (``questions``, ``db_ids``,
    ``unusable_questions``, ``unusable_dbs``). Leaving out every question is an EvalError too.
    """
    from t2s.data.db_probe import database_problems, problems_text
    from t2s.env.databases import is_dsn

    missing = {r["db_id"] for r in selected if r.get("db_path") and not is_dsn(r["db_path"])
               and not Path(r["db_path"]).exists()}  # a pipe or folder there is unreadable, below
    missing |= {r["db_id"] for r in selected if r["db_id"] in getattr(rows, "missing_databases", {})}
    skipped: dict = {"questions": 0, "db_ids": []}
    if missing:
        if not skip_missing_dbs:
            root = getattr(rows, "db_root", None) or db_root
            raise EvalError(
                f"Error: {len(missing)} database(s) missing under {root}: {', '.join(sorted(missing))} "
                "(pass --db-root, or --skip-missing-dbs to skip their questions)"
            )
        skipped.update(questions=sum(r["db_id"] in missing for r in selected), db_ids=sorted(missing))
        selected = [r for r in selected if r["db_id"] not in missing]
    unusable = database_problems(selected)
    if unusable:
        if not skip_missing_dbs:
            raise EvalError(f"Error: {len(unusable)} database(s) cannot be read: {problems_text(unusable)} "
                            "(repair them, or pass --skip-missing-dbs to skip their questions)")
        skipped["unusable_questions"] = sum(r["db_id"] in unusable for r in selected)
        skipped["unusable_dbs"] = unusable
        selected = [r for r in selected if r["db_id"] not in unusable]
    if not selected:  # an average over no question would print EX 0.000 as if it were a result
        raise EvalError(f"Error: every selected question was skipped ({skipped['questions']} with a missing database, "
                        f"{skipped.get('unusable_questions', 0)} with an unreadable one): nothing to evaluate")
    return list(selected), skipped


def skipped_summary(skipped: dict | None) -> dict:
    """The summary keys of :func:`playable_rows`' skipped questions: ``skipped_missing_dbs``, ``missing_db_ids``,
    ``skipped_unusable_dbs``, ``unusable_db_ids`` and ``unusable_dbs`` (the reason for each); and
    ``repeated_question_ids`` (:func:`once_each`, under ``repeated_ids``)."""
    skipped = skipped or {}
    unusable = skipped.get("unusable_dbs") or {}
    return {
        "skipped_missing_dbs": int(skipped.get("questions", 0)),
        "missing_db_ids": sorted(skipped.get("db_ids", [])),
        "skipped_unusable_dbs": int(skipped.get("unusable_questions", 0)),
        "unusable_db_ids": sorted(unusable),
        "unusable_dbs": dict(sorted(unusable.items())),
        "repeated_question_ids": sorted(skipped.get("repeated_ids", [])),
    }
