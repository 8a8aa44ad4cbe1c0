"""What a database holds, as a hash: SHA-256 of files (cached by size and mtime) and of row-payload images."""

from __future__ import annotations

import hashlib
import os
import threading
from stat import S_ISREG

from t2s.env.databases.opening import DatabaseRef, regular_file
from t2s.env.databases.payloads import _payloads


def file_checksum(path) -> str:
    """SHA-256 of a regular file's bytes (hex); OSError for anything else (``opening.regular_file``)."""
    digest = hashlib.sha256()
    with regular_file(path) as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


_hash_lock = threading.Lock()
_file_hashes: dict[tuple, str] = {}


_immutable_hashes: dict[DatabaseRef, str] = {}  # benchmark files opened immutable: SQLite assumes they never change


def database_hash(ref: DatabaseRef) -> str:
    """A content hash of the database, computed once per (path, size, mtime) and then cached.

    A file opened ``immutable`` is never looked at again: its first hash stays its hash, as SQLite assumes too.
    """
    if ref.schema_id is not None:
        return "payload:" + _payloads.digest(ref.schema_id)
    if ref.engine == "postgres":
        from t2s.env.databases.engines import server_hash

        return server_hash(ref)
    if ref.immutable:
        found = _immutable_hashes.get(ref)
        if found is None:
            found = _file_hash(ref)
            if not found.startswith("missing:"):  # a file that appears later is hashed then
                _immutable_hashes[ref] = found
        return found
    return _file_hash(ref)


def _file_hash(ref: DatabaseRef) -> str:
    """The file's hash, and its ``-wal`` file's when one is there (its frames are part of the database)."""
    try:
        stat = os.stat(ref.path)
    except OSError:
        return f"missing:{ref.path}"
    if not S_ISREG(stat.st_mode):  # no database: opening it says so (a FIFO read here would block for ever)
        return f"missing:{ref.path}"
    wal_path = ref.path + "-wal"
    try:
        wal = os.stat(wal_path)
        wal_key = (wal.st_size, wal.st_mtime_ns) if wal.st_size else None
    except OSError:
        wal_key = None
    key = (ref.path, stat.st_size, stat.st_mtime_ns, wal_key)
    found = _file_hashes.get(key)
    if found is None:
        with _hash_lock:
            found = _file_hashes.get(key)
            if found is None:
                found = file_checksum(ref.path)
                if wal_key is not None:
                    found += "+wal:" + file_checksum(wal_path)
                _file_hashes[key] = found
    return found
