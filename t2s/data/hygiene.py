"""Gold hygiene: run every gold SQL under the scoring deadline and sort the rows into ok / error / timeout / empty.

Training drops rows whose gold SQL errors, times out or returns nothing (docs/design.md §9), and logs each count. Rows
whose database file is absent are counted as ``missing_db``. Outcomes are cached on disk, keyed by the data (file hash
or row contents), the database files (path, size, mtime) and the database root, so a second run reads the cache instead
of querying. The cache folder is ``T2S_CACHE_DIR`` or ``.cache/`` in the repository.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Sequence

from t2s.settings import workspace

log = logging.getLogger(__name__)

OUTCOMES = ("ok", "error", "timeout", "empty", "missing_db")
CACHE_VERSION = 1
DEFAULT_WORKERS = 4


def cache_dir() -> Path:
    """Where cached results live: ``T2S_CACHE_DIR`` or the workspace's ``.cache``."""
    env = os.environ.get("T2S_CACHE_DIR")
    return Path(env) if env else workspace() / ".cache"


def _database_stamp(rows: Sequence[dict]) -> list:
    stamps = []
    for path in sorted({r["db_path"] for r in rows if r.get("db_path")}):
        try:
            stat = os.stat(path)
            stamps.append([path, stat.st_size, int(stat.st_mtime)])
        except OSError:
            stamps.append([path, None, None])
    return stamps


def cache_key(rows: Sequence[dict], db_root: str | Path | None = None, extra: str = "") -> str:
    """Key of a check: the rows' contents (each id, database and gold SQL as read: the same file read as another
    ``--kind`` reads other SQL), the database root and the database files.

    ``extra`` adds anything else the outcomes depend on (e.g. the hash of a SQaLe schema table).
    """
    from t2s.env import databases

    data = hashlib.sha256(
        json.dumps([[r["question_id"], r.get("db_path"), r.get("schema_id"), r["gold_sql"]] for r in rows])
        .encode("utf-8", "surrogatepass")
    ).hexdigest()
    limits = [getattr(databases, name, None)
              for name in ("SCORING_MIN_TIMEOUT", "SCORING_GOLD_FACTOR", "SCORING_MAX_TIMEOUT")]
    payload = json.dumps(
        [CACHE_VERSION, data, str(Path(db_root).resolve()) if db_root else None, _database_stamp(rows), limits, extra]
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def cache_file(key: str) -> Path:
    return cache_dir() / "data_check" / f"{key}.jsonl"


def read_cache(key: str, rows: Sequence[dict]) -> list[dict] | None:
    """Cached outcomes for exactly these rows, or None."""
    path = cache_file(key)
    if not path.is_file():
        return None
    try:  # a damaged cache (not UTF-8, not JSON, not objects) is no cache: the rows are checked again
        outcomes = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, ValueError, RecursionError):
        return None
    if not all(isinstance(o, dict) for o in outcomes):
        return None
    if [o.get("question_id") for o in outcomes] != [r["question_id"] for r in rows]:
        return None
    return outcomes


