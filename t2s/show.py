"""`python -m t2s show RUN [RUN_B]`: read the episodes of a run in a terminal.

RUN is an eval folder (every mode, or ``--mode``), one of its mode folders, an episodes file, or a training run's
output_dir (the episodes it logged with ``log_completions: true``, ``t2s.run_folders.read_training_episodes``). With RUN_B the two runs are paired on
question_id (sample 0) and only the questions that flipped are listed: ``only_a`` (A right, B wrong) and ``only_b``.

Without ``--id`` the matching episodes are listed one a line; with ``--id`` (or when one episode matches) its
transcript is printed (``t2s.transcript``), for a pair both runs' transcripts.
"""

from __future__ import annotations

from pathlib import Path

from t2s.cli_args import non_empty_path, non_negative_int
from t2s.errors import UsageError
from t2s.run_folders import (EPISODES, RunFolderError, eval_modes, has_training_episodes, read_jsonl,
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

    from t2s.rich_output import print_table

    table = Table(title=title)
    columns = (["flip"] if labels else []) + ["id", "sample/step", "mode", "db", "difficulty", "score", "turns", "final SQL"]
    for column in columns:
        table.add_column(column)
    for index, line in enumerate(lines):
        table.add_row(*(([labels[index]] if labels else []) + _summary_row(line)))
    print_table(console, table)


def add_arguments(parser) -> None:
    parser.add_argument("run", metavar="RUN", type=non_empty_path,
                        help="eval folder, one of its mode folders, a training output_dir or an episodes.jsonl file")
    parser.add_argument("run_b", metavar="RUN_B", nargs="?", default=None, type=non_empty_path,
                        help="a second run: list only the questions that flipped between RUN and RUN_B (default: none)")
    parser.add_argument("--mode", nargs="+", default=None, help="eval modes to read (default: every mode)")
    parser.add_argument("--wrong", action="store_true", help="only episodes that did not answer (default: all)")
    parser.add_argument("--tier", default=None, help="only training episodes of this reward tier (default: any)")
    parser.add_argument("--db", default=None, help="only episodes on this db_id (default: any)")
    parser.add_argument("--id", nargs="+", default=None, help="question ids: print their transcripts (default: list)")
    parser.add_argument("--sample", type=non_negative_int, default=None,
                        help="only this sample of each question (default: every sample)")
    parser.add_argument("--thinking", action="store_true", help="print thinking in full (default: folded)")


def run(args) -> int:
    from t2s.rich_output import console as make_console
    from t2s.transcript import print_transcript

    if args.tier and args.run_b:
        raise UsageError("Error: show: --tier reads training episodes; it does not apply to a pair of runs")
    console = make_console()
    filters = dict(wrong=args.wrong, tier=args.tier, db=args.db, ids=args.id)
    lines = run_episodes(args.run, args.mode)
    if args.sample is not None:
        lines = [line for line in lines if int(line.get("sample") or 0) == args.sample]
    if args.run_b:
        pairs = flipped(lines, run_episodes(args.run_b, args.mode))
        pairs = [p for p in pairs if select([p[1]], **filters) or select([p[2]], **filters)]
        if args.id or len(pairs) == 1:
            for label, line_a, line_b in pairs:
                for name, line in (("A", line_a), ("B", line_b)):
                    console.rule(f"{label}: run {name}", style="bold")
                    print_transcript(line, console, fold_thinking=not args.thinking)
        else:
            only_a = sum(label == "only_a" for label, _, _ in pairs)
            print_list(console, [p[1] for p in pairs], f"flipped: only_a {only_a}, only_b {len(pairs) - only_a}",
                       labels=[p[0] for p in pairs])
        return 0
    chosen = select(lines, **filters)
    if not chosen:
        console.print(f"no episode of {len(lines)} matches", markup=False, highlight=False)
        return 0
    if args.id or len(chosen) == 1:
        for line in chosen:
            print_transcript(line, console, fold_thinking=not args.thinking)
    else:
        print_list(console, chosen, f"{len(chosen)} of {len(lines)} episodes (--id ID prints a transcript)")
    return 0

