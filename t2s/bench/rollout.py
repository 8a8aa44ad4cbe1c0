"""`python -m t2s bench rollout`: async vs turn-synchronous rollout scheduling on a serving simulator (DESIGN §11).

The simulator is a discrete-event model of a vLLM server, run on a **virtual clock**:

- one decode step is 10 ms and advances every running sequence by one token, with at most ``max_num_seqs`` (256)
  sequences running; requests over capacity wait in arrival order;
- a step processes at most 2048 tokens: the running sequences' decodes first, then prompt tokens of newly admitted
  requests (chunked prefill), so prefill costs one step per 2048 prompt tokens; a request's first token comes out
  of the step that finishes its prefill. With prefix caching (on, as ``make serve`` runs vLLM) only the tokens past a
  sequence's previous context, or past a first prompt already seen, are prefilled;
- per-turn lengths come from a seeded log-normal (median 300 tokens, sigma 0.75, capped at 2048), with 2 to 6 turns
  per episode. Turn *k* writes filler thinking up to its length, then real tool calls (the pinned calls of
  ``bench env``, spread over the turns, in the ``--dialect`` and ``--tool-format`` played); the last turn submits
  the gold SQL, so every episode should score correct.

The simulator knows an episode by its prompt, as a prefix cache would: a first request is the episode's first prompt
exactly as the rollout renders it (the chat template's ``tools=`` included in the native format), and every later
request of that episode extends it with the episode's first turn. Its turn index is the number of turns the simulator
has served that episode, so neither depends on how the environment's segments are rendered.

Everything else is real: the rollout code (``t2s.rollout.driver.Rollout``, both schedules), Episode, tools, SQLite on
``data/demo`` and scoring. Wall-clock time spent outside the simulator - tool calls, tokenisation, bookkeeping -
is added to the virtual clock where it happens: an episode's next request arrives at the virtual time its previous
turn returned plus the wall time it took to come back. The simulator only advances while every live episode is inside
it, so no request ever arrives in the simulator's past.

The critical path is the longest single episode, each episode run alone on an idle simulator. A schedule's time is the
virtual time of its last simulator event plus the wall time from then until the rollout returned. The last line is
``async_over_critical=<float> turnsync_over_critical=<float>``.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from t2s.bench.simulator import SimulatorSpec, SimulatorStats, EpisodePlan, ServingSimulator
from t2s.env.chat_format import chat_format


ROLLOUTS_PER_QUESTION = 8


@dataclass(frozen=True)
class LengthModel:
    median: int = 300
    sigma: float = 0.75
    cap: int = 2048
    min_turns: int = 2
    max_turns: int = 6


# ---------------------------------------------------------------------------------------------------------------
# What the simulated model writes


def plan_turns(row: dict, n_turns: int, lengths: list[int], tokenizer, marker: str, dialect: str = "exec_plan",
               tool_format: str = "json") -> list[list[int]]:
    """``n_turns`` assistant turns: the pinned bench-env calls spread over ``n_turns - 1`` tool turns, then submit.

    The calls are written in the dialect and call format the episodes play (``bench env``'s ``call_writer``). Each
    turn is filler thinking up to its sampled length, then ``</think>`` and its calls; a turn whose calls need more
    tokens than sampled is longer.
    """
    from t2s.bench.env import call_writer, workload_turns
    from t2s.env.databases import ref_from_row
    from t2s.env.schema import get_schema

    pinned = workload_turns(row, get_schema(ref_from_row(row)), dialect, tool_format)
    calls = [c for turn in pinned[:-1] for c in turn]
    tool_turns = n_turns - 1
    if len(calls) < tool_turns:
        calls += [call_writer(dialect, tool_format)("run_query", sql=row["gold_sql"])] * (tool_turns - len(calls))
    per_turn = [calls[round(i * len(calls) / tool_turns) : round((i + 1) * len(calls) / tool_turns)]
                for i in range(tool_turns)]
    per_turn.append(pinned[-1])
    end_of_turn = chat_format(tokenizer).end_of_turn_id
    filler = tokenizer(" plan", add_special_tokens=False)["input_ids"]
    head = tokenizer(f"Episode {marker}.", add_special_tokens=False)["input_ids"]
    turns = []
    for calls_text, length in zip(per_turn, lengths):
        text = "\n</think>\n\n" + "\n".join(calls_text)
        tail = tokenizer(text, add_special_tokens=False)["input_ids"] + [end_of_turn]
        pad = max(0, length - len(head) - len(tail))
        turns.append(head + (filler * (pad // max(1, len(filler)) + 1))[:pad] + tail)
    return turns


def build_plans(rows: list[dict], tokenizer, config, seed: int, lengths: LengthModel) -> list[EpisodePlan]:
    """One plan per row; its first prompt is the one the rollout sends (``tokens.first_prompt_ids``: in the native
    format the chat template declares the tools too)."""
    from t2s.env.episode import Episode
    from t2s.rollout.tokens import first_prompt_ids

    rng = random.Random(seed)
    plans = []
    for index, row in enumerate(rows):
        n_turns = rng.randint(lengths.min_turns, lengths.max_turns)
        sampled = [min(lengths.cap, max(1, round(rng.lognormvariate(math.log(lengths.median), lengths.sigma))))
                   for _ in range(n_turns)]  # fmt: skip
        turns = plan_turns(row, n_turns, sampled, tokenizer, f"e{index}", config.dialect, config.tool_format)
        plans.append(EpisodePlan(row, turns, tuple(first_prompt_ids(tokenizer, Episode(row, config)))))
    return plans


# ---------------------------------------------------------------------------------------------------------------
# The serving simulator


# ---------------------------------------------------------------------------------------------------------------
# Running the schedules


@dataclass
class ScheduleResult:
    name: str
    seconds: float
    stats: SimulatorStats
    turns: int = 0
    submitted: int = 0
    equivalent: int = 0
    extra: dict = field(default_factory=dict)


def run_schedule(name, plans, tokenizer, config, spec, workers, schedule) -> ScheduleResult:
    from t2s.rollout.driver import Rollout

    simulator = ServingSimulator(tokenizer, plans, spec, schedule)
    rollout = Rollout(simulator, tokenizer, config, tool_workers=workers, schedule=schedule,
                      on_finish=simulator.episode_finished)
    traces = rollout.run([p.row for p in plans])
    seconds = simulator.elapsed()
    result = ScheduleResult(name, seconds, simulator.stats)
    if simulator.live != 0 and schedule == "async":
        raise RuntimeError(f"{simulator.live} episodes never reported their end")
    result.turns = sum(t.record.counters["turns"] for t in traces)
    result.submitted = sum(bool(t.record.counters["submitted"]) for t in traces)
    result.equivalent = sum(bool(getattr(t.outcome, "equivalent", False)) for t in traces)
    return result


def critical_path(plans, tokenizer, config, spec, workers, progress=None) -> tuple[float, int]:
    """The longest single episode, each run alone on an idle simulator: (seconds, index)."""
    best, where = 0.0, -1
    for index, plan in enumerate(plans):
        seconds = run_schedule("solo", [plan], tokenizer, config, spec, workers, "async").seconds
        if seconds > best:
            best, where = seconds, index
        if progress is not None:
            progress()
    return best, where


def pick_rows(rows: list[dict], episodes: int, seed: int) -> list[dict]:
    questions = max(1, math.ceil(episodes / ROLLOUTS_PER_QUESTION))
    chosen = random.Random(seed).sample(rows, min(questions, len(rows)))
    repeated = [row for row in chosen for _ in range(ROLLOUTS_PER_QUESTION)]
    while len(repeated) < episodes:
        repeated += repeated
    return repeated[:episodes]


def measure(episodes: int = 144, seed: int = 0, data=None, prefix_caching: bool = True, workers=None, console=None,
            dialect: str = "exec_plan", tool_format: str = "json"):
    """Run the three measurements in a tool set and call format; returns (async, turnsync, critical seconds,
    critical index, plans)."""
    from rich.progress import Progress

    from t2s.data.loaders import load_json_rows
    from t2s.env.episode import EpisodeConfig
    from t2s.settings import DEMO_DIR
    from t2s.training.tiny_model import build_tokenizer

    tokenizer = build_tokenizer()
    rows = pick_rows(load_json_rows(data or DEMO_DIR / "dev.json"), episodes, seed)
    config = EpisodeConfig(dialect=dialect, tool_format=tool_format)
    spec = SimulatorSpec(prefix_caching=prefix_caching)
    plans = build_plans(rows, tokenizer, config, seed, LengthModel())
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("episodes alone (critical path)", total=len(plans) + 2)
        critical, where = critical_path(plans, tokenizer, config, spec, workers, lambda: progress.advance(task))
        progress.update(task, description="async schedule")
        async_result = run_schedule("async", plans, tokenizer, config, spec, workers, "async")
        progress.advance(task)
        progress.update(task, description="turn-synchronous schedule")
        turnsync_result = run_schedule("turn-sync", plans, tokenizer, config, spec, workers, "turnsync")
        progress.advance(task)
    return async_result, turnsync_result, critical, where, plans


def run(*, episodes=144, seed=0, data=None, no_prefix_cache=False, workers=None, dialect="exec_plan",
        tool_format="json") -> int:
    from rich.table import Table

    from t2s.settings import offline_environment

    offline_environment()
    if episodes < 1:
        print("Error: --n must be at least 1")
        return 2
    from t2s.ui.console import console as make_console, print_line, print_table

    console = make_console()
    try:
        async_r, turnsync_r, critical, where, plans = measure(
            episodes, seed, data, not no_prefix_cache, workers, console, dialect,
            tool_format,
        )
    except (OSError, ValueError) as exc:
        message = str(exc)
        print_line(message if message.startswith("Error:") else f"Error: {message}")
        return 1
    table = Table(
        title=f"Rollout scheduling: {len(plans)} episodes, {dialect} tools in {tool_format} calls, "
        "serving simulator (virtual clock)",
        caption="critical path: the longest episode run alone. seconds: virtual simulator time plus the real time "
        "episodes spent outside the simulator (outside s: summed over episodes)",
    )
    for column in ("schedule", "seconds", "x critical", "turns", "submitted", "correct", "steps", "mean running",
                   "outside s"):
        table.add_column(column, justify="right" if column != "schedule" else "left")
    table.add_row("critical path", f"{critical:.2f}", "1.000", "", "", "", "", "", "")
    for result in (async_r, turnsync_r):
        occupancy = result.stats.busy_seq_steps / max(1, result.stats.steps)
        table.add_row(
            result.name, f"{result.seconds:.2f}", f"{result.seconds / critical:.3f}", str(result.turns),
            f"{result.submitted}/{len(plans)}", f"{result.equivalent}/{len(plans)}", str(result.stats.steps),
            f"{occupancy:.1f}", f"{result.stats.outside_seconds:.2f}",
        )  # fmt: skip
    print_table(console, table)
    longest = plans[where]
    console.print(
        f"longest episode: question {longest.row['question_id']} with {len(longest.turns)} planned turns of "
        f"{[len(t) for t in longest.turns]} tokens; prefix caching {'on' if not no_prefix_cache else 'off'}"
    )
    print(f"async_over_critical={async_r.seconds / critical:.4f} "
          f"turnsync_over_critical={turnsync_r.seconds / critical:.4f}")
    return 0
