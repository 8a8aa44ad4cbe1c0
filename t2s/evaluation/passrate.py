"""Pass-rate filter (the sibling recipe): keep the questions a policy solves 1 to k-1 times out of k.

The episodes are the evaluator's: ``t2s.evaluation.runner.solve_counts`` plays k samples per row with any ``eval``
policy (``model``, ``endpoint``, ``vllm``, ``gold``) or with a scripted policy factory, and scores each final SQL with
the official metric, exactly as ``eval`` does. ``scripted-mix`` is a scripted policy with a known spread of solve
counts, a CPU check of the whole filter.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Callable, Sequence

SCRIPTED_POLICIES = ("gold", "scripted-mix")
POLICIES = (*SCRIPTED_POLICIES, "model", "endpoint", "vllm")
WRONG_SQL = "SELECT 'scripted wrong answer' AS answer"


def submit_only(sql: str, dialect: str = "exec_plan", tool_format: str = "json"):
    """A scripted policy that submits ``sql`` in its first turn (with the dialect's submit tool, in its call format)."""
    from t2s.backends.scripted import submit_policy

    return submit_policy(sql, dialect, tool_format)


def mix_solved(question_id: str, k: int) -> int:
    """How many of k samples the ``scripted-mix`` policy solves for a question: 0..k, fixed by the id's hash."""
    return int(hashlib.sha256(str(question_id).encode()).hexdigest(), 16) % (k + 1)


def scripted_policy_factory(name: str, k: int, dialect: str = "exec_plan", tool_format: str = "json") -> Callable:
    """``policy_factory(row, sample) -> policy`` for a scripted policy name.

    - ``gold``: the gold policy (explores, runs and submits the gold SQL): solves every sample;
    - ``scripted-mix``: submits the gold SQL on the first ``mix_solved(question_id, k)`` samples and a wrong query on
      the rest, so the solve counts spread over 0..k deterministically (a CPU check of the whole filter).
    """
    if name == "gold":
        from t2s.backends.scripted import GoldPolicy
        from t2s.env.databases import ref_from_row
        from t2s.env.schema import get_schema

        return lambda row, sample: GoldPolicy(row, get_schema(ref_from_row(row)), dialect=dialect,
                                              tool_format=tool_format)
    if name == "scripted-mix":
        return lambda row, sample: submit_only(
            row["gold_sql"] if sample < mix_solved(row["question_id"], k) else WRONG_SQL, dialect, tool_format)
    raise ValueError(f"Error: unknown scripted policy {name!r} (expected one of {', '.join(SCRIPTED_POLICIES)})")


def solve_counts(
    rows: Sequence[dict], policy_factory: Callable, k: int, *, workers: int = 4, progress: bool = True, **options
) -> list[int | None]:
    """For each row, how many of k episodes of ``policy_factory(row, sample)`` end in an official match (None: the
    row cannot be scored, its gold SQL fails).

    ``options`` set the evaluator's policy options, named as its flags (``max_turns``, ``episode_token_budget``, ...).
    """
    from t2s.evaluation.config import PolicyConfig
    from t2s.evaluation.runner import solve_counts as play_counts

    config = PolicyConfig.from_options(dict(options, policy="scripted", k=k, workers=workers, quiet=not progress))
    return play_counts(list(rows), config, policy_factory=policy_factory)


def policy_counts(rows: Sequence[dict], config) -> list[int | None]:
    """Solve counts for ``data passrate``'s ``PolicyConfig``: ``scripted-mix`` here, every other policy the
    evaluator's own.

    Raises ValueError (``Error: ...``) for what the evaluator refuses (a missing --model, an unreachable endpoint).
    """
    from t2s.evaluation.runner import solve_counts as play_counts
    from t2s.errors import EvalError

    factory = None
    if config.policy == "scripted-mix":
        factory = scripted_policy_factory(config.policy, config.k, config.episode.dialect, config.episode.tool_format)
    try:
        return play_counts(list(rows), config, policy_factory=factory)
    except EvalError as exc:
        raise ValueError(str(exc)) from None


def keep_partially_solved(rows: Sequence[dict], counts: Sequence[int], k: int, low: int = 1, high: int | None = None):
    """Rows solved between ``low`` and ``high`` (default k-1) times, each with ``passrate_solved`` and
    ``passrate_k``; a row that cannot be scored (count None) is never kept."""
    high = k - 1 if high is None else high
    kept = []
    for row, solved in zip(rows, counts):
        if solved is not None and low <= solved <= high:
            kept.append({**row, "passrate_solved": int(solved), "passrate_k": int(k)})
    return kept


def histogram_table(counts: Sequence[int], k: int, low: int, high: int):
    """A rich table: how many rows were solved 0..k times, and which of them are kept; rows that cannot be scored
    (count None) in a row of their own, and those not measured (``SolveCounts.unplayed``) in another."""
    from rich.table import Table
    from rich.text import Text

    histogram = Counter(counts)
    unplayed = len(getattr(counts, "unplayed", []))
    histogram[None] -= unplayed
    table = Table(title=f"pass rate over {k} samples")
    table.add_column("solved")
    table.add_column("rows", justify="right")
    table.add_column("kept", justify="center")
    for solved in range(k + 1):
        table.add_row(f"{solved}/{k}", str(histogram.get(solved, 0)), "yes" if low <= solved <= high else "")
    if histogram.get(None):
        table.add_row("not scored (gold SQL fails)", str(histogram[None]), "")
    if unplayed:
        table.add_row("not measured (an episode played no turn)", str(unplayed), "")
    kept = sum(n for s, n in histogram.items() if s is not None and low <= s <= high)
    table.add_row(*(Text(cell, style="bold") for cell in ("total", str(len(counts)), f"{kept} kept")), end_section=True)
    return table
