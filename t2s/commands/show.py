"""`python -m t2s show RUN [RUN_B]`: read the episodes of a run in a terminal.

RUN is an eval folder (every mode, or ``--mode``), one of its mode folders, an episodes file, or a training run's
output_dir (the episodes it logged with ``log_completions: true``,
``t2s.evaluation.run_folders.read_training_episodes``). With RUN_B the two runs are paired on question_id (sample 0)
and only the questions that flipped are listed: ``only_a`` (A right, B wrong) and ``only_b``.

Without ``--id`` the matching episodes are listed one a line, in data order (mode by mode, then question id, then
sample), ``--n N`` of them at most; with ``--id`` (or when one episode matches) its transcript is printed
(``t2s.evaluation.transcript``), for a pair both runs' transcripts. A filter naming what the run does not hold (an
unknown question id, database, tier or sample) is an ``Error:`` naming what it has, exit status 1.
"""

from __future__ import annotations

from t2s.errors import T2SError, UsageError
from t2s.ui.args import add_hidden_alias, non_empty_path, non_negative_int, positive_int


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
    parser.add_argument("--n", type=positive_int, default=None, help="list at most N episodes (default: all)")
    add_hidden_alias(parser, "--n", "--limit", type=positive_int)


def run(args) -> int:
    from t2s.ui.console import console as make_console, print_line
    from t2s.evaluation.browse import (check_filters, flipped, in_data_order, print_list, print_pairs, run_episodes,
                                       select)
    from t2s.evaluation.transcript import print_transcript

    if args.tier and args.run_b:
        raise UsageError("Error: show: --tier reads training episodes; it does not apply to a pair of runs")
    console = make_console()
    filters = dict(wrong=args.wrong, tier=args.tier, db=args.db, ids=args.id)
    lines = run_episodes(args.run, args.mode)
    lines_b = run_episodes(args.run_b, args.mode) if args.run_b else []
    for run, held in ((args.run, lines), (args.run_b, lines_b if args.run_b else [None])):
        if not held:  # a run stopped before its first episode was written: nothing to show, nor to pair
            raise T2SError(f"Error: {run} holds no episodes yet (its run stopped before the first was written)")
    ids_a, ids_b = ({str(x.get("question_id")) for x in run} for run in (lines, lines_b))
    if args.run_b and not ids_a & ids_b:
        raise T2SError(f"Error: {args.run} and {args.run_b} share no question, so they cannot be paired (as `compare` "
                       "refuses them): evaluate both on the same data")
    check_filters(lines + lines_b, args.run if not args.run_b else f"{args.run} or {args.run_b}", ids=args.id,
                  db=args.db, tier=args.tier, sample=args.sample)
    if args.sample is not None:  # both runs' sample S, paired
        lines, lines_b = ([line for line in run if int(line.get("sample") or 0) == args.sample]
                          for run in (lines, lines_b))
    lines = in_data_order(lines)
    if args.run_b:
        scored_b = {str(line["question_id"]) for line in lines_b if line.get("official") is not None}
        if not any(line.get("official") is not None and str(line["question_id"]) in scored_b for line in lines):
            raise T2SError(f"Error: no question is scored in both {args.run} and {args.run_b} (as `compare` refuses "
                           "them): nothing to pair")
        pairs = flipped(lines, lines_b)
        pairs = [p for p in pairs if select([p[1]], **filters) or select([p[2]], **filters)]
        if args.id and not pairs:  # named, but the same in both runs: said, not an empty output
            print_line(f"{', '.join(args.id)}: not flipped between A = {args.run} and B = {args.run_b} (the same "
                       "score in both, or not scored in one); show each run alone to read it")
        if args.id or len(pairs) == 1:
            for label, line_a, line_b in pairs:
                for name, line in (("A", line_a), ("B", line_b)):
                    console.rule(f"{label}: run {name}", style="bold")
                    print_transcript(line, console, fold_thinking=not args.thinking)
        else:
            only_a = sum(label == "only_a" for label, _, _ in pairs)
            shown = pairs[: args.n] if args.n else pairs
            unpaired = f"; A's {len(ids_a - ids_b)} and B's {len(ids_b - ids_a)} others are not paired" \
                if ids_a != ids_b else ""
            print_pairs(console, shown, f"flipped between A = {args.run} and B = {args.run_b}, over the "
                        f"{len(ids_a & ids_b)} questions both hold{unpaired}: only_a {only_a}, only_b "
                        f"{len(pairs) - only_a}" + (f" (the first {len(shown)})" if len(shown) < len(pairs) else ""))
        return 0
    chosen = select(lines, **filters)
    if not chosen:
        console.print(f"no episode of {len(lines)} matches", markup=False, highlight=False)
        return 0
    if args.id or len(chosen) == 1:
        for line in chosen:
            print_transcript(line, console, fold_thinking=not args.thinking)
    else:
        shown = chosen[: args.n] if args.n else chosen
        first = f", the first {len(shown)}" if len(shown) < len(chosen) else ""
        print_list(console, shown, f"{len(chosen)} of {len(lines)} episodes{first} (--id ID prints a transcript)")
    return 0
