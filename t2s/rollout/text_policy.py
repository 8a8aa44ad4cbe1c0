"""Text policies, played by the episode driver (:class:`t2s.rollout.driver.Rollout`) like any other backend.

A text policy is ``policy(episode) -> str`` (one assistant turn: replayed or scripted turns, the gold policy, a chat
endpoint), or ``-> ParsedTurn`` when a server already read the turn's calls (a tools endpoint). A policy that talks to
a server keeps each turn's finish reason in ``policy.finish_reasons``; "length" means the server cut the turn.

:class:`TextPolicies` adapts them to the driver. Each turn becomes the ``TurnOutput`` a model would have produced:

- with a tokenizer, the text's tokens (special tokens in the text are not parsed) closed by the template's end of turn,
  with logprob 0.0; a turn longer than the episode allows is cut to its limit and decoded again, as a model's turn
  would have been; a turn a server read is counted, never cut;
- without one, no tokens: only the turn and tool budgets apply, and a server's cut still counts as a cut-off;
- either way, a turn (or a server's calls) longer than ``MAX_CHARS_PER_TOKEN`` characters for each token the turn may
  hold is cut there, without its calls, and counts as a cut-off: a server that ignores ``max_tokens`` cannot fill the
  run's memory and files.

The driver then builds the very token stream, environment tokens and ``env_mask`` a training rollout builds (the
warm start's examples are these streams). ``play`` and ``run_text_episode`` play one episode inline, on the calling
thread; ``Rollout(TextPolicies(policies, tokenizer, schedule="turnsync"), tokenizer, ...)`` plays many.
"""

from __future__ import annotations

from typing import Callable

from t2s.backends.base import TurnOutput
from t2s.env import turns
from t2s.env.episode import Episode, EpisodeConfig
from t2s.env.record import EpisodeRecord
from t2s.env.turns import ParsedTurn


MAX_CHARS_PER_TOKEN = 64  # generous: a token of any real vocabulary decodes to far fewer characters


class TextPolicies:
    """A driver backend whose turns are written by text policies: ``policies`` is one policy for every episode, or a
    list with one per row (by the row's index in the run). ``schedule``: "inline" (one episode after another on the
    calling thread) or "turnsync" (every episode's next turn each round, tools on the driver's thread pool)."""

    def __init__(self, policies, tokenizer=None, *, schedule: str = "inline"):
        if isinstance(policies, (list, tuple)):
            self._policy_of: Callable[[int], object] = list(policies).__getitem__
        else:
            self._policy_of = lambda index: policies
        self.tokenizer = tokenizer
        self.schedule = schedule
        self.end_of_turn_id: int | None = None
        if tokenizer is not None:
            from t2s.env.chat_format import chat_format

            self.end_of_turn_id = chat_format(tokenizer).end_of_turn_id

    def turn(self, index: int, episode: Episode, max_tokens: int) -> TurnOutput:
        """The next turn of episode ``index`` as a ``TurnOutput`` (see the module's docstring)."""
        policy = self._policy_of(index)
        written = policy(episode)
        parsed = written if isinstance(written, ParsedTurn) else None
        text = parsed.text if parsed is not None else written
        text = turns.valid_text(text) if isinstance(text, str) else ""
        server_cut = getattr(policy, "finish_reasons", [""])[-1:] == ["length"]
        reason = "length" if server_cut else "stop"
        cap = MAX_CHARS_PER_TOKEN * max(1, max_tokens)
        oversized = len(text) > cap or (parsed is not None and _calls_size(parsed, cap) > cap)  # no model writes so
        if oversized:  # much in a turn: a server ignoring max_tokens; cut as the turn limit cuts, without its calls
            text, parsed = text[:cap], None
        if self.tokenizer is None:
            return TurnOutput([], [], "length" if oversized else reason, None, text=text, parsed=parsed)
        ids = list(self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])
        if oversized or (parsed is None and len(ids) + 1 > max_tokens):  # +1: the end of turn that closes the turn
            ids = ids[:max_tokens]
            return TurnOutput(ids, [0.0] * len(ids), "length", None, text=self.tokenizer.decode(ids))
        if not server_cut:
            ids.append(self.end_of_turn_id)
        return TurnOutput(ids, [0.0] * len(ids), reason, None if server_cut else self.end_of_turn_id, text=text,
                          parsed=parsed)


def _calls_size(parsed: ParsedTurn, cap: int) -> int:
    """About how many characters a server-read turn's calls hold (more than ``cap`` when they cannot be measured)."""
    try:
        return sum(len(str(call.args)) + len(str(call.tool)) for call in parsed.calls)
    except (RecursionError, ValueError):  # nested past repr's reach, or an int too long to print
        return cap + 1


def play(episode: Episode, policy, tokenizer=None) -> Episode:
    """Drive ``episode`` to its end with the text policy ``policy`` through the driver, on the calling thread;
    returns the episode (its ``record()`` is the result). With a tokenizer, turns and the environment's suffixes are
    counted in tokens and a turn longer than the episode allows is cut."""
    from t2s.rollout.driver import Rollout

    rollout = Rollout(TextPolicies(policy, tokenizer), tokenizer, episode.config, score=False)
    rollout.play_episode(episode)
    return episode


def run_text_episode(row: dict, config: EpisodeConfig | None, policy, db=None, tokenizer=None, *,
                     schema=None) -> EpisodeRecord:
    """Play one episode of ``row`` with a text policy (see ``play``); returns its record."""
    return play(Episode(row, config, db, schema=schema), policy, tokenizer).record()
