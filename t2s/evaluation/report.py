"""What `eval` reports: the summary of scored episode lines, its markdown table, and its plot.

Definitions (DESIGN §7), over every scored episode (all k samples of every question):
- ``execution_accuracy_official``, ``strict``, ``soft_f1``: means of the per-episode scores;
- ``execution_accuracy_official_no_fallback``: official EX counting an episode whose final SQL came from the fallback
  (the last query that ran) as wrong;
- ``submit_rate``, ``forced_rate``, ``fallback_rate``, ``truncation_rate``: shares of episodes that submitted, got the
  forced final turn, used the fallback, ran out of token budget;
- ``turn_cutoff_rate`` and ``format_deviation_rate``: shares of episodes with at least one turn cut by
  ``max_tokens_per_turn``, and with at least one format deviation;
- ``executes_rate``: share of episodes whose final SQL ran without error on the scoring connection;
- ``mean_turns`` and ``mean_calls``: per episode; ``write_attempts``: the total count;
- ``vote_at_k`` (k > 1): official EX of the execution-consistency vote over each question's k samples.
``n`` is the number of questions; ``n_episodes`` is n × k.

Questions that cannot be scored are left out of every figure above, and counted with their ids:
- ``skipped_missing_dbs`` / ``missing_db_ids``: questions whose database file is absent (``--skip-missing-dbs``);
- ``skipped_unusable_dbs`` / ``unusable_db_ids`` (and ``unusable_dbs``, the reason for each): questions whose
  database cannot be read (not SQLite, truncated, damaged, cannot be opened);
- ``gold_failures`` / ``gold_failure_ids``: questions whose gold SQL fails, times out or goes over the scoring cap
  (their episode lines carry ``gold_error`` and null scores).
``repeated_question_ids``: questions the data file holds more than once, word for word, evaluated and counted once.

``stop_reasons``: how many scored episodes ended for each reason (``t2s.env.record.STOP_REASONS``; lines written
before records carried one count as ``unrecorded``). ``no_turn_episodes`` counts those that ended before their first
turn, and ``no_turn_longest_prompt`` is the longest of their prompts in tokens.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

from t2s.data.loaders import BIRD_DEV

DIFFICULTY_ORDER = ("simple", "moderate", "challenging")
SCORE_KEYS = ("execution_accuracy_official", "strict", "soft_f1")


def _mean(values) -> float | None:
    """The mean to 6 places; None (shown "-") of no values: nothing scored is no accuracy of 0."""
    values = list(values)
    return round(sum(values) / len(values), 6) if values else None


def _counter(line: dict, name: str) -> int:
    return int((line.get("counters") or {}).get(name) or 0)


def score_block(lines: list[dict]) -> dict:
    """n (questions), and the three accuracy figures over the lines."""
    return {
        "n": len({line["question_id"] for line in lines}),
        "execution_accuracy_official": _mean(line["official"] for line in lines),
        "strict": _mean(line["strict"] for line in lines),
        "soft_f1": _mean(line["soft_f1"] for line in lines),
    }


def behaviour_block(lines: list[dict]) -> dict:
    """The behaviour figures of DESIGN §7 over the lines."""
    return {
        "execution_accuracy_official_no_fallback": _mean(
            line["official"] if line.get("final_sql_source") != "fallback" else 0 for line in lines
        ),
        "submit_rate": _mean(min(1, _counter(line, "submitted")) for line in lines),
        "executes_rate": _mean(1 if line.get("executes") else 0 for line in lines),
        "mean_turns": _mean(_counter(line, "turns") for line in lines),
        "mean_calls": _mean(_counter(line, "calls") for line in lines),
        "fallback_rate": _mean(min(1, _counter(line, "fallback_used")) for line in lines),
        "forced_rate": _mean(min(1, _counter(line, "forced")) for line in lines),
        "truncation_rate": _mean(min(1, _counter(line, "truncated")) for line in lines),
        "turn_cutoff_rate": _mean(min(1, _counter(line, "turn_cutoffs")) for line in lines),
        "write_attempts": sum(_counter(line, "write_attempts") for line in lines),
        "format_deviation_rate": _mean(min(1, _counter(line, "format_deviations")) for line in lines),
    }


def stop_block(lines: list[dict]) -> dict:
    """Episodes per stop reason, and those that ended before their first turn."""
    from collections import Counter

    reasons = Counter(line.get("stop_reason") or "unrecorded" for line in lines)
    no_turn = [line for line in lines if line.get("stop_reason") == "prompt_too_long"]
    return {"stop_reasons": dict(sorted(reasons.items())), "no_turn_episodes": len(no_turn),
            "no_turn_longest_prompt": max((int(line.get("prompt_tokens") or 0) for line in no_turn), default=0)}


def by_difficulty(lines: list[dict]) -> dict[str, list[dict]]:
    """``lines`` grouped by their ``difficulty`` ("unknown" where it is empty), in BIRD's order (simple, moderate,
    challenging), then any other names alphabetically: the order of ``per_difficulty`` in eval's and score's
    summaries."""
    groups: dict[str, list[dict]] = {}
    for line in lines:
        groups.setdefault(line.get("difficulty") or "unknown", []).append(line)
    return {name: groups[name] for name in _ordered(groups)}


def _ordered(keys) -> list[str]:
    known = [d for d in DIFFICULTY_ORDER if d in keys]
    return known + sorted(k for k in keys if k not in DIFFICULTY_ORDER)


def summarise(lines: list[dict], *, config: dict, k: int = 1, vote_at_k: float | None = None,
              skipped: dict | None = None) -> dict:
    """The summary.json dict of one run (one mode)."""
    from t2s.evaluation.questions import skipped_summary

    gold_failure_ids = sorted({str(line["question_id"]) for line in lines if line["official"] is None})
    lines = [line for line in lines if line["official"] is not None]
    summary: dict = score_block(lines)
    summary.update(behaviour_block(lines))
    by_db: dict[str, list] = {}
    for line in lines:
        by_db.setdefault(line.get("db_id") or "unknown", []).append(line)
    summary["per_difficulty"] = OrderedDict(
        (name, {**score_block(group), **behaviour_block(group)}) for name, group in by_difficulty(lines).items()
    )
    summary["per_db"] = {db: score_block(by_db[db]) for db in sorted(by_db)}
    summary.update(stop_block(lines))
    if k > 1:
        summary["vote_at_k"] = vote_at_k
    summary["k"] = k
    summary["n_episodes"] = len(lines)
    skipped = skipped or {}
    summary.update(skipped_summary(skipped))
    summary["gold_failures"] = len(gold_failure_ids)
    summary["gold_failure_ids"] = gold_failure_ids
    summary["config"] = config
    return summary


# --------------------------------------------------------------------------------------------------------- markdown
_MAIN_ROWS = (
    ("questions (n)", "n", "d"),
    ("official EX", "execution_accuracy_official", "f"),
    ("official EX, no fallback", "execution_accuracy_official_no_fallback", "f"),
    ("strict EX", "strict", "f"),
    ("Soft-F1", "soft_f1", "f"),
    ("vote@k official EX", "vote_at_k", "f"),
    ("submit rate", "submit_rate", "f"),
    ("SQL executes", "executes_rate", "f"),
    ("mean turns", "mean_turns", "2"),
    ("mean calls", "mean_calls", "2"),
    ("fallback rate", "fallback_rate", "f"),
    ("forced final turn", "forced_rate", "f"),
    ("truncated", "truncation_rate", "f"),
    ("turn cut-offs", "turn_cutoff_rate", "f"),
    ("format deviations", "format_deviation_rate", "f"),
    ("write attempts", "write_attempts", "d"),
)


# (label, summary key) of the questions left out of the figures, shown when there are any
UNSCORED_ROWS = (
    ("skipped (missing databases)", "skipped_missing_dbs"),
    ("skipped (unreadable databases)", "skipped_unusable_dbs"),
    ("not scored (gold SQL fails)", "gold_failures"),
)


def unscored_notes(summary: dict, limit: int = 10) -> list[str]:
    """One line per kind of question left out of the figures, naming the ids (empty when every question counted)."""
    from functools import partial

    from t2s.ui.console import some

    some = partial(some, limit=limit)
    notes = []
    if summary.get("skipped_missing_dbs"):
        notes.append(f"{summary['skipped_missing_dbs']} questions skipped, their database missing: "
                     f"{some(summary.get('missing_db_ids', []))}")
    if summary.get("skipped_unusable_dbs"):
        reasons = summary.get("unusable_dbs") or {}
        notes.append(f"{summary['skipped_unusable_dbs']} questions skipped, their database unreadable: "
                     + "; ".join(f"{db} ({reasons.get(db, '?')})" for db in summary.get("unusable_db_ids", [])[:limit]))
    if summary.get("repeated_question_ids"):
        notes.append(f"the data repeats questions word for word, each counted once: "
                     f"{some(summary['repeated_question_ids'])}")
    if summary.get("gold_failures"):
        notes.append(f"{summary['gold_failures']} questions not scored, their gold SQL fails: "
                     f"{some(summary.get('gold_failure_ids', []))}")
    return notes


def episode_notes(summary: dict) -> list[str]:
    """One line when episodes ended before their first turn, naming the prompt's length, the budget and
    ``min_episode_tokens``; one when no episode's final SQL ran (a clean-looking table of zeros is not a result)."""
    errors = (summary.get("stop_reasons") or {}).get("error", 0)
    played = summary.get("n_episodes", 0) - summary.get("no_turn_episodes", 0) - errors  # not ended before a turn
    none_ran = [f"none of the {played} played episodes' final SQL ran (executes_rate 0): each scored 0; the error "
                "column of scores.jsonl says why"] if played > 0 and summary.get("executes_rate") == 0 else []
    if errors:  # the server refused or garbled their requests, or the environment failed: not the policy's doing
        none_ran.insert(0, f"{errors} of {summary.get('n_episodes', 0)} episodes ended in an error (the server "
                           "refused or garbled a request, or the environment failed): each scored 0; the error "
                           "column of episodes.jsonl says which")
    if not summary.get("no_turn_episodes"):
        return none_ran
    from t2s.env.episode import EpisodeConfig
    from t2s.env.record import no_turn_line

    config = summary.get("config") or {}
    defaults = EpisodeConfig()
    budget = config.get("episode_token_budget", defaults.episode_token_budget)
    if config.get("mode") == "single":  # one turn: its prompt must leave room in the budget, nothing more
        longest = summary.get("no_turn_longest_prompt", 0)
        prompts = f"prompts of up to {longest} tokens" if longest else "their prompts"
        return [f"{summary['no_turn_episodes']} of {summary.get('n_episodes', 0)} single-turn episodes were not "
                f"played: {prompts} left no room in the episode token budget ({budget})"] + none_ran
    return [no_turn_line(summary["no_turn_episodes"], summary.get("n_episodes", 0),
                         summary.get("no_turn_longest_prompt", 0),
                         config.get("episode_token_budget", defaults.episode_token_budget),
                         config.get("min_episode_tokens", defaults.min_episode_tokens))] + none_ran


