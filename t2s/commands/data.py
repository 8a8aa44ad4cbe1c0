"""`python -m t2s data ...`: prepare, check, difficulty, passrate, make-demo."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from t2s.ui.args import (add_hidden_alias, non_empty_path, non_negative_int, positive_float, positive_int,
                         sample_count, unit_float)
from t2s.env.databases import file_checksum
from t2s.data.rows import write_text_whole
from t2s.errors import UsageError, error_line
from t2s.ui.console import print_line, print_table
from t2s.settings import workspace

KIND_CHOICES = ("auto", "bird", "spider", "sqale", "synsql")

DOWNLOAD_HELP = """\
Where to get the data (both CC BY-SA 4.0; credit their authors):
  BIRD    https://bird-bench.github.io   (dev: dev.zip, train: train.zip)
  Spider  https://yale-lily.github.io/spider

Unpack them under {data_dir} so that it looks like this (--db-root names the folder of per-db_id folders):
  {data_dir}/bird/dev_20240627/dev.json
  {data_dir}/bird/dev_20240627/dev_tables.json
  {data_dir}/bird/dev_20240627/dev_databases/<db_id>/<db_id>.sqlite
  {data_dir}/bird/dev_20240627/dev_databases/<db_id>/database_description/*.csv
  {data_dir}/bird/train/train.json
  {data_dir}/bird/train/train_databases/<db_id>/<db_id>.sqlite
  {data_dir}/spider/dev.json            (or train_spider.json)
  {data_dir}/spider/database/<db_id>/<db_id>.sqlite
SynSQL-2.5M: its data.json beside databases/<db_id>/<db_id>.sqlite. SQaLe loads from the Hub or local parquet/JSONL.
"""

DATA_FILE_NAMES = ("dev.json", "train.json", "mini_dev_sqlite.json", "train_spider.json", "data.json")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from t2s.data.difficulty import KEEP_TARGET
    from t2s.evaluation.passrate import POLICIES as PASSRATE_POLICIES
    from t2s.evaluation.options import add_policy_arguments

    sub = parser.add_subparsers(dest="data_command", metavar="SUBCOMMAND")

    def data_args(p, output_help: str) -> None:
        p.add_argument("--data", required=True, type=non_empty_path,
                       help="data file (BIRD/Spider/SynSQL JSON, or SQaLe queries)")
        p.add_argument("--kind", choices=KIND_CHOICES, default="auto", help="data kind (default: detect from the JSON)")
        p.add_argument("--db-root", type=non_empty_path, default=None,
                       help="folder of <db_id>/<db_id>.sqlite (default: beside the data)")
        p.add_argument("--schemas", default=None, help="SQaLe schema table (parquet/JSONL file or Hub id)")
        p.add_argument("--n", dest="limit", type=positive_int, default=None,
                       help="only N rows, picked with --seed from the whole file as eval picks its questions "
                       "(default: all)")
        add_hidden_alias(p, "--n", "--limit", type=positive_int)
        p.add_argument("--output", type=non_empty_path, default=None, help=output_help)

    p = sub.add_parser("prepare",
                       help="where to download BIRD/Spider and the folder layout, then check what is present")
    p.add_argument("--data-dir", type=non_empty_path, default=None,
                   help="folder to search (default: T2S_DATA_DIR and data/)")
    p.add_argument("--workers", type=positive_int, default=4, help="parallel database checks")

    p = sub.add_parser("check", help="run every gold SQL: ok / error / timeout / empty per database (cached)")
    data_args(p, "folder for check.jsonl, the per-row outcomes (default: print only)")
    p.add_argument("--seed", type=int, default=0, help="picks the --n rows, as in eval")
    p.add_argument("--workers", type=positive_int, default=4, help="parallel queries (default: 4)")
    p.add_argument("--timeout", type=positive_float, default=None,
                   help="seconds per gold SQL (default: the scoring cap)")
    p.add_argument("--no-cache", action="store_true", help="ignore and do not write the result cache")

    p = sub.add_parser("difficulty", help="estimate difficulty from the gold SQL; report figures where labels exist")
    p.add_argument("--data", required=True, type=non_empty_path, help="BIRD/Spider/SynSQL JSON (databases not needed)")
    p.add_argument("--output", type=non_empty_path, default=None,
                   help="folder for difficulty.json, the rows with `difficulty_estimated` (default: print only)")
    p.add_argument("--folds", type=non_negative_int, default=5,
                   help="k for the cross-validated refit on this file's labels (0: off)")
    p.add_argument("--model", type=non_empty_path, default=None,
                   help="a model JSON written by --save-model (default: the built-in one)")
    p.add_argument("--save-model", type=non_empty_path, default=None,
                   help="fit on this file's labels and save the model JSON here")
    p.add_argument("--keep-target", type=unit_float, default=KEEP_TARGET,
                   help=f"share of simple+moderate the threshold keeps when fitting (default: {KEEP_TARGET})")

    p = sub.add_parser("passrate", help="keep the questions a policy solves 1..k-1 times out of k")
    data_args(p, "folder for passrate_kept.json, the kept rows as a JSON list (default: print only)")
    p.add_argument("--policy", default="scripted-mix", choices=PASSRATE_POLICIES,
                   help="gold, scripted-mix (scripted, CPU), model, endpoint or vllm: played as `eval` plays them")
    p.add_argument("--k", type=sample_count, default=8, help="samples per question (default: 8)")
    p.add_argument("--min-solved", type=non_negative_int, default=1, help="keep questions solved at least this often")
    p.add_argument("--max-solved", type=non_negative_int, default=None,
                   help="keep questions solved at most this often (default: k-1)")
    add_policy_arguments(p)

    p = sub.add_parser("convert", help="copy the SQLite databases to DuckDB files or PostgreSQL databases, transpile "
                       "and check every gold SQL (OUT/dev.json, OUT/convert_report.json)")
    p.add_argument("--engine", required=True, choices=("duckdb", "postgres"), help="the engine to convert to")
    p.add_argument("--data", required=True, type=non_empty_path,
                   help="BIRD/Spider-style JSON data file (or its folder)")
    p.add_argument("--db-root", type=non_empty_path, default=None,
                   help="folder of <db_id>/<db_id>.sqlite (default: beside the data)")
    p.add_argument("--output", required=True, type=non_empty_path,
                   help="folder for dev.json, convert_report.json and (duckdb) dev_databases/<db_id>/<db_id>.duckdb")
    p.add_argument("--dsn", default=os.environ.get("T2S_DSN"),
                   help="postgres: a server URL whose role may create databases; each db_id becomes a database "
                   "there (one that an earlier convert made is replaced; any other is left alone) (default: $T2S_DSN)")

    p = sub.add_parser("make-demo", help="(re)write the embedded demo databases and questions (data/demo)")
    p.add_argument("--output", type=non_empty_path, default=None, help="folder to write (default: data/demo)")


def run(args: argparse.Namespace) -> int:
    command = getattr(args, "data_command", None)
    handlers = {"prepare": _prepare, "check": _check, "difficulty": _difficulty, "passrate": _passrate,
                "make-demo": _make_demo, "convert": _convert}
    if command not in handlers:
        print_line("Error: choose a subcommand: prepare, check, difficulty, passrate, convert or make-demo "
                   "(`python -m t2s data --help`).", stderr=True)
        return 2
    if command in OUTPUT_FILES and args.output and Path(args.output).is_file():  # refused before any work
        raise UsageError(f"Error: --output is a folder (it gets {OUTPUT_FILES[command]}); {args.output} is a file")
    from t2s.data.loaders import writes_over

    if command in OUTPUT_FILES and args.output and writes_over(Path(args.output) / OUTPUT_FILES[command], args.data):
        raise UsageError(f"Error: --output {args.output} would write {OUTPUT_FILES[command]} over the --data file it "
                         "reads; choose another folder")
    logging.getLogger("t2s.data.loaders").setLevel(logging.ERROR)  # the commands print missing databases themselves
    try:
        return handlers[command](args)
    except UsageError:
        raise
    except ValueError as exc:  # DataError, and the policies' refusals; OSError and the rest go to t2s.commands.main
        print(error_line(exc), file=sys.stderr)  # error_line escapes what it quotes
        return 1


def _convert(args) -> int:
    """``data convert``: the databases and questions on DuckDB or PostgreSQL, with every disagreement reported."""
    from t2s.data.convert import convert

    console = _console()
    report = convert(args.data, args.engine, args.output, dsn=args.dsn, db_root=args.db_root,
                     progress=lambda text: console.print(text, markup=False, highlight=False))
    reasons = ", ".join(f"{reason} {count}" for reason, count in report["reasons"].items()) or "none"
    console.print(f"{args.engine}: kept {report['kept']} of {report['questions']} questions "
                  f"({report['share_kept']:.1%}); left out: {reasons}", markup=False, highlight=False)
    failed = {db: info["error"] for db, info in report["databases"].items() if "error" in info}
    for db_id, error in failed.items():
        console.print(f"Warning: {db_id} was not converted: {error}", style="yellow", markup=False, highlight=False)
    console.print(f"wrote {Path(args.output) / 'dev.json'} and {Path(args.output) / 'convert_report.json'}",
                  markup=False, highlight=False)
    if report["questions"] and not report["kept"]:
        print(f"Error: no question was kept on {args.engine}; convert_report.json says why", file=sys.stderr)
        return 1
    return 0


def _console():
    from t2s.ui.console import console

    return console()


def load_for_command(args, *, require_databases=None):
    """Rows of --data by --kind (auto-detected BIRD/Spider/SynSQL JSON by default); with --n, the rows eval's seeded
    pick (``questions.select_rows``) takes from the whole file."""
    from t2s.data import loaders, rows as data_rows
    from t2s.evaluation.questions import select_rows

    if args.kind == "sqale":
        rows = loaders.load_rows("sqale", args.data, schemas=args.schemas)
    elif args.kind == "auto":
        rows = loaders.load_json_rows(args.data, args.db_root, require_databases=require_databases)
    else:
        rows = loaders.load_rows(args.kind, args.data, args.db_root, require_databases=require_databases)
    if not len(rows):  # as eval says: a check of nothing is none
        missing = rows.missing_summary() if getattr(rows, "missing_databases", None) else ""
        raise data_rows.DataError(f"Error: no question of {args.data} can be used: {missing}" if missing
                                  else f"Error: no questions in {args.data}")
    if args.limit is not None:  # the missing databases counted again, over the rows kept
        kept = select_rows(rows, args.limit, args.seed)
        missing: dict[str, int] = {}
        for row in kept:
            if row["db_id"] in rows.missing_databases:
                missing[row["db_id"]] = missing.get(row["db_id"], 0) + 1
        rows = data_rows.RowList(kept, missing, rows.db_root)
    return rows


def _data_file_for_cache(args) -> Path | None:
    path = Path(args.data)
    if path.is_file():
        return path
    if path.is_dir():
        for name in DATA_FILE_NAMES:
            if (path / name).is_file():
                return path / name
    return None


def check_and_report(rows, *, console, data_file=None, db_root=None, workers=4, timeout=None, use_cache=True,
                     output=None, title="gold SQL check", extra_key="") -> dict:
    from t2s.data import hygiene

    key = None
    if use_cache:
        key = hygiene.cache_key(rows, db_root, extra_key) if timeout is None else None
    outcomes, from_cache = hygiene.check_rows(rows, workers=workers, timeout=timeout, key=key, use_cache=use_cache)
    summary = hygiene.summarize(outcomes)
    print_table(console, hygiene.summary_table(summary, title=title))
    if getattr(rows, "missing_databases", None):
        console.print(rows.missing_summary(), style="yellow")
    if from_cache:
        console.print(f"(from the cache: {hygiene.cache_file(key)})")
    if output:
        hygiene.write_outcomes(output, outcomes)
        console.print(f"per-row outcomes: {output}")
    return summary


OUTPUT_FILES = {"check": "check.jsonl", "difficulty": "difficulty.json", "passrate": "passrate_kept.json",
                "convert": "dev.json"}


def output_file(args, name: str) -> Path | None:
    """``--output DIR``'s file ``name`` (the folder made), or None without --output."""
    if not args.output:
        return None
    Path(args.output).mkdir(parents=True, exist_ok=True)
    return Path(args.output) / name


def _check(args) -> int:
    console = _console()
    rows = load_for_command(args)
    data_file = _data_file_for_cache(args) if args.limit is None else None
    extra_key = ""
    if args.kind == "sqale":  # the outcomes depend on the schema table too
        schemas = Path(args.schemas) if args.schemas else None
        extra_key = file_checksum(schemas) if schemas and schemas.is_file() else str(args.schemas)
    summary = check_and_report(
        rows, console=console, data_file=data_file, db_root=rows.db_root, workers=args.workers, timeout=args.timeout,
        use_cache=not args.no_cache, output=output_file(args, OUTPUT_FILES["check"]),
        title=f"gold SQL check: {args.data}", extra_key=extra_key,
    )
    return _none_ran(summary, "check --data and --db-root")


def _none_ran(summary: dict, hint: str, present_only: bool = False) -> int:
    """1 and one ``Error:`` line when no row's gold SQL ran and returned rows (``present_only``: of those with a
    database; ``prepare`` checks what is there), else 0: a table of failures is not a check that passed."""
    overall = {name: n for name, n in summary["overall"].items() if not present_only or name != "missing_db"}
    none_ran = sum(overall.values()) > 0 and not overall["ok"]
    if none_ran:
        counts = ", ".join(f"{name} {n}" for name, n in overall.items() if n)
        print(f"Error: the gold SQL of none of the {sum(overall.values())} rows ran and returned rows ({counts}); "
              f"{hint}", file=sys.stderr)
    return int(none_ran)


def _prepare(args) -> int:
    from t2s.data import loaders, rows as data_rows

    console = _console()
    dirs = [Path(args.data_dir)] if args.data_dir else _default_data_dirs()
    console.print(DOWNLOAD_HELP.format(data_dir=dirs[0] if dirs else "data"), markup=False, highlight=False)
    found = []
    for folder in dirs:
        if folder.is_dir():
            found += _find_data_files(folder)
    if not found:
        console.print(f"No data files found under {', '.join(map(str, dirs))}. Nothing to check yet.")
    failed, skipped = 0, 0
    for data_file in found:
        try:
            rows = loaders.load_json_rows(data_file)
        except data_rows.DataError as exc:
            console.print(f"{data_file}: skipped. {exc}", style="yellow")
            skipped += 1
            continue
        summary = check_and_report(rows, console=console, data_file=data_file, db_root=rows.db_root,
                                   workers=args.workers, title=f"gold SQL check: {data_file}")
        failed |= _none_ran(summary, f"in {data_file}: check its databases", present_only=True)
    if found and skipped == len(found):  # found, and not one checked: no result
        print(f"Error: none of the {len(found)} data files found could be checked (each skipped, above)",
              file=sys.stderr)
        return 1
    return failed


def _default_data_dirs() -> list[Path]:
    dirs = []
    if os.environ.get("T2S_DATA_DIR"):
        dirs.append(Path(os.environ["T2S_DATA_DIR"]))
    dirs.append(workspace() / "data")
    return dirs


def _find_data_files(folder: Path, depth: int = 3) -> list[Path]:
    """Known data file names under ``folder`` (up to ``depth`` levels), skipping database folders."""
    found = []
    stack = [(folder, 0)]
    while stack:
        here, level = stack.pop()
        try:
            entries = sorted(here.iterdir())
        except OSError:
            continue
        for entry in entries:
            if entry.is_file() and entry.name in DATA_FILE_NAMES:
                found.append(entry)
            elif entry.is_dir() and level < depth and not entry.name.endswith(("databases", "database")):
                stack.append((entry, level + 1))
    return sorted(found)


def _difficulty(args) -> int:
    from t2s.data import difficulty
    from t2s.data import rows as data_rows

    console = _console()
    data_file = Path(args.data)
    if data_file.is_dir():
        data_file = next((data_file / n for n in DATA_FILE_NAMES if (data_file / n).is_file()), data_file)
    records = data_rows.read_records(data_file)
    if not records:
        raise data_rows.DataError(f"Error: no questions in {args.data}")
    rows = difficulty.labelled_rows(records, data_file)
    model = None
    if args.model:
        model = difficulty.read_model(args.model)
    if args.save_model:
        model = difficulty.calibrate(rows, folds=max(2, args.folds or 5), keep_target=args.keep_target)
        Path(args.save_model).write_text(difficulty.model_json(model), encoding="utf-8")
        console.print(f"model saved: {args.save_model}")
    estimates = difficulty.estimate(rows, model)
    counts = {c: estimates.count(c) for c in difficulty.CLASSES}
    console.print(f"{len(rows)} rows estimated: " + ", ".join(f"{c} {n}" for c, n in counts.items()))
    labelled = [i for i, r in enumerate(rows) if r["difficulty"] in difficulty.CLASSES]
    if labelled:
        figures = difficulty.filter_figures([rows[i]["difficulty"] for i in labelled], [estimates[i] for i in labelled])
        note = " (in-sample when this file is the calibration data)" if not args.save_model else " (in-sample)"
        print_figures(console, figures, f"the estimator on this file's {len(labelled)} labels{note}")
        if args.folds and args.folds >= 2 and len(labelled) >= 2 * args.folds:
            vectors = [difficulty.feature_vector(rows[i]["gold_sql"], rows[i]["evidence"]) for i in labelled]
            cv = difficulty.cross_validate(vectors, [rows[i]["difficulty"] for i in labelled], folds=args.folds,
                                           keep_target=args.keep_target)
            print_figures(console, cv, f"{args.folds}-fold cross-validation of a refit on these labels (threshold "
                                       f"set to keep {args.keep_target:.0%} of simple+moderate in each training part)")
    path = output_file(args, OUTPUT_FILES["difficulty"])
    if path:
        out = [{**record, "difficulty_estimated": est} for record, est in zip(records, estimates)]
        write_text_whole(path, json.dumps(out, indent=1, ensure_ascii=False))
        console.print(f"rows with difficulty_estimated: {path}")
    return 0


def print_figures(console, figures: dict, title: str) -> None:
    """Confusion matrix (true rows x estimated columns), then accuracy and the filter's shares."""
    from rich.table import Table

    from t2s.data.difficulty import CLASSES

    table = Table(title=title)
    table.add_column("true \\ estimated")
    for c in CLASSES:
        table.add_column(c, justify="right")
    for t in CLASSES:
        table.add_row(t, *[str(figures["confusion"][t][p]) for p in CLASSES])

    def pct(value):
        return "n/a" if value is None else f"{value:.1%}"

    print_table(console, table)
    console.print(f"accuracy {pct(figures['accuracy'])} | simple+moderate kept by the filter "
                  f"{pct(figures['kept_simple_moderate'])} | "
                  f"challenging excluded {pct(figures['excluded_challenging'])}")


def _passrate(args) -> int:
    from t2s.evaluation import passrate
    from t2s.settings import command_environment

    command_environment()

    console = _console()
    high = args.k - 1 if args.max_solved is None else args.max_solved
    if args.k < 2:
        raise UsageError("Error: --k must be at least 2")
    if not args.min_solved <= high <= args.k:
        raise UsageError(f"Error: the kept range --min-solved {args.min_solved} .. --max-solved {high} must lie "
                         f"within 0 .. --k {args.k}, lowest first")
    rows = load_for_command(args, require_databases=None)
    if getattr(rows, "missing_databases", None):
        console.print(f"{rows.missing_summary()} (skipped)", style="yellow")
        rows = [r for r in rows if r["db_id"] not in rows.missing_databases]
    from t2s.evaluation.config import PolicyConfig

    counts = passrate.policy_counts(rows, PolicyConfig.from_options(vars(args)))
    kept = passrate.keep_partially_solved(rows, counts, args.k, args.min_solved, high)
    print_table(console, passrate.histogram_table(counts, args.k, args.min_solved, high))
    from t2s.ui.console import some

    unplayed = getattr(counts, "unplayed", [])
    unscored = [str(row.get("question_id")) for row, solved in zip(rows, counts)
                if solved is None and str(row.get("question_id")) not in unplayed]
    if unplayed:
        console.print(f"{len(unplayed)} rows not measured, an episode of theirs ended in an error or before its "
                      f"first turn (never kept; run again to measure them): {some(unplayed)}", style="yellow",
                      highlight=False)
    if unplayed and len(unscored) + len(unplayed) == len(rows):  # both causes together: nothing measured either
        print(f"Error: no row was measured: {len(unscored)} rows' gold SQL fails and {len(unplayed)} rows had an "
              "episode that played no turn (see above; nothing written)", file=sys.stderr)
        return 1
    if unscored and len(unscored) == len(rows):
        print(f"Error: no row could be scored: the gold SQL of every one of the {len(rows)} rows fails on its "
              "database; check --data and --db-root (nothing written)", file=sys.stderr)
        return 1
    if unscored:
        console.print(f"{len(unscored)} rows not scored, their gold SQL fails (never kept): {some(unscored)}",
                      style="yellow", highlight=False)
    path = output_file(args, OUTPUT_FILES["passrate"])
    if path:
        write_text_whole(path, json.dumps(kept, indent=1, ensure_ascii=False))
        console.print(f"{len(kept)} of {len(rows)} rows kept: {path}")
    return 0


def _make_demo(args) -> int:
    import sqlite3

    from t2s.data import demo
    from t2s.settings import DEMO_DIR

    output = Path(args.output) if args.output else DEMO_DIR
    try:
        records = demo.write_demo(output)
    except demo.NotTheDemos as exc:
        print_line(error_line(exc), stderr=True)
        return 1
    except (OSError, sqlite3.Error, RuntimeError) as exc:
        print_line(f"Error: could not write the demo data to {output}: {exc}", stderr=True)
        return 1
    print_line(f"Wrote {len(records)} questions over {len({r['db_id'] for r in records})} databases to {output}")
    return 0
