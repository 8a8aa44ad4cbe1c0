"""`python -m t2s score`: score a predictions file with official EX, strict EX and BIRD's Soft-F1
(``t2s.evaluation.score`` says what is read, written and counted)."""

from __future__ import annotations

import os
from pathlib import Path

from t2s.ui.args import add_hidden_alias, non_empty_path, positive_int


def add_arguments(parser) -> None:
    parser.add_argument("--data", required=True, type=non_empty_path,
                        help="BIRD/Spider-style JSON data file (or its folder)")
    parser.add_argument("--predictions", required=True, type=non_empty_path,
                        help="BIRD predict_dev.json, or JSONL of {\"question_id\": ..., \"sql\": ...}")
    parser.add_argument("--db-root", type=non_empty_path, default=None,
                        help="folder with one sub-folder per db_id (default: the data file's sibling folder)")
    from t2s.evaluation.options import add_engine_arguments

    add_engine_arguments(parser)
    parser.add_argument("--output", required=True, type=non_empty_path,
                        help="folder for scores.jsonl, summary.json and problems.json")
    parser.add_argument("--skip-missing-dbs", action="store_true",
                        help="skip (and count) questions whose database is missing or cannot be read, as eval does "
                        "(default: stop, naming the databases)")
    parser.add_argument("--workers", type=positive_int, default=min(8, os.cpu_count() or 1),
                        help="parallel scoring threads")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_hidden_alias(parser, "--quiet", "--no-progress", action="store_true")


def run(args) -> int:
    """Bad input raises (PredictionsError, DataError, EvalError, OSError): ``t2s.commands.main`` reports it as one
    ``Error:`` line."""
    import logging

    from t2s.evaluation.score import print_warnings, score_files, score_table, score_warnings
    from t2s.ui.console import console as make_console, print_table

    console = make_console()
    logging.getLogger("t2s.data.loaders").setLevel(logging.ERROR)  # unscorable questions are reported below
    if args.engine == "postgres" and not args.dsn:
        from t2s.errors import UsageError

        raise UsageError("Error: --engine postgres needs --dsn postgresql://... (or T2S_DSN)")
    result = score_files(args.data, args.predictions, args.output, db_root=args.db_root, workers=args.workers,
                         progress=not args.quiet, engine=args.engine, dsn=args.dsn,
                         skip_missing_dbs=args.skip_missing_dbs)
    summary = result["summary"]
    print_table(console, score_table(summary))
    print_warnings(score_warnings(summary, result["predictions"]))
    console.print(f"missing {summary['missing']}, errors {summary['errors']}; "
                  f"wrote {Path(args.output) / 'scores.jsonl'} and {Path(args.output) / 'summary.json'}")
    if summary["gold_failures"] and summary["n"] == summary["missing"]:
        from t2s.errors import EvalError  # no prediction was compared with a gold result

        raise EvalError(f"Error: no question could be scored: the gold SQL of every one of the "
                        f"{summary['gold_failures']} predicted questions fails on its database (see the warning "
                        "above); check --data and --db-root")
    return 0
