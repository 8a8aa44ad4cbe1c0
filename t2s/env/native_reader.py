"""Reading a native turn (docs/design.md §3): the calls vLLM's ``qwen3_xml`` tool parser returns for the same text.

``--tool-call-parser qwen3_xml`` (vLLM 0.31's ``Qwen3EngineToolParser``) is how the sibling is deployed, with no
reasoning parser. Reading a turn by any other rule would reward a model in training for calls its server drops (or
the reverse), so ``parse_turn`` follows that parser's rule exactly, tested against the parser itself:

- the lexer: the format's tags (and the tokenizer's special tokens, which are dropped) are found left to right;
- the states: a call opens at ``<tool_call>`` or a bare ``<function=``, wherever it stands, the thinking included; its
  name runs to ``>``, its arguments to ``</function>``; text inside ``<tool_call>`` outside a function is dropped;
- the arguments: a value opens at ``<parameter=NAME>`` and ends at ``</parameter>`` or where the next parameter
  opens; a value cut off before either is dropped (a ``submit`` cut inside its SQL submits nothing); one line break
  on each side is the template's and removed; an argument declared as an integer is one when ``int()`` reads it.

It scans with ``str.find`` and bounded look-aheads only, in linear time, whatever the text. One departure: arguments
written as JSON are cut at ``turns.MAX_JSON_DEPTH`` levels (as tools mode cuts a server's), where the parser keeps any
depth (or raises, past Python's recursion limit); no tool's argument nests that deep.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from t2s.env import turns
from t2s.env.protocol import THINK_CLOSE, THINK_OPEN
from t2s.env.turns import ParsedTurn, ToolCall

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
FUNCTION_OPEN, FUNCTION_CLOSE = "<function=", "</function>"
PARAMETER_OPEN, PARAMETER_CLOSE = "<parameter=", "</parameter>"
CHATML_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # without a tokenizer: Qwen's specials
_TAGS = (THINK_OPEN, THINK_CLOSE, TOOL_CALL_OPEN, TOOL_CALL_CLOSE, FUNCTION_OPEN, FUNCTION_CLOSE,
         PARAMETER_OPEN, PARAMETER_CLOSE, ">")
# ``\s`` of the ``regex`` module vLLM's parameter pattern is written in (Unicode White_Space; ``str.isspace`` also
# takes the four ASCII separators \x1c-\x1f, which it does not)
_SPACE = frozenset("\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
                   "\u2028\u2029\u202f\u205f\u3000")


def special_tokens_of(tokenizer) -> tuple[str, ...]:
    """The special tokens the parser drops from a turn: the tokenizer's, but for the format's own tags."""
    return tuple(t for t in getattr(tokenizer, "all_special_tokens", ()) if isinstance(t, str) and t and t not in _TAGS)


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


def _tags(text: str, tags: tuple[str, ...]):
    """The parser's lexer: ``(tag, where it starts)`` for each tag, left to right, none inside another (no tag is a
    prefix of another, so the earliest start decides)."""
    finder = _Finder(text)
    pos = 0
    while True:
        hits = [(at, tag) for tag in tags if (at := finder.find(tag, pos)) >= 0]
        if not hits:
            return
        at, tag = min(hits)
        yield tag, at
        pos = at + len(tag)


@dataclass(slots=True)
class _Slot:
    """One call as the parser's state machine saw it: where it opened, its name's and arguments' text, whether it was
    wrapped in ``<tool_call>`` and closed, and the text it dropped between its tags."""

    start: int
    wrapped: bool
    name: list[str] = field(default_factory=list)
    args: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    function_closed: bool = False
    call_closed: bool = False


# (state, tag) -> next state; a tag with no entry is text of its state, as the parser's grammar has it
_NEXT = {("content", TOOL_CALL_OPEN): "preamble", ("content", FUNCTION_OPEN): "name",
         ("preamble", TOOL_CALL_CLOSE): "content", ("preamble", FUNCTION_OPEN): "name",
         ("name", ">"): "args", ("name", FUNCTION_CLOSE): "between", ("args", FUNCTION_CLOSE): "between",
         ("between", TOOL_CALL_CLOSE): "content", ("between", TOOL_CALL_OPEN): "preamble",
         ("between", FUNCTION_OPEN): "name"}


def _slots(text: str, special_tokens: tuple[str, ...]) -> tuple[list[_Slot], list[tuple[int, str]]]:
    """The parser's states over a whole turn, its reasoning markup read as plain text (as a server without a
    reasoning parser reads it): the calls, and the pieces of plain content between them with where each starts.

    ``<tool_call>`` or a bare ``<function=`` opens a call; ``<function=`` then names it up to ``>``; its arguments run
    to ``</function>`` (every other tag inside them is text); ``</tool_call>`` closes it, and an opening tag after
    ``</function>`` starts the next call. Text inside ``<tool_call>`` outside a function is dropped, and so are the
    tokenizer's special tokens, wherever they stand. Linear time."""
    slots: list[_Slot] = []
    content: list[tuple[int, str]] = []
    state, pos, slot = "content", 0, None

    def put(a: int, b: int) -> None:
        if a < b:
            if state == "content":
                content.append((a, text[a:b]))
            else:
                (slot.name if state == "name" else slot.args if state == "args" else slot.dropped).append(text[a:b])

    for tag, at in _tags(text, _TAGS + special_tokens):
        put(pos, at)
        pos = at + len(tag)
        if tag in special_tokens:
            continue
        following = _NEXT.get((state, tag))
        if following is None:
            put(at, pos)
            continue
        if tag in (TOOL_CALL_OPEN, FUNCTION_OPEN) and state != "preamble":
            slot = _Slot(at, wrapped=tag == TOOL_CALL_OPEN)
            slots.append(slot)
        elif tag == FUNCTION_CLOSE:
            slot.function_closed = True
        elif tag == TOOL_CALL_CLOSE:
            slot.call_closed = True
        state = following
    put(pos, len(text))
    return slots, content