def write_cache(key: str, outcomes: Sequence[dict]) -> Path | None:
    path = cache_file(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text("".join(json.dumps(o) + "\n" for o in outcomes), encoding="utf-8")
        tmp.replace(path)
        return path
    except OSError as exc:
        log.warning("could not write the data-check cache %s: %s", path, exc)
        return None


def check_row(row: dict, timeout: float | None = None) -> dict:
    """Run one row's gold SQL; returns {question_id, db_id, outcome, rows, seconds, error}."""
    from t2s.env import databases

    record = {"question_id": row["question_id"], "db_id": row["db_id"], "outcome": "ok", "rows": 0, "seconds": 0.0,
              "error": None}
    if row.get("db_path") and not databases.is_dsn(row["db_path"]) and not os.path.isfile(row["db_path"]):
        record.update(outcome="missing_db", error=f"Error: database file not found: {row['db_path']}")
        return record
    try:
        ref = databases.ref_from_row(row)
        if timeout is None:
            result = databases.gold_result(ref, row["gold_sql"])
        else:
            result = databases.run_scoring_query(ref, row["gold_sql"], timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - an unusable row is an error outcome, never a crash
        record.update(outcome="error", error=f"Error: {exc}")
        return record
    record["seconds"] = round(float(result.seconds or 0.0), 4)
    if result.timed_out:
        record.update(outcome="timeout", error=result.error or "Error: timed out")
    elif result.error is not None:
        record.update(outcome="error", error=result.error)
    elif result.over_cap:
        record.update(outcome="error", error="Error: the gold result is over the scoring cap")
    else:
        record["rows"] = len(result.rows)
        if not result.rows:
            record["outcome"] = "empty"
    return record


def thread_map(fn, items: Sequence, *, workers: int = DEFAULT_WORKERS, label: str = "working",
               progress: bool = True) -> list:
    """``[fn(item) for item in items]`` on a thread pool, in item order, with a rich progress bar."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    results: list = [None] * len(items)
    columns = (TextColumn(label, markup=False), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, disable=not progress, transient=True) as bar, \
            ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        task = bar.add_task(label, total=len(items))
        futures = {pool.submit(fn, item): index for index, item in enumerate(items)}
        for future in as_completed(futures):
            results[futures[future]] = future.result()
            bar.advance(task)
    return results


def check_rows(
    rows: Sequence[dict],
    *,
    workers: int = DEFAULT_WORKERS,
    timeout: float | None = None,
    key: str | None = None,
    use_cache: bool = True,
    progress: bool = True,
) -> tuple[list[dict], bool]:
    """Outcomes of every row's gold SQL, in row order, run on a thread pool; returns (outcomes, from_cache)."""
    if use_cache and key is not None:
        cached = read_cache(key, rows)
        if cached is not None:
            return cached, True
    done = thread_map(lambda row: check_row(row, timeout), rows, workers=workers, label="checking gold SQL",
                      progress=progress)
    if key is not None:
        write_cache(key, done)
    return done, False


def summarize(outcomes: Sequence[dict]) -> dict:
    """{"overall": counts, "per_db": {db_id: counts}} with every outcome present (0 where none)."""
    overall = Counter({name: 0 for name in OUTCOMES})
    per_db: dict[str, Counter] = {}
    for outcome in outcomes:
        overall[outcome["outcome"]] += 1
        per_db.setdefault(outcome["db_id"], Counter({name: 0 for name in OUTCOMES}))[outcome["outcome"]] += 1
    return {"overall": dict(overall), "per_db": {db: dict(c) for db, c in sorted(per_db.items())}}


def summary_table(summary: dict, title: str = "gold SQL check"):
    """A rich table: one line per database, then the overall line."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title)
    table.add_column("database", overflow="fold")
    for name in OUTCOMES + ("total",):
        table.add_column(name, justify="right")
    for db, counts in summary["per_db"].items():
        table.add_row(db, *[str(counts[n]) for n in OUTCOMES], str(sum(counts.values())))
    overall = summary["overall"]
    cells = ["overall", *[str(overall[n]) for n in OUTCOMES], str(sum(overall.values()))]
    table.add_row(*(Text(cell, style="bold") for cell in cells), end_section=True)
    return table


def filter_rows(
    rows: Sequence[dict], *, workers: int = DEFAULT_WORKERS, use_cache: bool = True, progress: bool = False
) -> tuple[list[dict], dict]:
    """Drop rows whose gold SQL errors, times out, returns nothing, or has no database; returns (kept, counts).

    ``counts`` holds every outcome's count (``ok`` is the number kept); they are logged too.
    """
    key = cache_key(rows) if use_cache else None
    outcomes, _ = check_rows(rows, workers=workers, key=key, use_cache=use_cache, progress=progress)
    kept = [row for row, outcome in zip(rows, outcomes) if outcome["outcome"] == "ok"]
    counts = summarize(outcomes)["overall"]
    log.info("gold hygiene: kept %d of %d rows (%s)", len(kept), len(rows),
             ", ".join(f"{n} {counts[n]}" for n in OUTCOMES if n != "ok"))
    return kept, counts


def write_outcomes(path: str | Path, outcomes: Sequence[dict]) -> None:
    """Per-row outcomes as JSONL."""
    from t2s.data.rows import write_text_whole

    write_text_whole(path, "".join(json.dumps(outcome, ensure_ascii=False) + "\n" for outcome in outcomes))
