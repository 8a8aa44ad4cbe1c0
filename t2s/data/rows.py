"""The one row shape that training and evaluation share, and reading the data files rows come from.

Every loader yields plain dicts with exactly these keys (docs/design.md §2, §9)::

    {question_id, question, evidence, gold_sql, db_id, db_path, schema_id, difficulty, source}

A data file is read as a JSON list, a JSON object holding one, or JSONL; a bad file is one ``DataError`` naming the
file and the place.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Iterator

from t2s.errors import T2SError


ROW_KEYS = ("question_id", "question", "evidence", "gold_sql", "db_id", "db_path", "schema_id", "difficulty", "source")
DIFFICULTIES = ("simple", "moderate", "challenging")


class DataError(T2SError, ValueError):
    """A data file that cannot be loaded; the message begins with ``Error:`` and names the file (and row)."""


class RowList(list):
    """The loaded rows, plus what was found missing while loading.

    ``missing_databases``: db_id -> number of questions whose database file is absent.
    ``db_root``: the folder searched for databases (None for row-payload data).
    ``repeated_ids``: question ids whose rows appear more than once, word for word (see ``refuse_duplicate_ids``).
    """

    def __init__(self, rows: Iterable[dict] = (), missing_databases: dict[str, int] | None = None, db_root=None,
                 repeated_ids: list[str] | None = None):
        super().__init__(rows)
        self.repeated_ids: list[str] = list(repeated_ids or [])
        self.missing_databases: dict[str, int] = dict(missing_databases or {})
        self.db_root: str | None = str(db_root) if db_root is not None else None

    @property
    def missing_questions(self) -> int:
        return sum(self.missing_databases.values())

    def missing_summary(self) -> str:
        """One line naming the missing databases and their question counts ('' when none are missing)."""
        if not self.missing_databases:
            return ""
        items = sorted(self.missing_databases.items())
        names = ", ".join(f"{db} ({n} question{'s' if n != 1 else ''})" for db, n in items[:8])
        if len(items) > 8:
            names += f" and {len(items) - 8} more"
        if self.db_root is None:  # row payloads: those questions were left out
            return (f"{self.missing_questions} questions left out, their schemas absent from the schema table "
                    f"or impossible to build: {names}")
        return (f"{self.missing_questions} of {len(self)} questions point at databases missing under "
                f"{self.db_root}: {names}")


def make_row(
    *,
    question_id: str,
    question: str,
    gold_sql: str,
    db_id: str,
    source: str,
    evidence: str = "",
    db_path: str | None = None,
    schema_id: str | None = None,
    difficulty: str | None = None,
) -> dict:
    """One row in the common shape (every key present, plain strings or None). A lone surrogate in any of its text
    (JSON's ``"\\udcff"``, which no tokenizer encodes and no UTF-8 file holds) becomes U+FFFD."""
    return {
        "question_id": well_formed(str(question_id)),
        "question": well_formed(question),
        "evidence": well_formed(evidence or ""),
        "gold_sql": well_formed(gold_sql),
        "db_id": well_formed(db_id),
        "db_path": well_formed(db_path),
        "schema_id": well_formed(schema_id),
        "difficulty": well_formed(difficulty),
        "source": well_formed(source),
    }


def well_formed(text):
    """``text`` with each lone surrogate as U+FFFD (anything not a str as it is)."""
    if not isinstance(text, str) or text.isascii():
        return text
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:  # in a str every surrogate is a lone one (json joins the pairs)
        return "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in text)


def write_text_whole(path: str | Path, text: str) -> None:
    """``text`` written whole or not at all: a run that fails or is killed midway leaves the file as it was, not empty
    or half written. A lone surrogate (JSON's ``"\\udcff"`` read from a data file, which UTF-8 cannot hold) is
    written as that escape, so JSON text stays valid and reads back the same."""
    import os

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        staged.write_bytes(text.encode("utf-8", "backslashreplace"))
        os.replace(staged, path)
    finally:
        staged.unlink(missing_ok=True)


def read_text_file(path: str | Path, what: str = "data file") -> str:
    """A data file's UTF-8 text (``t2s.errors.read_text_file``, of any size, possibly blank): DataError naming
    ``what`` when it is absent, no regular file or not UTF-8."""
    from t2s.errors import read_text_file as read_user_file

    return read_user_file(path, what, error=DataError, max_bytes=None, allow_empty=True)


def read_records(path: str | Path) -> list[dict]:
    """A JSON list of objects, or JSONL (one object a line). Errors name the file and the line or row."""
    return parse_records(read_text_file(path), path)


def parse_records(text: str, path: str | Path) -> list[dict]:
    """:func:`read_records` on text already read from ``path`` (``path`` names the file in errors, and a ``.jsonl``
    suffix means JSONL)."""
    path = Path(path)
    stripped = text.lstrip()
    first_line = stripped[:stripped.find("\n")] if "\n" in stripped else stripped  # a slice: the text is not split
    # JSONL: by its name, or objects a line (a first line cut short, "{" say, begins one document: its error placed)
    if path.suffix == ".jsonl" or (stripped.startswith("{") and not _is_single_json_object(stripped)
                                   and not _ends_unfinished(first_line)):
        records = [value for _, value in jsonl_values(text, path)]
    else:
        try:
            records = json.loads(text)
        except (ValueError, RecursionError) as exc:  # a decode error, an integer past Python's digit limit, nesting
            where = f" at line {exc.lineno} column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
            raise DataError(f"Error: {path}: not valid JSON: {decode_problem(exc)}{where}") from None
        if isinstance(records, dict):  # a single object holding the list, e.g. {"data": [...]}
            lists = [v for v in records.values() if isinstance(v, list)]
            if len(lists) != 1:
                raise DataError(f"Error: {path}: expected a JSON list of questions, found an object")
            records = lists[0]
        if not isinstance(records, list):
            raise DataError(f"Error: {path}: expected a JSON list of questions, found {type(records).__name__}")
    for position, record in enumerate(records):
        if not isinstance(record, dict):
            raise DataError(
                f"Error: {path}: row {position} (0-based) is {type(record).__name__}, expected a JSON object"
            )
    return records


def jsonl_values(text: str, path: str | Path) -> Iterator[tuple[int, Any]]:
    """(line number, value) of each non-blank line of JSONL text; DataError naming the file and the line."""
    for number, line in enumerate(text.split("\n"), start=1):  # not splitlines: U+2028 and \x85 are text in JSON
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except (ValueError, RecursionError) as exc:
            where = f" (column {exc.colno})" if isinstance(exc, json.JSONDecodeError) else ""
            raise DataError(f"Error: {path}: line {number} is not valid JSON: {decode_problem(exc)}{where}") from None
        yield number, value


def read_json_object(path: str | Path) -> dict:
    """The JSON object a file holds (a model's ``config.json``, say); a DataError naming the file by its name when it
    cannot be read, is not JSON or holds another JSON value."""
    path = Path(path)
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise DataError(f"{path.name} is unreadable: {exc.strerror or exc}") from None
    except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, past Python's limits
        raise DataError(f"{path.name} is not valid JSON: {decode_problem(exc)}") from None
    if not isinstance(value, dict):
        raise DataError(f"{path.name} is not a JSON object (it holds a JSON {type(value).__name__})")
    return value


def decode_problem(exc: Exception) -> str:
    """Why ``json.loads`` refused a text: its message, or what Python's own limits refused."""
    if isinstance(exc, json.JSONDecodeError):
        return exc.msg
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    if isinstance(exc, UnicodeDecodeError):
        return "not UTF-8 text"
    return "a number of more digits than Python reads"  # sys.get_int_max_str_digits(), 4300 by default


def _ends_unfinished(line: str) -> bool:
    """Whether ``line`` is valid JSON so far but ends before its value does (a document's first line)."""
    try:
        json.loads(line)
    except json.JSONDecodeError as exc:
        return exc.pos >= len(line.rstrip())
    except (ValueError, RecursionError):
        return False
    return False


def _is_single_json_object(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except (ValueError, RecursionError):
        return False


def _require(record: dict, fields: Iterable[str], path, position: int, optional: Iterable[str] = ()) -> None:
    """Raise naming the file and row when a required field is missing or not a non-empty string, an ``optional`` one is
    present (not null) but not a string, or ``question_id`` is neither text nor a whole number."""
    values = {f: record.get(f) for f in fields}
    missing = [repr(f) for f, v in values.items() if v is None or (isinstance(v, str) and not v.strip())]
    wrong = [f"{f!r} holds {type(v).__name__}, not text" for f, v in values.items()
             if v is not None and not isinstance(v, str)]
    wrong += [f"{f!r} holds {type(record[f]).__name__}, not text" for f in optional
              if record.get(f) is not None and not isinstance(record[f], str)]
    own_id = record.get("question_id")
    if own_id is not None and not isinstance(own_id, str) and type(own_id) is not int:  # not a bool, a float, a list
        wrong.append(f"'question_id' holds {type(own_id).__name__}, not text or a whole number")
    if missing or wrong:
        said = ([f"is missing required field(s) {', '.join(missing)}"] if missing else []) + wrong
        raise DataError(f"Error: {path}: row {position} (0-based) {'; '.join(said)}")
    if "db_id" in values and not plain_name(values["db_id"]):  # it names <db_root>/<db_id>/<db_id>.sqlite
        raise DataError(f"Error: {path}: row {position} (0-based): db_id {values['db_id']!r} is a path, not the name "
                        "of a database folder")


def plain_name(name: str) -> bool:
    """Whether ``name`` can be one folder's name below a root: no separator, NUL or parent (``..``)."""
    return name.strip() not in (".", "..") and not any(char in name for char in "/\\\0")


def refuse_duplicate_ids(rows: Iterable[dict], where) -> list[str]:
    """DataError naming the question ids that two different rows share: ``score``, ``eval``, ``compare`` and resume
    key on them. Returns the ids whose rows repeat word for word (BIRD mini-dev repeats two questions so), which are
    kept: positions in the file stay as they are for BIRD's position-keyed predictions."""
    first: dict[str, dict] = {}
    conflicting: dict[str, int] = {}
    repeated: list[str] = []
    for row in rows:
        question_id = row["question_id"]
        if question_id not in first:
            first[question_id] = row
        elif row != first[question_id]:
            conflicting[question_id] = conflicting.get(question_id, 1) + 1
        elif question_id not in repeated:
            repeated.append(question_id)
    if conflicting:
        named = ", ".join(f"{question_id} ({n} rows)" for question_id, n in list(conflicting.items())[:10])
        more = f" and {len(conflicting) - 10} more" if len(conflicting) > 10 else ""
        raise DataError(f"Error: {where}: {len(conflicting)} question_id(s) name different questions: {named}{more}; "
                        "each question needs its own id")
    return repeated


def _pick(record: dict, names: Iterable[str]) -> str | None:
    for name in names:
        if name in record:
            return name
    return None


def _difficulty(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    value = value.strip().lower()
    return value if value in DIFFICULTIES else None


def _bird_difficulty(record: dict) -> str | None:
    """The labelled difficulty; a file written by `data difficulty` supplies its estimate where no label exists."""
    return _difficulty(record.get("difficulty")) or _difficulty(record.get("difficulty_estimated"))
