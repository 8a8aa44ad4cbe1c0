"""Reading a JSON-format assistant turn (docs/design.md §3): the thinking, then the bare JSON calls after the last
``</think>`` (or anywhere when there is none). Forgiving (fenced JSON, several objects, trailing prose, each deviation
counted) and linear on hostile text: no backtracking pattern, a bounded number of failed decodes, and JSON nested past
``MAX_JSON_DEPTH`` replaced by a note rather than recursed into.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from t2s.env.protocol import THINK_CLOSE, THINK_OPEN

MAX_FAILED_DECODES = 64  # JSON decode attempts that may fail in one turn before scanning stops (keeps reading linear)
MAX_JSON_DEPTH = 32  # deeper JSON containers in a call are replaced by a note (no tool argument nests so deep)
TOO_DEEP = "(nested too deeply)"


@dataclass(slots=True)
class ToolCall:
    tool: str
    args: object  # a dict when the model wrote one; anything else is reported by the tool as an argument error

    def as_dict(self) -> dict:
        return {"tool": self.tool, "args": self.args}


@dataclass(slots=True)
class ParsedTurn:
    calls: list[ToolCall]
    deviations: int  # format deviations forgiven while reading (each kind counted once per turn)
    errors: list[str]  # `Error:` lines about what could not be read
    text: str  # the whole turn
    think_end: int  # where the last </think> starts (-1 when there is none)
    body: str = ""  # the text after the last </think> (the whole turn when there is none)
    deviation_kinds: list[str] = field(default_factory=list)

    @property
    def thinking(self) -> str:
        """The thinking, without its tags ("" when there is no </think>)."""
        return _thinking(self.text[: self.think_end]) if self.think_end >= 0 else ""


_FENCE = re.compile(r"```[A-Za-z0-9_-]*")
_DECODER = json.JSONDecoder()


def split_thinking(text: str, expect_think: bool = True) -> tuple[str, str, list[str]]:
    """(thinking, body, deviation kinds): the body is what follows the last ``</think>``.

    ``expect_think``: thinking is on, so a turn without ``</think>`` is a deviation.
    """
    end, body, kinds = split_body(text, expect_think)
    return (_thinking(text[:end]) if end >= 0 else ""), body, kinds


def split_body(text: str, expect_think: bool = True) -> tuple[int, str, list[str]]:
    """(where the last ``</think>`` starts or -1, the body after it, deviation kinds); the thinking is not copied."""
    end = text.rfind(THINK_CLOSE)
    if end < 0:
        stripped = text.lstrip()
        if stripped.startswith(THINK_OPEN):  # tolerated: some models repeat the opening tag
            stripped = stripped[len(THINK_OPEN):]
        return -1, stripped, ["no_think_close"] if expect_think and stripped.strip() else []
    several = text.find(THINK_CLOSE) != end
    return end, text[end + len(THINK_CLOSE):], ["several_think_close"] if several else []


def _thinking(head: str) -> str:
    return head.replace(THINK_OPEN, "").replace(THINK_CLOSE, "").strip()


def _as_call(obj) -> tuple[ToolCall | None, bool]:
    """A decoded JSON value as a tool call, and whether an alias spelling was forgiven."""
    if not isinstance(obj, dict):
        return None, False
    alias = False
    name = obj.get("tool")
    if name is None and isinstance(obj.get("name"), str):
        name, alias = obj["name"], True
    if not isinstance(name, str):
        return None, False
    if "args" in obj:
        args = obj["args"]
    elif "arguments" in obj or "parameters" in obj:
        args, alias = obj.get("arguments", obj.get("parameters")), True
    else:
        args = {k: v for k, v in obj.items() if k != "tool"}  # {"tool": "run_query", "sql": ...}
        alias = alias or bool(args)
    if isinstance(args, str):  # args written as a JSON string
        try:
            decoded = json.loads(args)
        except (ValueError, RecursionError):
            decoded = None
        if isinstance(decoded, dict):
            args, alias = decoded, True
    return ToolCall(name.strip(), args), alias


def _object_lines(body: str) -> list | None:
    """The JSON objects of a body that holds one per line and nothing else, decoded in one pass; else None.

    Several lines are read as one JSON array. That array has as many values as lines only when every line is exactly
    one value: a value running over a line break (or a raw line break inside a string) would leave fewer.
    """
    lines = body.strip()
    if lines[:1] != "{":
        return None
    several = "\n" in lines
    text = "[" + lines.replace("\n", ",") + "]" if several else lines
    try:
        values, end = _DECODER.scan_once(text, 0)
    except (StopIteration, ValueError, RecursionError):
        return None
    if end != len(text):
        return None
    if not several:
        return [values] if type(values) is dict else None
    if len(values) != lines.count("\n") + 1:
        return None
    for value in values:
        if type(value) is not dict:
            return None
    return values


def parse_turn(text: str, expect_think: bool = True) -> ParsedTurn:
    """Read the tool calls of one assistant turn (linear time, never raises).

    Decoded calls hold valid text only (lone surrogates become U+FFFD) and nest at most ``MAX_JSON_DEPTH`` deep. A
    turn that cannot be read at all has no calls and one deviation, ``unreadable_turn``.
    """
    if type(text) is not str:
        text = text if isinstance(text, str) else ""
    try:
        text = valid_text(text)
        parsed = _parse_turn(text, expect_think)
        if parsed.calls and _needs_taming(parsed.body):
            for call in parsed.calls:
                call.tool, call.args = tame_value(call.tool), tame_value(call.args)
        return parsed
    except Exception as exc:  # noqa: BLE001 - whatever the text, a turn is read as a deviation, never an exception
        kinds = ["unreadable_turn"]
        return ParsedTurn([], 1, [f"Error: the turn could not be read ({type(exc).__name__})."], text, -1, "", kinds)


def _parse_turn(text: str, expect_think: bool) -> ParsedTurn:
    end, body, kinds = split_body(text, expect_think)
    objects = None if "```" in body else _object_lines(body)
    if objects is not None and not kinds:  # the usual turn: thinking, then calls one per line and nothing else
        calls = []
        for obj in objects:
            name, args = obj.get("tool"), obj.get("args")
            if len(obj) != 2 or type(name) is not str or type(args) is not dict:
                break
            calls.append(ToolCall(name.strip(), args))
        else:
            several = ["several_calls"] if len(calls) > 1 else []
            return ParsedTurn(calls, len(several), [], text, end, body, several)
    return _parse_body(text, end, body, kinds, objects)


def _needs_taming(body: str) -> bool:
    """Whether decoded values may hold lone surrogates (from ``\\udXXX`` escapes) or nest past ``MAX_JSON_DEPTH``."""
    return "\\ud" in body or "\\uD" in body or body.count("[") + body.count("{") > MAX_JSON_DEPTH


def valid_text(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD (a paired one becomes its character)."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def tame_value(value):
    """A decoded JSON value made safe to run, render and write: text valid, containers at most ``MAX_JSON_DEPTH``
    deep (deeper ones become ``TOO_DEEP``). Iterative, so no depth of input can exhaust the stack."""
    if isinstance(value, str):
        return valid_text(value)
    if not isinstance(value, (dict, list)):
        return value
    root = type(value)()
    stack = [(value, root, 1)]
    while stack:
        source, target, depth = stack.pop()
        items = source.items() if isinstance(source, dict) else enumerate(source)
        for key, item in items:
            if isinstance(item, (dict, list)):
                if depth >= MAX_JSON_DEPTH:
                    copy = TOO_DEEP
                else:
                    copy = type(item)()
                    stack.append((item, copy, depth + 1))
            elif isinstance(item, str):
                copy = valid_text(item)
            else:
                copy = item
            if isinstance(target, dict):
                target[valid_text(key)] = copy
            else:
                target.append(copy)
    return root


def _parse_body(text: str, end: int, body: str, kinds: list[str], objects: list | None) -> ParsedTurn:
    """Read the calls of a turn's body wherever they are (``kinds``: the deviations found so far; ``objects``: the
    body's JSON objects when it holds one per line and nothing else, as ``_object_lines`` read them, else None)."""
    calls: list[ToolCall] = []
    errors: list[str] = []
    fenced = "```" in body
    failed, bad_objects = 0, 0
    aliased = prose = False
    spans: list[tuple[int, int]] = []  # where each JSON value was read (kept for fenced turns only)
    if objects is None:
        objects = []
        pos, last = 0, 0  # last: where the last JSON value read ended
        scan = _DECODER.scan_once  # what JSONDecoder.raw_decode runs, without its wrapper
        while True:
            start = body.find("{", pos)
            if start < 0:
                break
            try:
                obj, end = scan(body, start)
            except (StopIteration, ValueError, RecursionError):  # not JSON here (or nested past the stack): next brace
                failed += 1
                if failed >= MAX_FAILED_DECODES:
                    kinds.append("unreadable_json")
                    break
                pos = start + 1
                continue
            objects.append(obj)
            if fenced:
                spans.append((start, end))
            elif not prose and start > last and not body[last:start].isspace():
                prose = True
            pos = last = end
        if objects and not fenced and not prose and last < len(body) and not body[last:].isspace():
            prose = True
    for obj in objects:
        if type(obj) is dict and len(obj) == 2:
            name, args = obj.get("tool"), obj.get("args")
            if type(name) is str and type(args) is dict:  # the usual {"tool": NAME, "args": {...}}
                calls.append(ToolCall(name.strip(), args))
                continue
        call, alias = _as_call(obj)
        if call is None:
            bad_objects += 1
        else:
            calls.append(call)
            aliased = aliased or alias
    if failed:
        kinds.append("bad_json")
    if bad_objects:
        kinds.append("not_a_call")
        errors.append('Error: a JSON object without a "tool" name was ignored.')
    if aliased:
        kinds.append("call_spelling")
    if len(calls) > 1:
        kinds.append("several_calls")
    if fenced:
        kinds.append("fenced")
        if spans:  # the text outside the JSON values, fences removed
            outside, last = [], 0
            for a, b in spans:
                outside.append(body[last:a])
                last = b
            outside.append(body[last:])
            rest = _FENCE.sub("", "".join(outside))
            prose = bool(rest) and not rest.isspace()
    if prose:
        kinds.append("prose")
    if failed and not calls:
        errors.append("Error: the tool call is not valid JSON (it may be cut off).")
    if len(kinds) > 1:
        kinds = list(dict.fromkeys(kinds))
    return ParsedTurn(calls, len(kinds), errors, text, end, body, kinds)


