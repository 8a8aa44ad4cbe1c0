"""Playing an episode turn by turn with a text policy (``policy(episode) -> str``), the way scripted policies, ``ask
--replay`` and the tests do; with a tokenizer, turns and the environment's suffixes are counted in tokens
(``EnvTokenCounter``) and a turn longer than the episode allows is cut."""

from __future__ import annotations

import contextlib

from t2s.env import native_calls, protocol
from t2s.env import turns
from t2s.env.chat_format import chat_format
from t2s.env.episode import Episode, EpisodeConfig
from t2s.env.native_reader import special_tokens_of
from t2s.env.record import EpisodeRecord
from t2s.env.turns import ParsedTurn


def run_text_episode(row: dict, config: EpisodeConfig | None, policy, db=None, tokenizer=None, *,
                     schema=None) -> EpisodeRecord:
    """Play one episode with a text policy (``policy(episode) -> str``); returns the record.

    With a tokenizer, turns and environment suffixes are counted in tokens, and a turn longer than the episode allows
    is cut; without one, only the turn and tool budgets apply.
    """
    episode = Episode(row, config, db, schema=schema)
    return play(episode, policy, tokenizer).record()


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


def env_token_counter(tokenizer, enable_thinking: bool = True) -> EnvTokenCounter:
    """The counter ``Episode(env_tokens=...)`` takes when turns are counted with ``tokenizer``."""
    return EnvTokenCounter(tokenizer, enable_thinking)


def first_prompt_ids(tokenizer, episode: Episode) -> list[int]:
    """The first generation prompt as a rollout sends it: the episode's messages (and, in the native format, its
    tools) rendered by the chat template."""
    return protocol.generation_prompt_ids(tokenizer, episode.messages, episode.config.enable_thinking, episode.tools)


def play(episode: Episode, policy, tokenizer=None) -> Episode:
    """Drive ``episode`` to its end with ``policy``; returns the episode.

    ``policy(episode)`` returns a turn's text, or a ``ParsedTurn`` when a server already read its calls."""
    if tokenizer is not None:
        episode.config = chat_format(tokenizer).episode_config(episode.config)  # as the template can play it
    cfg = episode.config
    if tokenizer is not None:
        episode.special_tokens = special_tokens_of(tokenizer)
        if episode.env_tokens is None:
            episode.env_tokens = env_token_counter(tokenizer, cfg.enable_thinking)
        counter = episode.env_tokens  # the suffixes added are the ones counted, when the counter is ours
        if not isinstance(counter, EnvTokenCounter):
            counter = env_token_counter(tokenizer, cfg.enable_thinking)
        episode.start(len(first_prompt_ids(tokenizer, episode)))
    else:
        episode.start(0)
    while not episode.done:
        max_tokens = episode.next_max_tokens()
        if episode.done:
            break
        text = policy(episode)
        parsed = None
        if isinstance(text, ParsedTurn):  # a turn a server read already (endpoint mode tools): counted, never cut
            parsed, text = text, text.text
        text = turns.valid_text(text) if isinstance(text, str) else ""
        n_tokens, cut_off = 0, False
        if parsed is not None:
            cut_off = getattr(policy, "finish_reasons", [""])[-1:] == ["length"]
            if tokenizer is not None:
                n_tokens = len(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]) + 1
        elif tokenizer is not None:
            ids = tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
            if len(ids) + 1 > max_tokens:  # +1: the end-of-turn token that closes the turn
                ids = ids[:max_tokens]
                text = tokenizer.decode(ids)
                n_tokens, cut_off = len(ids), True
            else:
                n_tokens = len(ids) + 1
        observation = episode.step(text, n_tokens=n_tokens, cut_off=cut_off, parsed=parsed)
        if observation is None:
            break
        if tokenizer is not None:
            episode.add_env_tokens(len(counter.suffix_ids(observation, needs_end_of_turn=cut_off)))
    return episode
