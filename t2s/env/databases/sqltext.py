"""Reading SQL text without SQLite: what a statement starts with, and whether it holds anything but comments.

Plain scans, linear in the length of the text whatever it holds (no regular expression that could backtrack).
"""

from __future__ import annotations

import functools


def skip_blanks(sql: str, pos: int = 0, *, semicolons: bool = False) -> int:
    """The index of the first character at or after ``pos`` that is not whitespace or inside a comment.

    ``--`` comments run to the end of the line, ``/* */`` comments to their close or the end of the text (as in
    SQLite). With ``semicolons``, ``;`` is skipped too.
    """
    end = len(sql)
    while pos < end:
        char = sql[pos]
        if char.isspace() or (semicolons and char == ";"):
            pos += 1
        elif char == "-" and sql.startswith("--", pos):
            newline = sql.find("\n", pos + 2)
            pos = end if newline < 0 else newline + 1
        elif char == "/" and sql.startswith("/*", pos):
            close = sql.find("*/", pos + 2)
            pos = end if close < 0 else close + 2
        else:
            break
    return pos


def _identifier_char(char: str) -> bool:
    """Characters SQLite reads as part of a bare word (letters, digits, ``_``, ``$`` and anything beyond ASCII)."""
    return char.isalnum() or char in "_$" or ord(char) > 0x7F


def starts_with_reindex(sql: str) -> bool:
    """True when the statement's first keyword, after whitespace and comments, is ``REINDEX``."""
    pos = skip_blanks(sql)
    word = sql[pos : pos + 7]
    if word.lower() != "reindex":
        return False
    return pos + 7 == len(sql) or not _identifier_char(sql[pos + 7])


def only_comments(sql: str) -> bool:
    """True when nothing but comments, whitespace and semicolons is in the statement."""
    return skip_blanks(sql, semicolons=True) == len(sql)


# sqlite3_complete's state machine (SQLite's complete.c): the states after each token; a statement ends at the ';'
# that brings it to START. Inside CREATE TRIGGER ... BEGIN, only "END ;" ends it.
_INVALID, _START, _NORMAL, _EXPLAIN, _CREATE, _TRIGGER, _SEMI, _END = range(8)
_SEMI_T, _WS_T, _OTHER_T, _EXPLAIN_T, _CREATE_T, _TEMP_T, _TRIGGER_T, _END_T = range(8)
_NEXT_STATE = (
    (_START, _INVALID, _NORMAL, _EXPLAIN, _CREATE, _NORMAL, _NORMAL, _NORMAL),  # INVALID
    (_START, _START, _NORMAL, _EXPLAIN, _CREATE, _NORMAL, _NORMAL, _NORMAL),  # START
    (_START, _NORMAL, _NORMAL, _NORMAL, _NORMAL, _NORMAL, _NORMAL, _NORMAL),  # NORMAL
    (_START, _EXPLAIN, _EXPLAIN, _NORMAL, _CREATE, _NORMAL, _NORMAL, _NORMAL),  # EXPLAIN
    (_START, _CREATE, _NORMAL, _NORMAL, _NORMAL, _CREATE, _TRIGGER, _NORMAL),  # CREATE
    (_SEMI, _TRIGGER, _TRIGGER, _TRIGGER, _TRIGGER, _TRIGGER, _TRIGGER, _TRIGGER),  # TRIGGER
    (_SEMI, _SEMI, _TRIGGER, _TRIGGER, _TRIGGER, _TRIGGER, _TRIGGER, _END),  # SEMI
    (_START, _END, _TRIGGER, _TRIGGER, _TRIGGER, _TRIGGER, _TRIGGER, _TRIGGER),  # END
)
_KEYWORDS = {"create": _CREATE_T, "temp": _TEMP_T, "temporary": _TEMP_T, "trigger": _TRIGGER_T, "end": _END_T,
             "explain": _EXPLAIN_T}
_CLOSING_QUOTE = {"'": "'", '"': '"', "`": "`", "[": "]"}


def statement_end(sql: str, start: int = 0) -> int:
    """Where the statement starting at ``start`` ends: the index just after its closing ``;``, or -1 when it never
    ends (an unterminated quote or comment, or no ``;``). The same verdict as ``sqlite3.complete_statement``, in one
    pass."""
    state, pos, end = _INVALID, start, len(sql)
    while pos < end:
        char = sql[pos]
        if char == ";":
            token, pos = _SEMI_T, pos + 1
        elif char in " \t\n\r\f":
            token, pos = _WS_T, pos + 1
        elif char == "/" and sql.startswith("/*", pos):
            close = sql.find("*/", pos + 2)
            if close < 0:
                return -1
            token, pos = _WS_T, close + 2
        elif char == "-" and sql.startswith("--", pos):
            newline = sql.find("\n", pos + 2)
            if newline < 0:
                return -1
            token, pos = _WS_T, newline + 1
        elif char in _CLOSING_QUOTE:
            close = sql.find(_CLOSING_QUOTE[char], pos + 1)
            if close < 0:
                return -1
            token, pos = _OTHER_T, close + 1
        elif _identifier_char(char):
            word_end = pos + 1
            while word_end < end and _identifier_char(sql[word_end]):
                word_end += 1
            token = _KEYWORDS.get(sql[pos:word_end].lower(), _OTHER_T) if word_end - pos <= 9 else _OTHER_T
            pos = word_end
        else:
            token, pos = _OTHER_T, pos + 1
        state = _NEXT_STATE[state][token]
        if state == _START and token == _SEMI_T:
            return pos
    return -1


