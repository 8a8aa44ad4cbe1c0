"""The ``tools`` endpoint mode: any OpenAI-compatible chat server, through its own function calling.

Each request carries the dialect's function declarations as ``tools=[...]`` (``tool_schemas.function_schemas``) and
the conversation so far: the system and user messages, then each earlier assistant message as the server returned it
(``content`` and ``tool_calls``, without its reasoning) followed by one ``role: "tool"`` message per call
(``tool_call_id``) and the environment's user message (errors, the budget line or the forced-turn message). The answer
is read from ``choices[0].message``: its ``tool_calls`` are the turn's calls, and its ``content`` the answer when the
model calls nothing (bare SQL on the forced final turn). Arguments that are not valid JSON reach the tool as they are
(it answers with an argument error) and count as a ``bad_json`` format deviation; an unknown tool name gets the
toolbox's unknown-tool error. Requests, retries and concurrency are the ``chat`` mode's (``ChatEndpointClient``).

Like ``chat``, this re-renders history on the server, so its results are labelled not comparable with the published
figures.
"""

from __future__ import annotations

import json

from t2s.env import turns
from t2s.backends.base import SamplingSettings
from t2s.backends.chat_endpoint import ChatEndpointClient, ChatEndpointPolicy, assistant_text, message_text
from t2s.env.native_calls import NOT_RUN, Observation
from t2s.env.turns import ParsedTurn, ToolCall


def read_message(message: dict, enable_thinking: bool = True) -> tuple[ParsedTurn, list[dict]]:
    """(the turn as the episode reads it, the server's tool calls as they go back into the history).

    The turn's text is the reasoning, ``</think>``, the content, then each call as ``<tool_call>`` holding the
    server's ``{"name", "arguments"}`` (its arguments exactly as sent), so records show what the model asked for.
    """
    text = assistant_text(message, enable_thinking)
    end, body, kinds = turns.split_body(text, enable_thinking)
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raw_calls = []
    calls: list[ToolCall] = []
    history: list[dict] = []
    shown = []
    for index, raw in enumerate(raw_calls):
        function = raw.get("function") if isinstance(raw, dict) else None
        function = function if isinstance(function, dict) else {}
        name = function.get("name")
        name = turns.valid_text(name if isinstance(name, str) else str(name))
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            arguments = turns.valid_text(arguments)
        args = arguments
        if isinstance(arguments, str):
            try:  # decoded text holds no lone surrogate (a "\\ud800" escape) and nests at most MAX_JSON_DEPTH deep
                args = turns.tame_value(json.loads(arguments)) if arguments.strip() else {}
            except (ValueError, RecursionError):
                kinds.append("bad_json")  # the tool gets the text and answers with an argument error
        elif arguments is None:
            args, arguments = {}, "{}"
        else:
            args = turns.tame_value(arguments)
            arguments = json.dumps(args, ensure_ascii=False)
        calls.append(ToolCall(name, args))  # as sent: " submit " is an unknown tool here as in completions mode
        call_id = raw.get("id") if isinstance(raw, dict) and isinstance(raw.get("id"), str) else f"call_{index}"
        history.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
        shown.append(
            f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}\n</tool_call>")
    if shown:
        text = text + ("\n\n" if text.strip() else "") + "\n".join(shown)
    kinds = list(dict.fromkeys(kinds))
    parsed = ParsedTurn(calls, len(kinds), [], text, end, body, kinds)
    return parsed, history


def history_messages(episode, assistant_messages: list[dict]) -> list[dict]:
    """The conversation as the server reads it: initial messages, then for each turn the assistant message, one tool
    message per call (a call that did not run says so) and the environment's user message."""
    messages = [dict(m) for m in episode.messages]
    for turn, assistant in zip(episode.turns, assistant_messages):
        messages.append(assistant)
        observation = turn.get("observation")
        parts = observation.messages if isinstance(observation, Observation) else []
        results = [m["content"] for m in parts if m["role"] == "tool"]
        for index, call in enumerate(assistant.get("tool_calls", [])):
            content = results[index] if index < len(results) else NOT_RUN
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": content})
        messages += [{"role": "user", "content": m["content"]} for m in parts if m["role"] == "user"]
        if not parts and observation:
            messages.append({"role": "user", "content": str(observation)})
    return messages


class ToolsEndpointPolicy(ChatEndpointPolicy):
    """``policy(episode) -> ParsedTurn`` for ``play.play``: one chat request per turn with ``tools=``."""

    def __init__(self, client: ChatEndpointClient, sampling: SamplingSettings, *, seed: int | None = None):
        super().__init__(client, sampling, seed=seed)
        self.assistant_messages: list[dict] = []  # each turn's message as it goes back to the server

    def __call__(self, episode) -> ParsedTurn:
        max_tokens, seed = self.next_request(episode)
        messages = history_messages(episode, self.assistant_messages)
        message, finish, _ = self.client.complete_message(messages, max_tokens, self.sampling, seed,
                                                          tools=episode.tools)
        self.finish_reasons.append(finish)
        parsed, calls = read_message(message, self.client.enable_thinking)
        assistant = {"role": "assistant", "content": message_text(message.get("content"))}
        if calls:
            assistant["tool_calls"] = calls
        self.assistant_messages.append(assistant)
        return parsed
