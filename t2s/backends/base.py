"""What every generation backend shares: sampling settings, one turn's output, and the backend protocol.

A backend turns token-id prompts into one assistant turn each. It never sees text, messages or episodes: the rollout
(``t2s.rollout.driver``) owns the token stream. Two call shapes exist:

- ``generate(prompts, max_tokens, sampling)``: a turn-synchronous batch (vLLM colocate, transformers);
- ``await agenerate(prompt_ids, max_tokens, sampling)``: one request in an episode's own chain (vLLM server).

Every backend stops on the chat template's stop tokens (``t2s.env.chat_format``: for Qwen3.5 ``<|im_end|>`` and
``<|endoftext|>``) and returns the sampled stop token inside ``token_ids`` with its logprob, as vLLM does. Logprobs
are those of the sampled tokens under ``log_softmax(logits / T)`` with no top-k/top-p, which is what the training
side recomputes (docs/design.md §8).
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol, Sequence, runtime_checkable

FinishReason = Literal["stop", "length", "error"]


@dataclass(frozen=True)
class SamplingSettings:
    """Sampling for one rollout. ``top_k`` 0 and ``top_p`` 1.0 mean off; ``seed`` None means unseeded.

    Engines fill a field a request leaves out from the checkpoint's ``generation_config.json`` (vLLM does), so every
    field but the seed goes into every request (``engine_fields``).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None

    @classmethod
    def training(cls, temperature: float = 1.0, seed: int | None = None) -> SamplingSettings:
        """The training sampler of docs/design.md §8: temperature only, so sampler logprobs match the trainer's."""
        return cls(temperature=temperature, seed=seed)

    @classmethod
    def evaluation(cls, seed: int | None = None) -> SamplingSettings:
        """The evaluation sampler of docs/design.md §8: T 0.6, top-p 0.95, top-k 20."""
        return cls(temperature=0.6, top_p=0.95, top_k=20, seed=seed)

    @property
    def truncates(self) -> bool:
        """True when top-k, top-p or min-p reshape the distribution (sampler logprobs then differ from training's)."""
        return self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0

    def as_dict(self) -> dict:
        return asdict(self)

    def engine_fields(self) -> dict:
        """Every sampling field except the seed, named as vLLM's requests and ``SamplingParams`` name them (top-k
        off is -1)."""
        fields = self.as_dict()
        del fields["seed"]
        fields["top_k"] = self.top_k if self.top_k > 0 else -1
        return fields

    def request_seed(self, episode_index: int, turn_index: int) -> int | None:
        """A distinct, reproducible seed per (episode, turn), or None when unseeded.

        One seed shared by every request would make the G rollouts of a group identical.
        """
        if self.seed is None:
            return None
        return (self.seed * 1_000_003 + episode_index * 7919 + turn_index) % (2**31 - 1)