@functools.lru_cache(maxsize=4096)
def one_line_ddl(sql: str) -> str:
    """Collapse whitespace runs to one space outside quoted strings and identifiers; ``--`` comments become
    ``/* */``."""
    out: list[str] = []
    i, n = 0, len(sql)
    closing = {"'": "'", '"': '"', "`": "`", "[": "]"}
    pending_space = False
    while i < n:
        ch = sql[i]
        if ch.isspace():
            pending_space = True
            i += 1
            continue
        if pending_space and out:
            out.append(" ")
        pending_space = False
        if ch in closing:
            end = sql.find(closing[ch], i + 1)
            end = n - 1 if end < 0 else end
            out.append(sql[i : end + 1])
            i = end + 1
        elif sql.startswith("--", i):
            end = sql.find("\n", i)
            end = n if end < 0 else end
            text = " ".join(sql[i + 2 : end].split()).replace("*/", "* /")
            out.append(f"/* {text} */" if text else "")
            pending_space = True
            i = end
        elif sql.startswith("/*", i):
            end = sql.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append(sql[i:end])
            i = end
        else:
            out.append(ch)
            i += 1
    return "".join(out).strip()


MAX_CTES = 100  # definitions in one statement (real ones: below 20); more is refused unmeasured


def cte_expansion(sql: str, cap: int) -> int | None:
    """About how many tokens SQLite compiles for ``sql`` once every reference to a common table expression is
    compiled as a copy of its body, as SQLite compiles it (capped at ``cap + 1``; ``cap + 1`` too for more than
    ``MAX_CTES`` definitions). A chain of CTEs that each name the one before twice costs 2 ** depth copies while the
    text grows only linearly: 61,000 characters compiled for 48 s, out of reach of the deadline, which SQLite never
    checks while it compiles. None when sqlglot cannot read the text (an unclosed comment, which SQLite accepts).

    Read from sqlglot's tokens (no parse, no recursion): a CTE is ``name [(columns)] AS [NOT] [MATERIALIZED] (body)``,
    its name any word or quoted name (``first`` and ``range`` are keywords to sqlglot, names to SQLite); its cost is
    its body's tokens plus, for each name in it of a CTE that closed before it, that CTE's cost less the name itself.
    The statement's cost counts every such name in the whole text at its CTE's cost, which may count a name twice (in
    a body and at its use), never less."""
    from bisect import bisect_left, bisect_right

    from sqlglot.dialects.sqlite import SQLite
    from sqlglot.tokens import TokenType

    try:
        tokens = SQLite().tokenize(sql)
    except Exception:  # noqa: BLE001 - text sqlglot cannot read: not measured
        return None
    if not any(t.token_type == TokenType.WITH for t in tokens):
        return len(tokens)

    def name_of(token) -> str | None:
        if token.token_type == TokenType.IDENTIFIER or (token.token_type != TokenType.STRING and token.text[:1]
                                                        and (token.text[0].isalpha() or token.text[0] == "_")):
            return token.text.lower()
        return None

    closing, stack = {}, []  # the index of each ( and its )
    for i, token in enumerate(tokens):
        if token.token_type == TokenType.L_PAREN:
            stack.append(i)
        elif token.token_type == TokenType.R_PAREN and stack:
            closing[stack.pop()] = i
    definitions = []  # (end, start, name) of each CTE's body
    for i, token in enumerate(tokens[:-2]):
        name = name_of(token)
        if name is None:
            continue
        j = i + 1
        if tokens[j].token_type == TokenType.L_PAREN:  # a column list
            j = closing.get(j, len(tokens)) + 1
        if j >= len(tokens) or tokens[j].token_type != TokenType.ALIAS:
            continue
        j += 1
        while j < len(tokens) and tokens[j].text.lower() in ("not", "materialized"):
            j += 1
        if j < len(tokens) and tokens[j].token_type == TokenType.L_PAREN and j in closing:
            definitions.append((closing[j], j, name))
            if len(definitions) > MAX_CTES:
                return cap + 1
    names = {name for _, _, name in definitions}
    places, named = [], []  # where a CTE's name stands (its definition's own included), and which name
    for i, token in enumerate(tokens):
        name = name_of(token)
        if name in names:
            places.append(i)
            named.append(name)
    cost: dict[str, int] = {}
    for end, start, name in sorted(definitions):  # inner CTEs close before the bodies they sit in
        body = end - start
        for k in range(bisect_left(places, start), bisect_right(places, end)):  # the names in this body only
            body += cost.get(named[k], 1) - 1
            if body > cap:
                break
        cost[name] = min(body, cap + 1)
    total = len(tokens)
    for name in named:
        total += cost.get(name, 1) - 1
        if total > cap:
            return cap + 1
    return total