_SQL_WORD = re.compile(r"\b(select|with)\b", re.IGNORECASE)  # literal words: one pass, no backtracking
_FENCE_TAGS = ("sqlite", "sql")


def _starts_with_query(text: str) -> bool:
    """True when ``text``, after whitespace, starts with the word SELECT or WITH."""
    start = len(text) - len(text.lstrip())
    for word in ("select", "with"):
        end = start + len(word)
        if text[start:end].lower() == word and (end == len(text) or not (text[end].isalnum() or text[end] == "_")):
            return True
    return False


def _fenced_blocks(body: str):
    """The text of each closed ````` ``` ````` block, its ``sql``/``sqlite`` tag removed (one pass over ``body``)."""
    pos = 0
    while (start := body.find("```", pos)) >= 0:
        end = body.find("```", start + 3)
        if end < 0:
            return
        block = body[start + 3 : end]
        for tag in _FENCE_TAGS:
            if block[: len(tag)].lower() == tag:
                block = block[len(tag) :]
                break
        yield block
        pos = end + 3


def bare_sql(body: str) -> str | None:
    """SQL written without a tool call (accepted on the forced final turn): a fenced block or a SELECT/WITH text."""
    if not isinstance(body, str):
        return None
    for block in _fenced_blocks(body):
        if _starts_with_query(block):
            return block.strip()
    match = _SQL_WORD.search(body)
    if match:
        candidate = body[match.start():].strip().strip("`").strip()
        if _starts_with_query(candidate):
            return candidate
    return None