@dataclass
class TurnOutput:
    """One generated assistant turn: the sampled ids (a sampled stop token included) and their logprobs.

    A text policy's turn (``t2s.rollout.text_policy``) also carries its ``text`` as written (the ids are its
    tokenization, empty without a tokenizer) and, when a server already read its calls, ``parsed``
    (a ``t2s.env.turns.ParsedTurn``)."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: FinishReason = "stop"
    stop_token_id: int | None = None  # the stop token the turn ended on (last of token_ids), else None
    error: str | None = None
    text: str | None = None  # the turn's text when a text policy wrote it; None: decode token_ids
    parsed: Any = None  # the turn's calls as a server read them (ParsedTurn), else None: the episode reads the text
    unreachable: bool = False  # with finish "error": no server answered (the retries spent), not a refused request

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(f"TurnOutput: {len(self.token_ids)} token ids but {len(self.logprobs)} logprobs")

    @classmethod
    def failed(cls, message: str, unreachable: bool = False) -> TurnOutput:
        return cls([], [], "error", None, message if message.startswith("Error:") else f"Error: {message}",
                   unreachable=unreachable)

    @property
    def stop_token(self) -> int | None:  # the contract's short name
        return self.stop_token_id


@runtime_checkable
class GenerationBackend(Protocol):
    """The interface the rollout drives. ``schedule`` is "async" (per-episode chains) or "turnsync" (batched turns)."""

    schedule: str
    stop_token_ids: list[int]

    def generate(
        self,
        prompts: list[list[int]],
        max_tokens: list[int],
        sampling: SamplingSettings,
        seeds: Sequence[int | None] | None = None,
    ) -> list[TurnOutput]: ...

    async def agenerate(
        self, prompt_ids: list[int], max_tokens: int, sampling: SamplingSettings, seed: int | None = None
    ) -> TurnOutput: ...


def stop_token_ids(tokenizer) -> list[int]:
    """The ids generation stops on, the template's end of turn first (``chat_format``; for Qwen3.5
    ``[<|im_end|>, <|endoftext|>]``); a ``ChatFormatError`` (a ValueError) for a template t2s cannot use."""
    from t2s.env.chat_format import chat_format

    return list(chat_format(tokenizer).stop_ids)


def finish_turn(
    token_ids: Sequence[int], logprobs: Sequence[float], max_tokens: int, stop_ids: Sequence[int]
) -> TurnOutput:
    """Cut raw sampled ids at the first stop token (kept) or at ``max_tokens``, and name the finish reason."""
    stops = set(stop_ids)
    limit = min(len(token_ids), max_tokens)
    for i in range(limit):
        if token_ids[i] in stops:
            return TurnOutput(list(token_ids[: i + 1]), [float(x) for x in logprobs[: i + 1]], "stop",
                              int(token_ids[i]))
    return TurnOutput(list(token_ids[:limit]), [float(x) for x in logprobs[:limit]], "length", None)


def engine_turn(
    token_ids: Sequence[int], logprobs: Sequence[float], finish_reason: str | None, max_tokens: int,
    stop_ids: Sequence[int],
) -> TurnOutput:
    """Normalise a vLLM completion: stop/length as vLLM reports them, anything else (abort, None) an error.

    vLLM keeps a sampled stop token in ``token_ids``; when an engine reports "stop" without one (a stop string, say),
    the turn still counts as stopped, with ``stop_token_id`` None, so the rollout closes it with an env end of turn.
    """
    if finish_reason not in ("stop", "length"):
        return TurnOutput.failed(f"the engine finished a request with {finish_reason!r}")
    turn = finish_turn(token_ids, logprobs, max_tokens, stop_ids)
    if finish_reason == "stop" and turn.finish_reason == "length" and len(turn.token_ids) < max_tokens:
        turn.finish_reason = "stop"
    return turn


class TurnSyncBackend:
    """Base for batch backends: ``generate`` checks the batch and calls ``_generate``; ``agenerate`` runs a batch of
    one in a worker thread so it never blocks an event loop."""

    schedule = "turnsync"
    stop_token_ids: list[int]

    def generate(
        self,
        prompts: list[list[int]],
        max_tokens: list[int],
        sampling: SamplingSettings,
        seeds: Sequence[int | None] | None = None,
    ) -> list[TurnOutput]:
        if len(prompts) != len(max_tokens):
            raise ValueError(f"{len(prompts)} prompts but {len(max_tokens)} max_tokens")
        if not prompts:
            return []
        seeds = list(seeds) if seeds is not None else [None] * len(prompts)
        return self._generate(prompts, max_tokens, sampling, seeds)

    def _generate(self, prompts, max_tokens, sampling, seeds) -> list[TurnOutput]:  # pragma: no cover - abstract
        raise NotImplementedError

    async def agenerate(self, prompt_ids, max_tokens, sampling, seed=None) -> TurnOutput:
        outputs = await asyncio.to_thread(self.generate, [list(prompt_ids)], [max_tokens], sampling, [seed])
        return outputs[0]
