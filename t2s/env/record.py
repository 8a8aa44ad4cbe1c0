"""The episode record (DESIGN §10): what one played episode leaves behind, typed, and its one JSON form.

Every way of playing builds it here: ``Episode.record()`` for every episode (the one-turn ``single`` mode included),
:func:`one_turn_record` for an episode that could not be played.
:meth:`EpisodeRecord.to_json` is the only serialiser: ``episodes.jsonl``, ``ask --json`` and the transcripts read its
keys (``RECORD_KEYS``, in that order).

``stop_reason`` says why the episode ended (``STOP_REASONS``). ``prompt_tokens`` is the first prompt's length in
tokens (0 where nothing counted tokens: scripted play without a tokenizer, chat endpoints without one).
"""

from __future__ import annotations

from dataclasses import dataclass, field

RECORD_KEYS = ("question_id", "db_id", "mode", "turns", "final_sql", "final_sql_source", "submitted_sql", "counters",
               "stop_reason", "prompt_tokens")
COUNTER_KEYS = (
    "turns", "calls", "tool_errors", "format_deviations", "write_attempts", "turn_cutoffs",
    "submitted", "forced", "fallback_used", "truncated",
)  # fmt: skip
FLAG_COUNTERS = ("submitted", "forced", "fallback_used", "truncated")  # recorded as booleans

# Why an episode ended: the reason, and what it means.
STOP_REASONS = {
    "submitted": "the model submitted its SQL",
    "turn_limit": "the tool turns ran out; the forced final turn followed",
    "failed_queries": "too many queries in a row failed; the forced final turn followed",
    "tool_time": "the tool time budget ran out; the forced final turn followed",
    "budget": "the token budget ran out",
    "prompt_too_long": "the prompt left less than min_episode_tokens of the budget: no turn was played",
    "error": "the environment or the generation backend failed",
    "no_answer": "a one-turn answer (or a prediction) with no SQL in it",
    "stopped": "ended by its caller",
}


@dataclass(frozen=True)
class EpisodeRecord:
    """One episode's record. ``turns`` holds ``{"assistant", "calls", "observation"}`` per turn; ``counters`` holds
    ``COUNTER_KEYS`` (the four flags as booleans); ``error`` is set when the episode could not be played at all."""

    question_id: str | int | None
    db_id: str | None
    mode: str
    turns: list[dict]
    final_sql: str | None
    final_sql_source: str  # submitted, forced, fallback or none
    submitted_sql: str | None
    counters: dict
    stop_reason: str
    prompt_tokens: int = 0
    error: str | None = field(default=None)

    def __post_init__(self) -> None:
        if self.stop_reason not in STOP_REASONS:
            raise ValueError(f"unknown stop reason {self.stop_reason!r}; expected one of {', '.join(STOP_REASONS)}")

    @property
    def played_no_turn(self) -> bool:
        """The episode ended before its first turn (its prompt left too little of the budget)."""
        return self.stop_reason == "prompt_too_long"

    def to_json(self) -> dict:
        """The record as ``episodes.jsonl`` holds it: ``RECORD_KEYS`` in order, then ``error`` when set."""
        out = {
            "question_id": self.question_id,
            "db_id": self.db_id,
            "mode": self.mode,
            "turns": [dict(turn) for turn in self.turns],
            "final_sql": self.final_sql,
            "final_sql_source": self.final_sql_source,
            "submitted_sql": self.submitted_sql,
            "counters": dict(self.counters),
            "stop_reason": self.stop_reason,
            "prompt_tokens": self.prompt_tokens,
        }
        if self.error is not None:
            out["error"] = self.error
        return out


def counters(**values) -> dict:
    """Every counter at 0 (the flags False), with ``values`` set on top."""
    out = dict.fromkeys(COUNTER_KEYS, 0)
    out.update(dict.fromkeys(FLAG_COUNTERS, False))
    out.update(values)
    for flag in FLAG_COUNTERS:
        out[flag] = bool(out[flag])
    return out


def one_turn_record(row: dict, mode: str, text: str | None, sql: str | None, *, deviations: int = 0,
                    cut_off: bool = False, prompt_tokens: int = 0, stop_reason: str | None = None,
                    error: str | None = None) -> EpisodeRecord:
    """The record of an answer given in one turn (``text``, None when no turn was played) whose SQL is ``sql``."""
    if stop_reason is None:
        stop_reason = "submitted" if sql is not None else "no_answer"
    return EpisodeRecord(
        question_id=row.get("question_id"), db_id=row.get("db_id"), mode=mode,
        turns=[] if text is None else [{"assistant": text, "calls": [], "observation": ""}],
        final_sql=sql, final_sql_source="submitted" if sql is not None else "none", submitted_sql=sql,
        counters=counters(turns=1 if text is not None else 0, format_deviations=deviations, turn_cutoffs=int(cut_off),
                          submitted=sql is not None),
        stop_reason=stop_reason, prompt_tokens=prompt_tokens, error=error,
    )  # fmt: skip


def no_turn_line(count: int, total: int, longest_prompt: int, budget: int, min_episode_tokens: int) -> str:
    """One line on the ``count`` of ``total`` episodes that ended before their first turn, and why."""
    tail = f"less than min_episode_tokens ({min_episode_tokens}) of the episode token budget ({budget})"
    if total == 1:
        prompt = f"its prompt of {longest_prompt} tokens" if longest_prompt else "its prompt"
        return f"the episode ended before its first turn: {prompt} left {tail}"
    prompt = f"prompts of up to {longest_prompt} tokens" if longest_prompt else "their prompts"
    every = "every one of" if count == total else f"{count} of"
    return f"{every} {total} episodes ended before their first turn: {prompt} left {tail}"
