"""Row-payload databases (SQaLe-style: DDL plus rows as JSON), built once in memory and copied per thread.

Foreign keys are off, failing DDL is skipped and rows go in with ``INSERT OR IGNORE``. The serialised images and every
thread's deserialised copy are bounded together by ``LIMITS.payload_cache_bytes``.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from collections import OrderedDict

from t2s.env.databases import limits
from t2s.env.databases.engine_base import quote
from t2s.env.databases.opening import DatabaseOpenError, DatabaseRef
from t2s.env.databases.sandbox import SandboxConnection
from t2s.env.databases.sqltext import only_comments, statement_end

_local = threading.local()

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _payload_value(value):
    if value is None or isinstance(value, (str, bytes, float)):
        return value
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return min(_INT64_MAX, max(_INT64_MIN, value))
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, ensure_ascii=False, default=str)
    return str(value)


MAX_UNENDED_DDL = 8  # statements that never end before the rest of a DDL script is simply cut at every ';'


def _ends_alone(piece: str) -> bool:
    try:
        return sqlite3.complete_statement(piece)
    except ValueError:  # a NUL character: the scan decides
        return False


def _ddl_statements(ddl) -> list[str]:
    """A DDL script (or a list of statements) as single statements, comment-only pieces dropped.

    A ``;`` inside a string, a comment or a trigger body does not cut (``sqltext.statement_end``, the verdict of
    ``sqlite3.complete_statement``). A broken statement (an unbalanced parenthesis, an unknown keyword) ends at its own
    ``;`` and fails alone. A piece that never ends (an unterminated quote or comment swallowing the rest) is taken
    alone, and splitting resumes after it; after ``MAX_UNENDED_DDL`` such pieces the rest is cut at every ``;``, so
    splitting stays linear in the script's length.
    """
    if isinstance(ddl, (list, tuple)):
        pieces = [str(part) for part in ddl]
    else:
        script = str(ddl or "")
        pieces, start, unended = [], 0, 0
        while start < len(script):
            semicolon = script.find(";", start)
            if semicolon < 0:
                pieces.append(script[start:])
                break
            end = semicolon + 1
            piece = script[start:end]
            if unended < MAX_UNENDED_DDL and not _ends_alone(piece):  # the usual piece ends alone
                end = statement_end(script, start)
                if end < 0:  # never ends: take the first piece alone and resume after it
                    unended += 1
                    end = semicolon + 1
                piece = script[start:end]
            pieces.append(piece)
            start = end
    return [piece for piece in pieces if not only_comments(piece)]


def build_payload_image(ddl, rows: dict | None) -> tuple[bytes, dict]:
    """Build a row-payload database in memory and serialise it: (image, counts of what was kept and skipped)."""
    counts = {"ddl_ok": 0, "ddl_skipped": 0, "rows": 0, "rows_skipped": 0, "tables_skipped": 0}
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        conn.execute("PRAGMA foreign_keys = OFF")
        conn.execute("PRAGMA user_version = 0")  # writes the header page, so a schema with no table still serialises
        for statement in _ddl_statements(ddl):
            try:
                conn.execute(statement)
                counts["ddl_ok"] += 1
            except (sqlite3.Error, sqlite3.Warning):
                counts["ddl_skipped"] += 1
        tables = {
            name.lower(): name
            for (name,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            )
        }
        conn.execute("BEGIN")
        for table_name, table_rows in (rows or {}).items():
            table = tables.get(str(table_name).lower())
            if table is None or not isinstance(table_rows, list):
                counts["tables_skipped"] += 1
                continue
            columns = {str(info[1]).lower(): info[1] for info in conn.execute(f"PRAGMA table_info({quote(table)})")}
            for row in table_rows:
                if not isinstance(row, dict):
                    counts["rows_skipped"] += 1
                    continue
                kept = [(columns[str(k).lower()], v) for k, v in row.items() if str(k).lower() in columns]
                if not kept:
                    counts["rows_skipped"] += 1
                    continue
                names = ", ".join(quote(name) for name, _ in kept)
                marks = ", ".join("?" * len(kept))
                try:
                    conn.execute(
                        f"INSERT OR IGNORE INTO {quote(table)} ({names}) VALUES ({marks})",
                        [_payload_value(value) for _, value in kept],
                    )
                    counts["rows"] += 1
                except (sqlite3.Error, OverflowError, ValueError):
                    counts["rows_skipped"] += 1
        conn.execute("COMMIT")
        return conn.serialize(), counts
    finally:
        conn.close()


class _PayloadStore:
    """Serialised row-payload images and the byte count of every thread's deserialised copy."""

    def __init__(self):
        self._lock = threading.Lock()
        self._images: OrderedDict[str, tuple[bytes, str]] = OrderedDict()
        self.total = 0  # images plus live copies

    def register(self, schema_id: str, image: bytes) -> None:
        with self._lock:
            old = self._images.pop(schema_id, None)
            if old is not None:
                self.total -= len(old[0])
            self._images[schema_id] = (image, hashlib.sha256(image).hexdigest())
            self.total += len(image)
            self._evict_images_locked(keep=schema_id)

    def _evict_images_locked(self, keep: str) -> None:
        while self.total > limits.LIMITS.payload_cache_bytes and len(self._images) > 1:
            oldest = next(iter(self._images))
            if oldest == keep:
                self._images.move_to_end(oldest)
                oldest = next(iter(self._images))
            image, _ = self._images.pop(oldest)
            self.total -= len(image)

    def has(self, schema_id: str) -> bool:
        with self._lock:
            return schema_id in self._images

    def digest(self, schema_id: str) -> str:
        with self._lock:
            item = self._images.get(schema_id)
        return item[1] if item else f"unregistered:{schema_id}"

    def open_copy(self, schema_id: str, key, conns: dict) -> SandboxConnection:
        """Deserialise this thread's own copy of a registered image, for the connection to be stored under ``key`` in
        ``conns`` (this thread's connections, whose oldest copies it may close to make room)."""
        with self._lock:
            item = self._images.get(schema_id)
            if item is not None:
                self._images.move_to_end(schema_id)
        if item is None:
            raise DatabaseOpenError(f"Error: row-payload database {schema_id!r} is not registered in this process")
        image = item[0]
        self._make_room(len(image), conns)
        conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=True, factory=SandboxConnection)
        conn.deserialize(image)
        _thread_copies()[key] = len(image)
        with self._lock:
            self.total += len(image)
        return conn

    def touch_copy(self, key) -> None:
        copies = _thread_copies()
        if key in copies:
            copies.move_to_end(key)

    def drop_copy(self, key) -> None:
        size = _thread_copies().pop(key, 0)
        if size:
            with self._lock:
                self.total -= size

    def _make_room(self, size: int, conns: dict) -> None:
        """Close this thread's least recently used copies (held in ``conns``) while the store is over its bound."""
        copies = _thread_copies()
        while copies and self.total + size > limits.LIMITS.payload_cache_bytes:
            oldest = next(iter(copies))
            conn = conns.pop(oldest, None)
            if conn is not None:
                conn.close()
            self.drop_copy(oldest)


