"""Training rewards (docs/design.md §6): the dense tiered reward of the bird recipe and the sibling recipe's reward.

The work is split in two so that the expensive part runs as each episode finishes:

1. :func:`execute_final` runs one episode's final SQL (and the cached gold SQL) on scoring connections and returns an
   :class:`ExecutionOutcome`: plain, picklable data holding everything the tiers need.
2. :func:`dense_rewards` combines a batch of outcomes into rewards, computing consensus over each group of rollouts;
   :func:`sibling_rewards` does the same for the sibling reward.

:data:`REWARD_FUNCS` holds TRL reward functions built on these, which read the rollout's per-episode extras.

Dense reward tiers, strictly ordered (3.0 > 1.3 >= executable >= 0.1 > 0.05 > 0):

| tier | reward |
|---|---|
| equivalent: official set equality with gold | 3.0 |
| executable: runs, not equivalent | 0.1 + 0.9 F1 + 0.1 join + 0.1 consensus |
| parsable: parses as SQLite SQL, but fails or times out | 0.05 |
| invalid: no SQL, SQL longer than any engine runs (``Limits.max_sql_length``), or it does not parse | 0.0 |
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from itertools import islice

from t2s.scoring.metrics import official_match

MAX_F1_CELLS = 100_000  # cells per side that the reward's F1 reads
FLOAT_DIGITS = 6

TIERS = ("equivalent", "executable", "parsable", "invalid")


@dataclass(frozen=True)
class RewardSettings:
    """The dense reward's constants. 3.0 / 0.9 / 0.1 / 0.1 are the published card's; the floor and credit are ours."""

    equivalent: float = 3.0
    executes_floor: float = 0.1
    f1_weight: float = 0.9
    join_weight: float = 0.1
    consensus_weight: float = 0.1
    parses_credit: float = 0.05
    fallback_reward_scale: float = 1.0  # multiplies the reward of an episode whose final SQL came from the fallback


@dataclass
class ExecutionOutcome:
    """What executing one episode's final SQL produced. Plain data: picklable, and ``dataclasses.asdict``-able."""

    question_id: str | None = None
    final_sql: str | None = None
    parses: bool = False  # parses as SQLite statements (sqlglot)
    executes: bool = False  # ran without error or timeout (a result over the scoring cap ran: over_cap says so)
    equivalent: bool = False  # official set equality with the gold result
    f1: float = 0.0  # F1 of normalised cell multisets against gold
    join: bool = False  # gold reads >= 2 tables and the prediction reads exactly the same set
    signature: str | None = None  # hash of the normalised row multiset (non-empty executed results only)
    reads_tables: bool = False  # the final SQL reads at least one table
    non_empty: bool = False  # the result has at least one row
    error: str | None = None  # why it did not execute (or why the gold failed)
    timed_out: bool = False
    over_cap: bool = False
    gold_error: str | None = None  # the gold SQL failed: no tier above "executable" is reachable
    write_attempt: bool = False  # the final SQL, or any SQL earlier in the episode, tried to write

    @classmethod
    def from_any(cls, value) -> ExecutionOutcome:
        """Accept an outcome or its ``dataclasses.asdict`` form (unknown keys ignored)."""
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise TypeError(f"expected an ExecutionOutcome or a dict, got {type(value).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in value.items() if k in names})


@dataclass
class RewardBreakdown:
    """One rollout's reward and its parts, for logging."""

    reward: float
    tier: str  # one of TIERS
    f1: float
    join: int
    consensus: int
    fallback: bool = False


# ---------------------------------------------------------------------------------------------------- normalisation


def normalise_cell(value):
    """A cell as the reward's F1 compares it: numbers as numbers (floats rounded to 6 places, integral ones as int),
    text and blobs exactly, NULL as None."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return value
        rounded = round(value, FLOAT_DIGITS)
        return int(rounded) if rounded.is_integer() else rounded
    return value


def _cells(rows) -> Counter:
    flat = (cell for row in rows for cell in row)
    return Counter(normalise_cell(cell) for cell in islice(flat, MAX_F1_CELLS))


def cell_f1(pred_cells: Counter, gold_cells: Counter) -> float:
    """F1 of two cell multisets (Counter intersection). Both empty: 1.0; exactly one empty: 0.0."""
    n_pred = sum(pred_cells.values())
    n_gold = sum(gold_cells.values())
    if n_pred == 0 and n_gold == 0:
        return 1.0
    if n_pred == 0 or n_gold == 0:
        return 0.0
    common = sum((pred_cells & gold_cells).values())
    return 2.0 * common / (n_pred + n_gold)


def result_signature(rows) -> str:
    """A hash of the normalised row multiset: equal for results with the same rows in any order."""
    normalised = sorted(repr(tuple(normalise_cell(c) for c in row)) for row in rows)
    digest = hashlib.sha1()
    for text in normalised:
        digest.update(text.encode("utf-8", "surrogatepass"))
        digest.update(b"\x00")
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------------- parsing


@cache
def _statement_types() -> tuple:
    from sqlglot import exp

    names = ("Query", "Values", "DDL", "DML", "Create", "Drop", "Alter", "Insert", "Update", "Delete", "Merge",
             "Command", "Pragma", "Transaction", "Commit", "Rollback", "Attach", "Detach", "Analyze", "Use", "Set",
             "Describe")
    return tuple(getattr(exp, name) for name in names if hasattr(exp, name))


def parses_as_sql(sql, dialect: str = "sqlite") -> bool:
    """True when ``sql`` parses (sqlglot; the engine's dialect) into statements, not a bare expression."""
    if not isinstance(sql, str) or not sql.strip():
        return False
    import sqlglot
    from sqlglot.errors import SqlglotError

    logger = logging.getLogger("sqlglot")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        expressions = sqlglot.parse(sql, read=dialect)
    except (SqlglotError, ValueError, RecursionError):
        return False
    finally:
        logger.setLevel(level)
    statements = [e for e in expressions if e is not None]
    return bool(statements) and all(isinstance(e, _statement_types()) for e in statements)


def _tables(sql: str, dialect: str = "sqlite") -> frozenset[str]:
    from t2s.env.schema import tables_in_sql

    try:
        return frozenset(tables_in_sql(sql, dialect))
    except Exception:  # unparsable SQL reads no table we can name
        return frozenset()


# ---------------------------------------------------------------------------------------------------- execution


@dataclass(frozen=True)
class _GoldFeatures:
    result: object  # databases.QueryResult
    cells: Counter
    tables: frozenset[str]


_GOLD_FEATURES_MAX = 512
_gold_features_cache: OrderedDict = OrderedDict()
_gold_features_lock = threading.Lock()


def _gold_features(ref, gold_sql: str) -> _GoldFeatures:
    """The gold result with its cell multiset and tables, computed once per (database, gold SQL).

    Gold timeouts are not kept (as in ``databases.gold_result``), so a loaded machine does not fix a failure.
    """
    from t2s.env import databases

    key = (ref, gold_sql)
    with _gold_features_lock:
        if key in _gold_features_cache:
            _gold_features_cache.move_to_end(key)
            return _gold_features_cache[key]
    result = databases.gold_result(ref, gold_sql)
    cells = _cells(result.rows) if result.ok and not result.over_cap else Counter()
    tables = _tables(gold_sql, databases.SQLGLOT_DIALECTS.get(ref.engine, "sqlite"))
    features = _GoldFeatures(result=result, cells=cells, tables=tables)
    if not result.timed_out:
        with _gold_features_lock:
            _gold_features_cache[key] = features
            while len(_gold_features_cache) > _GOLD_FEATURES_MAX:
                _gold_features_cache.popitem(last=False)
    return features


def execute_final(row: dict, final_sql, *, episode_write_attempt: bool = False) -> ExecutionOutcome:
    """Execute one episode's final SQL against ``row``'s database and compare it with the (cached) gold result.

    ``episode_write_attempt``: an earlier SQL of the episode was a write attempt (for the sibling reward).
    Never raises on bad SQL; the outcome says what happened.
    """
    from t2s.env import databases

    question_id = row.get("question_id")
    outcome = ExecutionOutcome(
        question_id=None if question_id is None else str(question_id),
        final_sql=final_sql if isinstance(final_sql, str) else None,
        write_attempt=bool(episode_write_attempt),
    )
    if not isinstance(final_sql, str) or not final_sql.strip():
        outcome.error = "Error: no final SQL"
        return outcome
    longest = databases.limits.LIMITS.max_sql_length
    if len(final_sql) > longest:  # no engine runs it; nor is it parsed (sqlglot's time grows with its length)
        outcome.error = f"Error: the SQL is longer than {longest} characters"
        return outcome
    ref = databases.ref_from_row(row)
    dialect = databases.SQLGLOT_DIALECTS.get(ref.engine, "sqlite")  # sqlglot's name for the SQL of ref's engine
    outcome.parses = parses_as_sql(final_sql, dialect)
    gold = _gold_features(ref, row["gold_sql"])
    if not gold.result.ok or gold.result.timed_out or gold.result.over_cap:
        outcome.gold_error = gold.result.error or ("Error: gold over the scoring cap" if gold.result.over_cap
                                                   else "Error: gold timed out")
    pred = databases.run_scoring_query(ref, final_sql, timeout=databases.scoring_timeout(gold.result.seconds))
    outcome.write_attempt = outcome.write_attempt or bool(pred.write_attempt)
    outcome.timed_out = bool(pred.timed_out)
    outcome.over_cap = bool(pred.over_cap)
    if pred.error is not None or pred.timed_out:
        outcome.error = pred.error or "Error: the query timed out"
        return outcome
    outcome.executes = True
    outcome.non_empty = bool(pred.rows)
    pred_tables = _tables(final_sql, dialect)
    outcome.reads_tables = bool(pred_tables)
    outcome.join = len(gold.tables) >= 2 and pred_tables == gold.tables
    if pred.over_cap:  # never equivalent, F1 0, no consensus signature
        outcome.error = "Error: the result is over the scoring cap"
        return outcome
    if outcome.gold_error is None:
        outcome.equivalent = official_match(pred.rows, gold.result.rows)
        outcome.f1 = cell_f1(_cells(pred.rows), gold.cells)
    if outcome.non_empty:
        outcome.signature = result_signature(pred.rows)
    return outcome


# ---------------------------------------------------------------------------------------------------- combining


def _consensus_signature(group: Sequence[ExecutionOutcome]) -> str | None:
    """The most frequent eligible result of a group, if shared by >= 2 rollouts and not tied; else None."""
    counts = Counter(
        o.signature for o in group
        if o.executes and o.non_empty and o.f1 > 0 and o.reads_tables and o.signature is not None
    )
    if not counts:
        return None
    ranked = counts.most_common(2)
    best, best_count = ranked[0]
    if best_count < 2 or (len(ranked) > 1 and ranked[1][1] == best_count):
        return None
    return best


def _groups(n: int, group_size: int | None, group_ids: Sequence | None) -> list[list[int]]:
    if group_ids is not None:
        if len(group_ids) != n:
            raise ValueError(f"{len(group_ids)} group ids for {n} outcomes")
        by_id: dict = {}
        for index, gid in enumerate(group_ids):
            by_id.setdefault(gid, []).append(index)
        return list(by_id.values())
    if not group_size or group_size < 1 or n % group_size:
        raise ValueError(f"{n} outcomes do not split into groups of {group_size}")
    return [list(range(start, start + group_size)) for start in range(0, n, group_size)]


def dense_rewards(
    outcomes: Sequence,
    group_size: int | None,
    *,
    fallback: Sequence[bool] | None = None,
    settings: RewardSettings | None = None,
    group_ids: Sequence | None = None,
) -> list[RewardBreakdown]:
    """The dense reward of each outcome, with consensus computed over each group.

    Groups are consecutive runs of ``group_size`` outcomes, or the outcomes sharing an id in ``group_ids``.
    ``fallback[i]`` says the i-th final SQL came from the fallback; its reward is scaled by
    ``settings.fallback_reward_scale``.
    """
    settings = settings or RewardSettings()
    items = [ExecutionOutcome.from_any(o) for o in outcomes]
    flags = [bool(f) for f in fallback] if fallback is not None else [False] * len(items)
    if len(flags) != len(items):
        raise ValueError(f"{len(flags)} fallback flags for {len(items)} outcomes")
    out: list[RewardBreakdown | None] = [None] * len(items)
    for members in _groups(len(items), group_size, group_ids):
        agreed = _consensus_signature([items[i] for i in members])
        for i in members:
            o = items[i]
            consensus = int(agreed is not None and o.signature == agreed and o.executes and o.non_empty
                            and o.f1 > 0 and o.reads_tables)
            join = int(o.join)
            f1 = float(o.f1)
            if o.executes and o.equivalent and not o.over_cap:
                tier, reward = "equivalent", settings.equivalent
            elif o.executes:
                tier = "executable"
                reward = (settings.executes_floor + settings.f1_weight * f1 + settings.join_weight * join
                          + settings.consensus_weight * consensus)
            elif o.parses:
                tier, reward = "parsable", settings.parses_credit
            else:
                tier, reward = "invalid", 0.0
            if flags[i]:
                reward *= settings.fallback_reward_scale
            out[i] = RewardBreakdown(reward=reward, tier=tier, f1=f1, join=join, consensus=consensus,
                                     fallback=flags[i])
    return out  # type: ignore[return-value]


def sibling_reward(outcome) -> float:
    """The sibling recipe's reward: -1.0 for a write attempt anywhere in the episode, else 1.0 match, 0.1 runs, 0.0."""
    o = ExecutionOutcome.from_any(outcome)
    if o.write_attempt:
        return -1.0
    if o.executes and o.equivalent and not o.over_cap:
        return 1.0
    if o.executes:
        return 0.1
    return 0.0


def sibling_rewards(outcomes: Sequence) -> list[float]:
    return [sibling_reward(o) for o in outcomes]


# ---------------------------------------------------------------------------------------------------- TRL functions


def _is_fallback(source) -> bool:
    return isinstance(source, str) and source.startswith("fallback")


def _log_dense(log_metric: Callable, breakdowns: list[RewardBreakdown], lengths) -> None:
    """``rewards/dense/<component>`` and ``tier/<tier>`` (TRL logs ``frac_reward_zero_std``, the groups whose
    rollouts all scored the same)."""
    n = len(breakdowns)
    if n == 0:
        return
    log_metric("rewards/dense/f1", sum(b.f1 for b in breakdowns) / n)
    log_metric("rewards/dense/join", sum(b.join for b in breakdowns) / n)
    log_metric("rewards/dense/consensus", sum(b.consensus for b in breakdowns) / n)
    log_metric("rewards/dense/fallback_rate", sum(b.fallback for b in breakdowns) / n)
    for tier in TIERS:
        members = [i for i, b in enumerate(breakdowns) if b.tier == tier]
        log_metric(f"tier/{tier}", len(members) / n)
        if members:
            log_metric(f"tier/{tier}/fallback_rate", sum(breakdowns[i].fallback for i in members) / len(members))
            if lengths is not None:
                log_metric(f"tier/{tier}/length", sum(lengths[i] for i in members) / len(members))


def make_dense_reward(settings: RewardSettings | None = None, *, group_size: int | None = None) -> Callable:
    """A TRL reward function for the dense reward (named ``dense``, so TRL logs ``rewards/dense/...``)."""
    settings = settings or RewardSettings()

    def dense(prompts, completions, completion_ids=None, **kwargs) -> list[float]:
        """TRL reward function: the dense reward (docs/design.md §6).

        Reads these per-episode extras from ``kwargs`` (one entry per completion, in rollout order):
        - ``outcome``: ``dataclasses.asdict(ExecutionOutcome)`` (or the outcome itself), required;
        - ``final_sql_source``: the episode record's ``final_sql_source``; values starting ``"fallback"`` mark the
          fallback, whose reward is scaled by ``fallback_reward_scale``; optional;
        - ``group_id``: rollouts sharing an id form one group for consensus; optional. Without it, groups are runs
          of ``group_size`` (or ``kwargs["num_generations"]``) consecutive completions; failing both, runs of the
          same ``outcome["question_id"]``.
        Logs each component (``rewards/dense/f1``, ...), the tier mix, length and fallback rate per tier through
        ``kwargs["log_metric"]`` when present, and each episode's ``tier``, ``f1``, ``join`` and ``consensus`` with
        the completions through ``kwargs["log_extra"]``.
        """
        outcomes = [ExecutionOutcome.from_any(o) for o in kwargs["outcome"]]
        sources = kwargs.get("final_sql_source")
        fallback = [_is_fallback(s) for s in sources] if sources is not None else None
        group_ids = kwargs.get("group_id")
        size = group_size or kwargs.get("num_generations")
        if group_ids is None and not size:
            group_ids, current, previous = [], -1, object()
            for o in outcomes:  # runs of the same question
                if o.question_id != previous:
                    current, previous = current + 1, o.question_id
                group_ids.append(current)
        breakdowns = dense_rewards(outcomes, size, fallback=fallback, settings=settings, group_ids=group_ids)
        log_metric = kwargs.get("log_metric")
        if log_metric is not None:
            lengths = [len(ids) for ids in completion_ids] if completion_ids is not None else None
            _log_dense(log_metric, breakdowns, lengths)
        log_extra = kwargs.get("log_extra")
        if log_extra is not None:
            for column in ("tier", "f1", "join", "consensus"):
                log_extra(column, [getattr(b, column) for b in breakdowns])
        return [b.reward for b in breakdowns]

    return dense


def sibling(prompts, completions, completion_ids=None, **kwargs) -> list[float]:
    """TRL reward function: the sibling recipe's reward (1.0 / 0.1 / 0.0, -1.0 for any write attempt).

    Reads the per-episode extra ``outcome`` (``dataclasses.asdict(ExecutionOutcome)``), whose ``write_attempt`` covers
    the final SQL and every earlier SQL of the episode. Logs ``rewards/sibling/write_attempt_rate`` when ``log_metric``
    is given.
    """
    outcomes = [ExecutionOutcome.from_any(o) for o in kwargs["outcome"]]
    rewards = sibling_rewards(outcomes)
    log_metric = kwargs.get("log_metric")
    if log_metric is not None and outcomes:
        log_metric("rewards/sibling/write_attempt_rate", sum(o.write_attempt for o in outcomes) / len(outcomes))
    return rewards


REWARD_FUNCS: dict[str, Callable] = {"dense": make_dense_reward(), "sibling": sibling}
