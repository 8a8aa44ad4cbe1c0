"""The native tool-call format (DESIGN §3): Qwen3.5's own tool calling, as its chat template declares it.

- The tools are declared through the chat template's ``tools=`` (``tool_schemas.function_schemas``).
- The model calls them as XML blocks after its thinking::

      <tool_call>
      <function=run_sql>
      <parameter=sql>
      SELECT 1
      </parameter>
      </function>
      </tool_call>

  ``parse_turn`` reads them the way vLLM's ``qwen3_xml`` parser and transformers' Qwen3.5 response template do: a
  ``<tool_call>`` counts only when ``<function=NAME>`` follows it; a value is the text up to ``</parameter>``, with
  its surrounding whitespace removed (structural tags inside it are plain text); a call cut off before its closing tags
  still runs; an argument the tool declares as an integer is read as one when it is a number, and kept as text
  otherwise. It scans with ``str.find`` only, in linear time. (transformers' regex parser takes seconds on a few
  thousand spaces after ``<parameter=x>``, and minutes on twice that: it is not run on model output.)
- Each call's result goes back as a ``role: "tool"`` message, one per call in call order, and the environment's own
  lines (errors not tied to a call, the budget line or the forced-turn message) as one ``user`` message after them.
  ``suffix_ids`` tokenises them exactly as the model's chat template renders them, appended to the raw token stream.
"""

from __future__ import annotations

import json

from t2s.env import protocol
from t2s.env import turns
from t2s.env.protocol import IM_END, OBSERVATION_CHAR_CAP, cap_text
from t2s.env.turns import ParsedTurn, ToolCall

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
FUNCTION_OPEN, FUNCTION_CLOSE = "<function=", "</function>"
PARAMETER_OPEN, PARAMETER_CLOSE = "<parameter=", "</parameter>"
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
    params = "".join(f"{PARAMETER_OPEN}{key}>\n{_value_text(value)}\n{PARAMETER_CLOSE}\n" for key, value in (args or {}).items())
    return f"{TOOL_CALL_OPEN}\n{FUNCTION_OPEN}{name}>\n{params}{FUNCTION_CLOSE}\n{TOOL_CALL_CLOSE}"


def no_call_error(submit_tool: str) -> str:
    """The error a turn without any call gets (the call syntax is the template's or the server's to show)."""
    return f"Error: no tool call found. After your thinking, call one of the tools; {submit_tool} with your final SQL ends the episode."


# ----------------------------------------------------------------------------------------------------------------
# Reading calls


class _Finder:
    """``text.find(needle, pos)`` for positions that only move forward, each needle's answer reused until passed:
    every needle's occurrences are scanned once, so reading a turn stays linear whatever it holds."""

    def __init__(self, text: str):
        self.text = text
        self._found: dict[str, int] = {}

    def find(self, needle: str, pos: int) -> int:
        found = self._found.get(needle)
        if found is None or (0 <= found < pos):
            found = self.text.find(needle, pos)
            self._found[needle] = found
        return found

    def first(self, needles: tuple[str, ...], pos: int) -> int:
        """Where the earliest of ``needles`` starts at or after ``pos`` (the text's end when none does)."""
        hits = [at for at in (self.find(n, pos) for n in needles) if at >= 0]
        return min(hits) if hits else len(self.text)


def _skip_space(text: str, pos: int) -> int:
    end = len(text)
    while pos < end and text[pos].isspace():
        pos += 1
    return pos


def _integer_params(tools: list[dict] | None) -> dict[str, set[str]]:
    """``{tool: {argument declared as an integer}}`` from function schemas."""
    out: dict[str, set[str]] = {}
    for tool in tools or []:
        fn = tool.get("function", tool) if isinstance(tool, dict) else {}
        props = ((fn.get("parameters") or {}).get("properties") or {}) if isinstance(fn, dict) else {}
        out[fn.get("name")] = {k for k, v in props.items() if isinstance(v, dict) and v.get("type") == "integer"}
    return out


def _typed(value: str, integer: bool):
    """An argument declared as an integer is read as one when it is a number (as transformers' parser does)."""
    if integer:
        try:
            return int(value)
        except ValueError:
            return value
    return value


def parse_turn(text: str, expect_think: bool = True, tools: list[dict] | None = None) -> ParsedTurn:
    """Read the native tool calls of one assistant turn (linear time, never raises).

    As in the json format, calls are read after the last ``</think>`` (anywhere when there is none, a deviation), and
    every departure from the format is counted once per kind: ``prose`` (text beside the calls), ``not_a_call`` (a
    ``<tool_call>`` with no ``<function=NAME>``), ``unclosed_call`` (a missing ``</function>`` or ``</tool_call>``),
    ``call_text`` (stray text between parameters), ``call_spelling`` (a JSON call inside ``<tool_call>``, as Qwen3
    writes it) and ``bad_json`` (such a JSON call that does not decode). Several calls in one turn are the format's own.
    """
    if type(text) is not str:
        text = text if isinstance(text, str) else ""
    try:
        text = turns.valid_text(text)
        end, body, kinds = turns.split_body(text, expect_think)
        return _parse_body(text, end, body, kinds, _integer_params(tools))
    except Exception as exc:  # noqa: BLE001 - whatever the text, a turn is read as a deviation, never an exception
        kinds = ["unreadable_turn"]
        return ParsedTurn([], 1, [f"Error: the turn could not be read ({type(exc).__name__})."], text, -1, "", kinds)


