"""Token accounting shared by every episode the driver plays: the first generation prompt (``first_prompt_ids``) and
the environment's tokens between two model turns (``EnvTokenCounter``)."""

from __future__ import annotations

import contextlib

from t2s.env import native_calls, protocol
from t2s.env.episode import Episode


class EnvTokenCounter:
    """``observation -> number of environment tokens carrying it`` (an upper bound: the end of turn that closes the
    model's turn is counted as if the environment had to add it). ``suffix_ids`` then gives the suffix actually added,
    reusing the observation's tokens, so each observation is tokenized once. ``lock`` guards a shared tokenizer."""

    def __init__(self, tokenizer, enable_thinking: bool = True, lock=None):
        self.tokenizer, self.enable_thinking = tokenizer, enable_thinking
        self.lock = lock if lock is not None else contextlib.nullcontext()
        self._last: tuple[str | None, list[int] | None] = (None, None)  # the observation last seen, its own tokens

    def __call__(self, observation: str) -> int:
        return len(self.suffix_ids(observation, needs_end_of_turn=True))

    def suffix_ids(self, observation: str, *, needs_end_of_turn: bool) -> list[int]:
        """The environment's tokens between two model turns carrying ``observation`` (``protocol.env_suffix_ids``;
        a native observation's messages as the chat template renders them, ``native_calls.suffix_ids``)."""
        if isinstance(observation, native_calls.Observation):
            with self.lock:
                return native_calls.suffix_ids(self.tokenizer, observation.messages,
                                               needs_end_of_turn=needs_end_of_turn,
                                               enable_thinking=self.enable_thinking)
        last, body = self._last
        with self.lock:
            if last != observation:
                body = protocol.observation_ids(self.tokenizer, observation)
            suffix = protocol.env_suffix_ids(self.tokenizer, observation, needs_end_of_turn=needs_end_of_turn,
                                             enable_thinking=self.enable_thinking, body_ids=body)
        self._last = (observation, body)
        return suffix


def first_prompt_ids(tokenizer, episode: Episode) -> list[int]:
    """The first generation prompt as a rollout sends it: the episode's messages (and, in the native format, its
    tools) rendered by the chat template."""
    return protocol.generation_prompt_ids(tokenizer, episode.messages, episode.config.enable_thinking, episode.tools)