class _ThreadCopies(OrderedDict):
    """One thread's deserialised payload copies (connection key -> bytes); released when the thread ends."""

    def __del__(self):
        released = sum(self.values())
        if released:
            with _payloads._lock:
                _payloads.total -= released


def _thread_copies() -> _ThreadCopies:
    copies = getattr(_local, "payload_copies", None)
    if copies is None:
        copies = _local.payload_copies = _ThreadCopies()
    return copies


_payloads = _PayloadStore()


_payload_sources: dict[str, str] = {}  # schema id -> digest of the DDL and rows it was registered with (never evicted)
_sources_lock = threading.Lock()


def payload_source_digest(ddl, rows: dict | None) -> str:
    """SHA-256 of what a row-payload database is built from: its DDL and its rows (key order does not matter)."""
    document = [list(map(str, ddl)) if isinstance(ddl, (list, tuple)) else str(ddl or ""), rows or {}]
    try:
        text = json.dumps(document, sort_keys=True, ensure_ascii=False, default=repr)
    except TypeError:  # keys that cannot be sorted together
        text = repr(document)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def register_payload(
    schema_id: str, ddl, rows: dict | None, *, max_bytes: int | None = None
) -> DatabaseRef:
    """Build a row-payload database once (FKs off, failing DDL skipped, INSERT OR IGNORE) and register it.

    A schema with no surviving table builds an empty database: its questions load and their queries fail with
    ``Error: no such table``. Registering an id again with the same DDL and rows returns at once (an evicted image
    is rebuilt); with different DDL or rows it raises ValueError (``Error: ...``), since queries, schemas and cached
    gold results would otherwise mix the two databases under one id. Also raises ValueError when the built database
    is larger than ``max_bytes`` (default: ``LIMITS.payload_max_bytes``).
    """
    schema_id = str(schema_id)
    if max_bytes is None:
        max_bytes = limits.LIMITS.payload_max_bytes
    ref = DatabaseRef(db_id=schema_id, schema_id=schema_id)
    source = payload_source_digest(ddl, rows)
    with _sources_lock:
        known = _payload_sources.get(schema_id)
        if known is None:
            _payload_sources[schema_id] = source  # claimed now; released again if the build fails
    if known is not None and known != source:
        raise ValueError(
            f"Error: row-payload database {schema_id!r} is already registered with different DDL or rows; "
            "give each distinct schema its own id"
        )
    if known is not None and _payloads.has(schema_id):
        return ref
    try:
        image, _counts = build_payload_image(ddl, rows)
        if len(image) > max_bytes:
            raise ValueError(f"Error: row-payload database {schema_id!r} is {len(image)} bytes, above {max_bytes}")
    except BaseException:
        if known is None:
            with _sources_lock:
                _payload_sources.pop(schema_id, None)
        raise
    _payloads.register(schema_id, image)
    return ref
