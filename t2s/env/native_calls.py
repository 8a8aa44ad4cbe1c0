"""The native tool-call format (docs/design.md §3): Qwen3.5's own tool calling, as its chat template declares it.

- The tools are declared through the chat template's ``tools=`` (``tool_schemas.function_schemas``).
- The model calls them as XML blocks after its thinking::

      <tool_call>
      <function=run_sql>
      <parameter=sql>
      SELECT 1
      </parameter>
      </function>
      </tool_call>

  ``parse_turn`` (``native_reader``) returns the calls, with the arguments, that vLLM's ``qwen3_xml`` tool parser
  returns for the same text, so a model is never rewarded in training for a call its server would drop. It scans in
  linear time (transformers' regex parser takes seconds on a few thousand spaces after ``<parameter=x>``, and
  minutes on twice that: it is not run on model output).
- Each call's result goes back as a ``role: "tool"`` message, one per call in call order, and the environment's own
  lines (errors not tied to a call, the budget line or the forced-turn message) as one ``user`` message after them.
  ``suffix_ids`` tokenises them exactly as the model's chat template renders them, appended to the raw token stream.
"""

from __future__ import annotations

import json

from t2s.env import protocol
from t2s.env.native_reader import (FUNCTION_CLOSE, FUNCTION_OPEN, PARAMETER_CLOSE, PARAMETER_OPEN, TOOL_CALL_CLOSE,
                                   TOOL_CALL_OPEN, parse_turn)  # noqa: F401 - parse_turn: read where it is written
from t2s.env.chat_format import chat_format
from t2s.env.protocol import OBSERVATION_CHAR_CAP, cap_text
MIN_RESULT_CHARS = 200  # a tool message keeps at least this much when the observation cap is reached
NOT_RUN = "Error: this call was not run."


class Observation(str):
    """An observation's text (as episode records show it) with the chat messages that carry it in the native format:
    one ``tool`` message per call of the turn, then one ``user`` message with the environment's own lines."""

    messages: list[dict]

    def __new__(cls, text: str, messages: list[dict]):
        obj = super().__new__(cls, text)
        obj.messages = messages
        return obj


# ----------------------------------------------------------------------------------------------------------------
# Writing calls


def _value_text(value) -> str:
    """A parameter value as the chat template writes it: objects and lists as JSON, anything else as text."""
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def render_call(name: str, args: dict | None = None) -> str:
    """One call in the native format, exactly as Qwen3.5's chat template renders an assistant ``tool_calls`` entry."""
    params = "".join(f"{PARAMETER_OPEN}{key}>\n{_value_text(value)}\n{PARAMETER_CLOSE}\n"
                     for key, value in (args or {}).items())
    return f"{TOOL_CALL_OPEN}\n{FUNCTION_OPEN}{name}>\n{params}{FUNCTION_CLOSE}\n{TOOL_CALL_CLOSE}"


def no_call_error(submit_tool: str) -> str:
    """The error a turn without any call gets (the call syntax is the template's or the server's to show)."""
    return ("Error: no tool call found. After your thinking, call one of the tools; "
            f"{submit_tool} with your final SQL ends the episode.")


# ----------------------------------------------------------------------------------------------------------------
# Observations


def observation(results: list, notes: list[str], tail: str, n_calls: int) -> Observation:
    """The native observation of a turn whose first ``n_calls`` calls get a tool message (the calls a turn may run):
    ``results`` are the tool results of the calls that ran (in order), ``notes`` the environment's lines not tied to a
    call (the calls past the cap among them), ``tail`` the budget line or forced message.

    Calls that did not run get ``NOT_RUN``. Tool messages share the observation cap: each keeps at least
    ``MIN_RESULT_CHARS``. The text (for records) is the json format's rendering of the same results.
    """
    messages = []
    room = OBSERVATION_CHAR_CAP
    for index in range(n_calls):
        content = results[index].text.strip() if index < len(results) else NOT_RUN
        content = cap_text(content, max(room, MIN_RESULT_CHARS))
        room -= len(content)
        messages.append({"role": "tool", "name": results[index].tool if index < len(results) else "",
                         "content": content})
    note = "\n\n".join([*notes, tail]).strip()
    messages.append({"role": "user", "content": note})
    text = protocol.render_observation([*results, *(("", line) for line in notes)], tail)
    return Observation(text, messages)