def _tag_at(text: str, at: int, closing: bool) -> int:
    """Where ``<\\s*parameter\\s*=`` (or ``<\\s*/\\s*parameter\\s*>`` when ``closing``) starting at ``at`` ends; -1 when
    it does not start there. Each whitespace run it skips ends at the next other character, so a scan stays linear."""
    pos = at + 1
    n = len(text)
    while pos < n and text[pos] in _SPACE:
        pos += 1
    if closing:
        if not text.startswith("/", pos):
            return -1
        pos += 1
        while pos < n and text[pos] in _SPACE:
            pos += 1
    if not text.startswith("parameter", pos):
        return -1
    pos += len("parameter")
    while pos < n and text[pos] in _SPACE:
        pos += 1
    mark = ">" if closing else "="
    return pos + 1 if text.startswith(mark, pos) else -1


def _parameters(body: str) -> tuple[dict[str, str], bool, bool]:
    """(the parameters, whether text stood outside them, whether a value was cut off) of a function body, read as
    vLLM's Qwen3 argument converter reads it: ``<parameter=NAME>`` (spaces allowed around ``parameter`` and ``=``;
    the name runs to the next ``>``) opens a value that ends at ``</parameter>`` or where the next parameter opens;
    a value that never ends drops its parameter. One leading and one trailing line break of a value are the
    template's and removed; the rest is kept."""
    params: dict[str, str] = {}
    stray = False
    pos = 0
    n = len(body)
    lt = body.find("<")
    while lt >= 0:
        name_start = _tag_at(body, lt, closing=False)
        if name_start < 0:
            lt = body.find("<", lt + 1)
            continue
        stray = stray or bool(body[pos:lt].strip())
        while name_start < n and body[name_start] in _SPACE:
            name_start += 1
        name_end = body.find(">", name_start)
        if name_end < 0:
            return params, True, True
        value_end = close_end = body.find("<", name_end + 1)
        while value_end >= 0:
            close_end = _tag_at(body, value_end, closing=True)
            if close_end >= 0 or _tag_at(body, value_end, closing=False) >= 0:
                break
            value_end = body.find("<", value_end + 1)
        if value_end < 0:  # a value cut off: the parameter is dropped
            return params, stray, True
        value = body[name_end + 1:value_end]
        value = value[1:] if value.startswith("\n") else value
        params[body[name_start:name_end]] = value[:-1] if value.endswith("\n") else value
        pos = close_end if close_end >= 0 else value_end
        lt = body.find("<", pos)
    return params, stray or bool(body[pos:].strip()), False


