"""What a rollout leaves: each episode's ``EpisodeTrace`` (its raw token stream, logprobs, ``env_mask``, record and
outcome), and ``to_trl``, the batch of traces TRL's ``rollout_func`` returns."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Sequence

from t2s.env.record import EpisodeRecord


@dataclass
class EpisodeTrace:
    """One episode's token stream and results. ``completion_ids``, ``logprobs`` and ``env_mask`` align."""

    index: int
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    record: EpisodeRecord | None = None  # set when the episode finishes
    outcome: Any = None  # what the scorer returned (rewards.ExecutionOutcome by default), None when not scored
    assistant_texts: list[str] = field(default_factory=list)  # what Episode.step received, turn by turn
    env_texts: list[str] = field(default_factory=list)  # the decoded environment segments, in order
    finish_reasons: list[str] = field(default_factory=list)
    error: str | None = None  # a generation failure that ended the episode
    unreachable: bool = False  # that failure: no server answered (TurnOutput.unreachable)

    def check(self, end_of_turn_id: int | None = None) -> None:
        n = len(self.completion_ids)
        if len(self.logprobs) != n or len(self.env_mask) != n:
            raise AssertionError(
                f"episode {self.index}: {n} completion ids, {len(self.logprobs)} logprobs, {len(self.env_mask)} mask"
            )
        if end_of_turn_id is not None and n and self.completion_ids[-1] != end_of_turn_id:
            raise AssertionError(f"episode {self.index}: the trajectory does not end on the end-of-turn token")


def outcome_dict(outcome) -> dict | None:
    if outcome is None or isinstance(outcome, dict):
        return outcome
    if dataclasses.is_dataclass(outcome):
        return dataclasses.asdict(outcome)
    raise TypeError(f"a scorer must return a dataclass or a dict, got {type(outcome).__name__}")


def to_trl(traces: Sequence[EpisodeTrace], end_of_turn_id: int | None = None) -> dict:
    """The dict TRL's ``rollout_func`` returns: the token stream (``prompt_ids``, ``completion_ids``, float
    ``logprobs``, ``env_mask``) and, one per episode, only what the rewards and the trainer read: ``outcome`` (a dict,
    or None when not scored) and ``final_sql_source`` for the rewards, ``record`` (the ``EpisodeRecord``) for the
    trainer's episode metrics.
    """
    for trace in traces:
        trace.check(end_of_turn_id)
    out: dict[str, list] = {
        "prompt_ids": [list(t.prompt_ids) for t in traces],
        "completion_ids": [list(t.completion_ids) for t in traces],
        "logprobs": [[float(x) for x in t.logprobs] for t in traces],
        "env_mask": [list(t.env_mask) for t in traces],
        "record": [t.record for t in traces],
        "final_sql_source": [t.record.final_sql_source for t in traces],
        "outcome": [outcome_dict(t.outcome) for t in traces],
    }
    n = len(traces)
    assert all(len(v) == n for v in out.values()), "every rollout field has one entry per episode"
    for ids, lps, mask in zip(out["completion_ids"], out["logprobs"], out["env_mask"]):
        assert len(ids) == len(lps) == len(mask), "completion_ids, logprobs and env_mask align"
    return out