_SUFFIX_SHAPES: dict[tuple, list] = {}
_SENTINEL = "\x00t2s-{}\x00"  # survives the template's trim; never in a rendered template


def _suffix_pieces(tokenizer, roles: tuple[str, ...], enable_thinking: bool) -> list:
    """The template's text between an assistant turn's end of turn and the next generation prompt's end, for
    messages of these roles, rendered once per shape: a list of message slots (int) and ``(text, is an added token)``
    pieces of the template's own text."""
    key = (id(tokenizer), len(tokenizer), tokenizer.chat_template, roles, enable_thinking)
    pieces = _SUFFIX_SHAPES.get(key)
    if pieces is not None:
        return pieces
    assistant = _SENTINEL.format("assistant")
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                {"role": "assistant", "content": assistant,
                 "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {}}}]}]
    messages += [{"role": role, "content": _SENTINEL.format(i), **({"name": "f"} if role == "tool" else {})}
                 for i, role in enumerate(roles)]
    end_of_turn = chat_format(tokenizer).end_of_turn
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                             enable_thinking=enable_thinking)
    after = rendered.index(end_of_turn, rendered.index(assistant)) + len(end_of_turn)
    suffix = rendered[after:]
    added = sorted(tokenizer.get_added_vocab(), key=len, reverse=True)
    pieces = []
    for index in range(len(roles)):
        head, _, suffix = suffix.partition(_SENTINEL.format(index))
        pieces += [*_split_tokens(head, added), index]
    pieces += _split_tokens(suffix, added)
    _SUFFIX_SHAPES[key] = pieces
    return pieces


def _split_tokens(text: str, added: list[str]) -> list[tuple[str, bool]]:
    """``text`` as (piece, is an added token) pairs (template text is short: a plain scan)."""
    out: list[tuple[str, bool]] = []
    plain, pos = [], 0
    while pos < len(text):
        token = next((t for t in added if text.startswith(t, pos)), None)
        if token is None:
            plain.append(text[pos])
            pos += 1
            continue
        if plain:
            out.append(("".join(plain), False))
            plain = []
        out.append((token, True))
        pos += len(token)
    if plain:
        out.append(("".join(plain), False))
    return out


def suffix_ids(tokenizer, messages: list[dict], *, needs_end_of_turn: bool, enable_thinking: bool = True) -> list[int]:
    """The environment's tokens after a model turn, carrying ``messages``, exactly as the chat template renders them.

    The template's own tags become their tokens; the text between two tags (message contents with the template's
    line breaks around them) is tokenised as one piece without special-token parsing, which gives the ids a
    tokenisation of the whole rendered text gives, while a ``<|im_end|>`` inside a result stays plain text.
    """
    fmt = chat_format(tokenizer)
    pieces = _suffix_pieces(tokenizer, tuple(m["role"] for m in messages), fmt.thinking_for(enable_thinking))
    parts: list[tuple[str, bool]] = [(fmt.end_of_turn, True)] if needs_end_of_turn else []
    for piece in pieces:
        parts.append((str(messages[piece]["content"]).strip(), False) if isinstance(piece, int) else piece)
    ids: list[int] = []
    chunk: list[str] = []
    for text, is_token in parts + [("", True)]:
        if not is_token:
            chunk.append(text)
            continue
        if chunk:
            joined = "".join(chunk)
            if joined:
                ids += tokenizer(joined, add_special_tokens=False, split_special_tokens=True)["input_ids"]
            chunk = []
        if text:
            ids.append(tokenizer.convert_tokens_to_ids(text))
    return ids