def _arg_types(tools: list[dict] | None) -> dict[str, dict[str, str]]:
    """``{tool: {argument: its declared type}}`` from function schemas (the first declaration of a name counts)."""
    out: dict[str, dict[str, str]] = {}
    for tool in tools or []:
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        params = fn.get("parameters") if isinstance(fn, dict) else None
        props = params.get("properties") if isinstance(params, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str) and fn["name"] not in out:
            props = props if isinstance(props, dict) else {}
            out[fn["name"]] = {k: v.get("type") for k, v in props.items() if isinstance(v, dict)}
    return out


def _finite(value) -> bool:
    """No infinity or NaN anywhere in a decoded JSON value (walked without recursion)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return False
        if isinstance(item, dict):
            stack += item.values()
        elif isinstance(item, list):
            stack += item
    return True


def _typed(value, declared: str | None):
    """A value as vLLM's schema coercion leaves it. A text argument given as another JSON value becomes its JSON
    text. An integer argument becomes one when ``int()`` reads it, else the JSON value it decodes to (finite), else it
    stays text. Anything else stays as it is."""
    if declared not in ("integer", "string") or isinstance(value, (dict, list)):
        return value
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    if declared == "string":
        return text
    try:
        return int(text)
    except ValueError:
        pass
    try:
        decoded = json.loads(text)
    except (ValueError, RecursionError):
        return text
    return decoded if _finite(decoded) else text


def _json_call(body: str) -> tuple[str, object] | None:
    """A call written as a JSON object in a function body without a name: ``{"name": ..., "arguments": ...}``
    (``parameters`` also read, or the object's other keys), as the parser takes it; None when it is no such call."""
    try:
        obj = json.loads(body.strip())
    except (ValueError, RecursionError):
        return None
    name = obj.get("name", "") if isinstance(obj, dict) else ""
    if not isinstance(name, str) or not name:
        return None
    for key in ("arguments", "parameters"):
        if key in obj:
            args = obj[key]
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except (ValueError, RecursionError):
                    pass
            return name, turns.tame_value(args)  # as tools mode takes a server's arguments: at most so deep
    return name, turns.tame_value({k: v for k, v in obj.items() if k != "name"})


def _named_in(body: str) -> str:
    """The name a ``<function=>`` with no name gets: the first ``"name": "..."`` in its body, as the parser's search
    for ``"name"\\s*:\\s*"([^"]*)"`` finds it ("" when there is none, or when the first is empty)."""
    key = '"name"'
    at = body.find(key)
    while at >= 0:
        pos = at + len(key)
        while pos < len(body) and body[pos] in _SPACE:
            pos += 1
        if body.startswith(":", pos):
            pos += 1
            while pos < len(body) and body[pos] in _SPACE:
                pos += 1
            if body.startswith('"', pos):
                close = body.find('"', pos + 1)
                if close >= 0:
                    return body[pos + 1:close]
        at = body.find(key, at + 1)
    return ""


def parse_turn(text: str, expect_think: bool = True, tools: list[dict] | None = None,
               special_tokens: tuple[str, ...] = CHATML_SPECIAL_TOKENS) -> ParsedTurn:
    """Read the native tool calls of one assistant turn (linear time, never raises).

    The calls are the ones vLLM's ``qwen3_xml`` parser returns for the same text, with the same arguments (see the
    module docstring), wherever they stand: a server without a reasoning parser reads calls inside the thinking too.
    Every departure from the template's format is counted once per kind: ``prose`` (text beside the calls, after the
    thinking), ``call_in_thinking`` (a call before the last ``</think>``), ``not_a_call`` (a ``<tool_call>`` with no
    named function: dropped), ``bare_function`` (a ``<function=`` without ``<tool_call>``), ``unclosed_call`` (a
    missing ``</parameter>``, ``</function>`` or ``</tool_call>``; a value left open is dropped), ``call_text`` (stray
    text inside a call), ``call_spelling`` (a JSON call inside ``<tool_call>``, as Qwen3 writes it: dropped, as the
    server drops it) and ``bad_json`` (such a JSON call that does not decode). Several calls in one turn are the
    format's own.
    """
    if type(text) is not str:
        text = text if isinstance(text, str) else ""
    try:
        text = turns.valid_text(text)
        end, body, kinds = turns.split_body(text, expect_think)
        special = tuple(t for t in special_tokens if t and t not in _TAGS)  # the parser never drops its own tags
        slots, content = _slots(text, special)
        return _read(text, end, len(text) - len(body), body, kinds, slots, content, _arg_types(tools))
    except Exception as exc:  # noqa: BLE001 - whatever the text, a turn is read as a deviation, never an exception
        kinds = ["unreadable_turn"]
        return ParsedTurn([], 1, [f"Error: the turn could not be read ({type(exc).__name__})."], text, -1, "", kinds)


def _read(text: str, think_end: int, body_start: int, body: str, kinds: list[str], slots: list[_Slot],
          content: list[tuple[int, str]], types: dict) -> ParsedTurn:
    calls: list[ToolCall] = []
    errors: list[str] = []
    ignored_json = False
    for slot in slots:
        raw_args = "".join(slot.args)
        dropped = "".join(slot.dropped).strip()
        raw_name = "".join(slot.name) or _named_in(raw_args)  # a name-less function takes the first "name" inside
        name = raw_name.strip()
        spelled = dropped.startswith("{") and not name  # Qwen3's JSON spelling inside <tool_call>: dropped
        if spelled:
            ignored_json = True
            kinds.append("call_spelling" if turns.parse_turn(dropped, expect_think=False).calls else "bad_json")
        elif dropped:
            kinds.append("call_text")
        call = None
        if name:
            params, stray, cut = _parameters(raw_args)
            if stray:
                kinds.append("call_text")
            if cut:
                kinds.append("unclosed_call")
            call = (name, params)
        elif raw_args.strip() and (call := _json_call(raw_args)):
            kinds.append("call_spelling")
        if call is None:
            if not spelled:
                kinds.append("not_a_call")
            continue
        name, args = call
        declared = types.get(name, {})
        if isinstance(args, dict):
            args = {key: _typed(value, declared.get(key)) for key, value in args.items()}
        calls.append(ToolCall(name, args))
        if not (slot.function_closed and (slot.call_closed or not slot.wrapped)):
            kinds.append("unclosed_call")
        if not slot.wrapped:
            kinds.append("bare_function")
        if 0 <= slot.start < think_end:
            kinds.append("call_in_thinking")
    if slots and any(piece[max(0, body_start - at):].strip() for at, piece in content if at + len(piece) > body_start):
        kinds.append("prose")
    if "not_a_call" in kinds:
        errors.append(f"Error: a {TOOL_CALL_OPEN} without <function=NAME> was ignored.")
    if ignored_json:
        errors.append(f"Error: a JSON call inside {TOOL_CALL_OPEN} was ignored: call a tool as "
                      f"<function=NAME> with one <parameter=NAME> block per argument.")
    kinds = list(dict.fromkeys(kinds))
    return ParsedTurn(calls, len(kinds), errors, text, think_end, body, kinds)
