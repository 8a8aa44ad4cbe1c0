"""`python -m t2s compare RUN_A RUN_B`: a paired comparison of two runs over the same questions (exact McNemar, paired
bootstrap CI, the questions that flipped); the library is ``t2s.evaluation.compare``."""

from __future__ import annotations

from pathlib import Path

from t2s.errors import writing
from t2s.ui.args import non_empty_path


# (key of the report, what it means): the console table's rows
FIGURES = (
    ("n", "questions scored in both runs"),
    ("acc_a", "{metric} accuracy of A"),
    ("acc_b", "{metric} accuracy of B"),
    ("delta", "acc_b - acc_a"),
    ("ci_low", "95% paired bootstrap CI of delta, low"),
    ("ci_high", "95% paired bootstrap CI of delta, high"),
    ("mcnemar_p", "exact McNemar p-value"),
    ("only_a", "questions A got right and B wrong"),
    ("only_b", "questions B got right and A wrong"),
)


def add_arguments(parser) -> None:
    parser.add_argument("run_a", metavar="RUN_A", help="eval folder (or one of its mode folders), score folder, or the "
                        "per-question file")
    parser.add_argument("run_b", metavar="RUN_B", help="a run of the same questions, compared against RUN_A")
    parser.add_argument("--metric", choices=("official", "strict"), default="official",
                        help="the per-question score compared (default: official)")
    parser.add_argument("--output", type=non_empty_path, default=None,
                        help="folder for compare.json (and compare.html with --html) (default: print only)")
    parser.add_argument("--html", action="store_true",
                        help="also write compare.html: the questions that flipped, both transcripts side by side "
                        "(needs --output and episodes.jsonl in both runs) (default: off)")


def run(args) -> int:
    from rich.table import Table

    from t2s.errors import UsageError
    from t2s.evaluation.compare import CompareError, compare_runs, flipped_episodes, write_html

    if args.html and not args.output:
        raise UsageError("Error: compare: --html writes compare.html into --output DIR; pass --output")
    from rich.text import Text

    from t2s.ui.console import console as make_console, print_table, safe_json

    report = compare_runs(args.run_a, args.run_b, args.metric)  # a CompareError is one Error: line in t2s.commands.main
    if args.output and Path(args.output).is_file():  # what cannot be written is said before anything is printed
        raise CompareError(f"Error: --output must be a folder; {args.output} is a file")
    pairs = flipped_episodes(args.run_a, args.run_b, args.metric) if args.html else []
    console = make_console()
    console.print(f"A = {args.run_a}\nB = {args.run_b}", markup=False, highlight=False)
    table = Table(title=f"compare ({args.metric}): B against A")
    for column in ("", "value", "meaning"):
        table.add_column(column, justify="right" if column == "value" else "left")
    for key, meaning in FIGURES:
        value = report[key]
        shown = f"{value:.3g}" if key == "mcnemar_p" else f"{value:.4f}"  # a tiny p-value is not printed as 0
        table.add_row(key, shown if isinstance(value, float) else str(value), Text(meaning.format(metric=args.metric)))
    print_table(console, table)
    if report["not_scored"]:
        console.print(f"{report['not_scored']} questions are not scored in one or both runs and were left out")
    text = safe_json(report, indent=2)  # compare.json holds what compare.html holds
    print(text)
    if args.output:
        out = Path(args.output)
        out.mkdir(parents=True, exist_ok=True)
        with writing(out / "compare.json"):
            (out / "compare.json").write_text(text + "\n", encoding="utf-8")
        written = [out / "compare.json"]
        if args.html:
            written.append(write_html(args.run_a, args.run_b, report, pairs, out))
        console.print("wrote " + ", ".join(map(str, written)), markup=False, highlight=False)
        stale = out / "compare.html"
        if not args.html and stale.is_file():  # an earlier comparison's page would sit beside this one's figures
            with writing(stale):
                stale.unlink()
            console.print(f"removed {stale}: it showed an earlier comparison (--html writes this one's)", markup=False,
                          highlight=False)
    return 0