def _fmt(value, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "d":
        return str(int(value))
    if kind == "2":
        return f"{value:.2f}"
    return f"{value:.3f}"


def summary_markdown(summary: dict, title: str | None = None, *, public: bool = False) -> str:
    """A markdown report: the main table, then accuracy per difficulty, then the run's settings."""
    config = summary.get("config", {})
    label = title or f"{config.get('policy', '?')} / {config.get('mode', '?')}"
    lines = [f"### {label}", "", "| metric | value |", "|---|---|"]
    for name, key, kind in _MAIN_ROWS:
        if key in summary:
            lines.append(f"| {name} | {_fmt(summary[key], kind)} |")
    for name, key in UNSCORED_ROWS:
        if summary.get(key):
            lines.append(f"| {name} | {summary[key]} |")
    per = summary.get("per_difficulty") or {}
    if per:
        lines += ["", "| difficulty | n | official EX | strict EX | Soft-F1 | submit rate |",
                  "|---|---|---|---|---|---|"]
        for difficulty, block in per.items():
            lines.append(
                f"| {difficulty} | {block['n']} | {block['execution_accuracy_official']:.3f} | {block['strict']:.3f} "
                f"| {block['soft_f1']:.3f} | {block['submit_rate']:.3f} |"
            )
    settings = _settings_line(config, public=public)
    if settings:
        lines += ["", settings]
    return "\n".join(lines) + "\n"


# The published harness: n = 300 seeded questions, 6 turns, a 12,288-token episode budget, T 0.6 / top-p 0.95 /
# top-k 20, thinking on (and the training token stream: config["training_token_stream"]).
PUBLISHED_SETTINGS = {"n": 300, "max_turns": 6, "episode_token_budget": 12288, "temperature": 0.6, "top_p": 0.95,
                      "top_k": 20, "enable_thinking": True}


def published_differences(config: dict) -> list[str]:
    """How a run's settings differ from the published harness's (empty when its figures are comparable)."""
    if not config:
        return ["no settings recorded"]
    sampling = config.get("sampling") or {}
    values = {k: config.get(k) for k in ("n", "max_turns", "episode_token_budget", "enable_thinking")}
    values["n"] = config.get("questions", values["n"])  # the number played (``--n 0`` asks for every question)
    if sampling:  # a scripted policy or a predictions file samples nothing
        values.update({k: sampling.get(k) for k in ("temperature", "top_p", "top_k")})
    differences = [f"{key} {values[key]} (published {wanted})" for key, wanted in PUBLISHED_SETTINGS.items()
                   if key in values and values[key] != wanted]
    # before the flag was named training_token_stream, eval_config.json called it "comparable"
    if not config.get("training_token_stream", config.get("comparable")):
        reason = "single mode" if config.get("mode") == "single" else f"policy {config.get('policy')}"
        if config.get("endpoint_mode") == "chat":
            reason = "a chat endpoint"
        differences.insert(0, f"{reason} does not play the training token stream")
    if config.get("data") != BIRD_DEV:  # the published figures are on BIRD dev
        differences.append(f"data {config.get('data') or 'not recorded'} (published: {BIRD_DEV})")
    if config.get("database_engine", "sqlite") != "sqlite":  # the published figures are on SQLite files
        differences.append(f"database engine {config['database_engine']} (published: sqlite)")
    return differences


def comparability_line(config: dict) -> str:
    """"comparable with the published figures", or what differs from the published harness (config["comparable"]
    is true exactly when this says comparable)."""
    differences = published_differences(config)
    if not differences:
        return "comparable with the published figures"
    return "not comparable with the published figures: " + "; ".join(differences)


def _settings_line(config: dict, *, public: bool = False) -> str:
    """The run's settings in one line; ``public`` (a model card) names a local target by its folder name only."""
    if not config:
        return ""
    sampling = config.get("sampling") or {}
    target = config.get("model") or config.get("endpoint") or config.get("predictions") or config.get("policy")
    if public and isinstance(target, str) and (Path(target).is_absolute() or Path(target).exists()):
        target = Path(target).name
    parts = [
        f"policy `{config.get('policy')}`",
        f"target `{target}`",
        f"mode `{config.get('mode')}`",
        f"data `{config.get('data') or 'not recorded'}`",
        f"k {config.get('k')}",
        f"seed {config.get('seed')}",
    ]
    if sampling:
        parts.append(f"T {sampling.get('temperature')} top-p {sampling.get('top_p')} top-k {sampling.get('top_k')}")
    parts.append(f"thinking {'on' if config.get('enable_thinking') else 'off'}")
    line = comparability_line(config)
    parts.append(line if not published_differences(config) else f"**{line}**")
    return "Settings: " + ", ".join(parts) + "."


def modes_markdown(summaries: dict[str, dict], *, public: bool = False) -> str:
    """One mode's report; several modes side by side (one column per mode), then each mode's own report."""
    modes = list(summaries)
    if len(modes) == 1:
        return summary_markdown(summaries[modes[0]], title=modes[0], public=public)
    lines = ["| metric | " + " | ".join(modes) + " |", "|---|" + "---|" * len(modes)]
    for name, key, kind in _MAIN_ROWS:
        if any(key in s for s in summaries.values()):
            lines.append(f"| {name} | " + " | ".join(_fmt(s.get(key), kind) for s in summaries.values()) + " |")
    body = "\n".join(lines) + "\n"
    for mode, summary in summaries.items():
        body += "\n" + summary_markdown(summary, title=mode, public=public)
    return body


def write_reports(folder, summaries: dict[str, dict]) -> None:
    """The top of an eval folder: summary.json ({"modes": ...}), summary.md, summary.png and report.html."""
    import json

    from t2s.evaluation.report_html import write_report
    from t2s.evaluation.run_folders import SUMMARY

    folder = Path(folder)
    (folder / SUMMARY).write_text(json.dumps({"modes": summaries}, indent=2) + "\n")
    (folder / "summary.md").write_text(modes_markdown(summaries))
    plot_summaries(summaries, folder / "summary.png")
    write_report(folder)


# ------------------------------------------------------------------------------------------------------------- plot
def plot_summaries(summaries: dict[str, dict], path) -> None:
    """Official EX per difficulty (and overall), one bar group per difficulty and one bar per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = list(summaries)
    groups = _ordered({d for s in summaries.values() for d in (s.get("per_difficulty") or {})}) + ["all"]
    width = 0.8 / max(1, len(modes))
    fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(groups), 3.6))
    for i, mode in enumerate(modes):
        summary = summaries[mode]
        per = summary.get("per_difficulty") or {}
        values = [(summary if g == "all" else per.get(g, {})).get("execution_accuracy_official") for g in groups]
        xs = [j + (i - (len(modes) - 1) / 2) * width for j in range(len(groups))]
        bars = ax.bar(xs, [value or 0.0 for value in values], width=width * 0.95, label=mode)
        for bar, value in zip(bars, values):  # none scored: no bar, and "-" where its figure would be
            ax.annotate(_fmt(value, "2"), (bar.get_x() + bar.get_width() / 2, value or 0.0), ha="center",
                        va="bottom", fontsize=7)
    counts = [
        (next(iter(summaries.values())) if g == "all"
         else next(iter(summaries.values())).get("per_difficulty", {}).get(g, {})).get("n", 0)
        for g in groups
    ]
    ax.set_xticks(range(len(groups)), [f"{g}\n(n={n})" for g, n in zip(groups, counts)])
    ax.set_ylim(0, 1.08)
    ax.set_ylabel("official EX")
    config = next(iter(summaries.values())).get("config", {})
    ax.set_title(f"{config.get('policy', '')}: accuracy by difficulty", fontsize=10)
    if len(modes) > 1:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------------------- console
def print_summaries(summaries: dict[str, dict]) -> None:
    """The console table of one or more modes' summaries, then the notes on questions not scored."""
    from rich.table import Table

    from t2s.ui.console import console, print_table

    table = Table(title="t2s eval")
    table.add_column("metric")
    for mode in summaries:
        table.add_column(mode, justify="right")
    keys = ("n", "execution_accuracy_official", "execution_accuracy_official_no_fallback", "strict", "soft_f1",
            "vote_at_k", "submit_rate", "executes_rate", "mean_turns", "mean_calls", "fallback_rate", "forced_rate",
            "truncation_rate", "turn_cutoff_rate", "format_deviation_rate", "skipped_missing_dbs",
            "skipped_unusable_dbs", "gold_failures")
    for key in keys:
        values = [s.get(key) for s in summaries.values()]
        if all(v is None for v in values):
            continue
        table.add_row(key, *("-" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v)) for v in values))
    out = console()
    print_table(out, table)
    for mode, summary in summaries.items():
        notes = unscored_notes(summary) + episode_notes(summary) + [comparability_line(summary.get("config") or {})]
        for note in notes:
            out.print(f"{mode}: {note}" if len(summaries) > 1 else note, style="yellow", markup=False, highlight=False)


def sibling_table(out_dir, ks=(8, 32)) -> str:
    """``make eval-sibling``'s table from its run folders (greedy, vote<k> for each k, single): official EX of greedy
    and single-turn, vote@k of each voting run, read from each folder's summary.json (``{"modes": {mode: ...}}``)."""
    import json
    from pathlib import Path

    def mode_summary(name: str, mode: str) -> dict:
        return json.loads((Path(out_dir) / name / "summary.json").read_text(encoding="utf-8"))["modes"][mode]

    ks = [int(k) for k in ks]
    heads = ["greedy"] + [f"vote@{k}" for k in ks] + ["single-turn"]
    values = ([mode_summary("greedy", "full")["execution_accuracy_official"]]
              + [mode_summary(f"vote{k}", "full")["vote_at_k"] for k in ks]
              + [mode_summary("single", "single")["execution_accuracy_official"]])  # fmt: skip
    return "\n".join(["| " + " | ".join(heads) + " |", "|---" * len(heads) + "|",
                      "| " + " | ".join(_fmt(v, "f") for v in values) + " |"])