def _parse_body(text: str, end: int, body: str, kinds: list[str], integers: dict[str, set[str]]) -> ParsedTurn:
    finder = _Finder(body)
    calls: list[ToolCall] = []
    errors: list[str] = []
    prose = False
    pos = 0
    while True:
        start = finder.find(TOOL_CALL_OPEN, pos)
        stop = start if start >= 0 else len(body)
        if not prose and body[pos:stop].strip():
            prose = True
        if start < 0:
            break
        inner = _skip_space(body, start + len(TOOL_CALL_OPEN))
        if body.startswith(FUNCTION_OPEN, inner):
            pos = _read_function(body, finder, inner, calls, kinds, integers)
        elif body.startswith("{", inner):
            pos = _read_json_call(body, finder, inner, calls, kinds)
        else:  # not a call (vLLM keeps it as text)
            kinds.append("not_a_call")
            errors.append(f"Error: a {TOOL_CALL_OPEN} without <function=NAME> was ignored.")
            pos = start + len(TOOL_CALL_OPEN)
            prose = True
    if prose and pos:  # text beside calls (a turn of plain text has no call at all: the episode says so)
        kinds.append("prose")
    if "bad_json" in kinds and not calls:
        errors.append("Error: the tool call is not valid JSON (it may be cut off).")
    kinds = list(dict.fromkeys(kinds))
    return ParsedTurn(calls, len(kinds), list(dict.fromkeys(errors)), text, end, body, kinds)


def _read_function(body: str, finder: _Finder, pos: int, calls: list, kinds: list, integers: dict) -> int:
    """Read ``<function=NAME>`` and its parameters from ``pos``; returns where reading goes on."""
    name_start = pos + len(FUNCTION_OPEN)
    name_end = finder.first((">", "\n"), name_start)
    name = body[name_start:name_end].strip()
    pos = name_end + 1 if body.startswith(">", name_end) else name_end
    ints = integers.get(name, ())
    args: dict = {}
    closed = False
    while True:
        pos = _skip_space(body, pos)
        if body.startswith(PARAMETER_OPEN, pos):
            key_start = pos + len(PARAMETER_OPEN)
            key_end = finder.first((">", "\n"), key_start)
            key = body[key_start:key_end].strip()
            value_start = key_end + 1 if body.startswith(">", key_end) else key_end
            value_end = finder.first((PARAMETER_CLOSE, FUNCTION_CLOSE, TOOL_CALL_CLOSE), value_start)
            args[key] = _typed(body[value_start:value_end].strip(), key in ints)
            pos = value_end
            if body.startswith(PARAMETER_CLOSE, pos):
                pos += len(PARAMETER_CLOSE)
            else:
                kinds.append("unclosed_call")
        elif body.startswith(FUNCTION_CLOSE, pos):
            pos += len(FUNCTION_CLOSE)
            closed = True
            break
        elif pos >= len(body) or body.startswith(TOOL_CALL_CLOSE, pos):
            break
        else:  # text that is no parameter: skipped up to the next tag
            kinds.append("call_text")
            pos = finder.first((PARAMETER_OPEN, FUNCTION_CLOSE, TOOL_CALL_CLOSE), pos + 1)
    calls.append(ToolCall(name, args))
    pos = _skip_space(body, pos)
    if body.startswith(TOOL_CALL_CLOSE, pos):
        pos += len(TOOL_CALL_CLOSE)
    else:
        closed = False
    if not closed:
        kinds.append("unclosed_call")
    return pos


def _read_json_call(body: str, finder: _Finder, pos: int, calls: list, kinds: list) -> int:
    """A JSON object inside ``<tool_call>`` (``{"name": ..., "arguments": {...}}``, as Qwen3 writes calls), read by
    the json format's forgiving reader."""
    close = finder.find(TOOL_CALL_CLOSE, pos)
    end = close if close >= 0 else len(body)
    read = turns.parse_turn(body[pos:end], expect_think=False)
    if read.calls:
        calls += read.calls
        kinds.append("call_spelling")
    else:
        kinds.append("bad_json" if "bad_json" in read.deviation_kinds else "not_a_call")
    if close < 0:
        kinds.append("unclosed_call")
        return len(body)
    return close + len(TOOL_CALL_CLOSE)


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
        messages.append({"role": "tool", "name": results[index].tool if index < len(results) else "", "content": content})
    note = "\n\n".join([*notes, tail]).strip()
    messages.append({"role": "user", "content": note})
    text = protocol.render_observation([*results, *(("", line) for line in notes)], tail)
    return Observation(text, messages)


_SUFFIX_SHAPES: dict[tuple, list] = {}
_SENTINEL = "\x00t2s-{}\x00"  # survives the template's trim; never in a rendered template


def _suffix_pieces(tokenizer, roles: tuple[str, ...], enable_thinking: bool) -> list:
    """The template's text between an assistant turn's ``<|im_end|>`` and the next generation prompt's end, for
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
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                             enable_thinking=enable_thinking)
    after = rendered.index(IM_END, rendered.index(assistant)) + len(IM_END)
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


def suffix_ids(tokenizer, messages: list[dict], *, needs_im_end: bool, enable_thinking: bool = True) -> list[int]:
    """The environment's tokens after a model turn, carrying ``messages``, exactly as the chat template renders them.

    The template's own tags become their tokens; the text between two tags (message contents with the template's
    line breaks around them) is tokenised as one piece without special-token parsing, which gives the ids a
    tokenisation of the whole rendered text gives, while a ``<|im_end|>`` inside a result stays plain text.
    """
    pieces = _suffix_pieces(tokenizer, tuple(m["role"] for m in messages), enable_thinking)
    parts: list[tuple[str, bool]] = [(IM_END, True)] if needs_im_end else []
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
