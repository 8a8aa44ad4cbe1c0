"""Wall-clock deadlines for running statements: tickets and the watchdog thread that interrupts overdue ones.

A statement, fetching included, is aborted once its deadline has passed: the watchdog interrupts it
(``Connection.interrupt``, which costs the running statement nothing), and the connection's progress handler checks
the deadline too, every ``LIMITS.progress_interval`` VM instructions (see :func:`progress_check`). The handler needs
the GIL each time it runs, a hand-off between threads that a short interval would pay thousands of times a step; the
watchdog keeps the deadline tight.

A statement being run is watched through its *ticket*, a one-element list ``[deadline]`` made for that statement
alone and listed in ``_watching`` under its connection. A ticket is emptied exactly once (``list.pop`` is atomic under
the GIL): by the statement when it ends, or by the watchdog when it claims an overdue statement to interrupt it.

Why an interrupt can never reach a later statement:

1. the watchdog calls ``interrupt()`` only for a ticket it emptied itself, and only while holding ``_interrupt_lock``,
   taken before it emptied the ticket;
2. :func:`stop_watching` returns only after emptying its ticket itself (the watchdog's claim then fails, so nothing is
   interrupted for that statement), or, when the watchdog emptied it first, after taking ``_interrupt_lock``, that
   is once the watchdog's ``interrupt()`` has returned;
3. a connection belongs to one thread, so its next statement starts only after the previous one stopped being watched.

So every ``interrupt()`` call ends while its own statement is still running. One that lands after the statement
finished, with nothing running on the connection, is cleared by SQLite when the next statement starts. Statements take
no lock on the usual path: a dict write to start, a list pop and a dict pop to end.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time

from t2s.env.databases import limits

_watch_lock = threading.Lock()  # starting the watchdog thread
_interrupt_lock = threading.Lock()  # held by the watchdog from claiming a ticket until its interrupt() has returned
_watching: dict[sqlite3.Connection, list] = {}  # connection -> ticket [deadline] of the statement it is running
_watchdog_started = False
_monotonic = time.monotonic


def start_watching(conn: sqlite3.Connection, ticket: list) -> None:
    """Put the statement about to run on ``conn`` under its ticket's deadline."""
    if not _watchdog_started:
        _start_watchdog()
    _watching[conn] = ticket


def stop_watching(conn: sqlite3.Connection, ticket: list) -> None:
    """End the watch on a statement; returns only once no interrupt meant for it can still arrive."""
    try:
        ticket.pop()  # ended before any claim: the watchdog will not interrupt for this statement
    except IndexError:  # the watchdog claimed it: wait until its interrupt() has returned
        with _interrupt_lock:
            pass
    _watching.pop(conn, None)


def progress_check(conn) -> int:
    """The progress handler's backstop to the watchdog: 1 (stop) for a statement found past its deadline."""
    ticket = _watching.get(conn)
    if ticket is None:  # no watched statement is running: nothing is under a deadline
        return 0
    try:
        if _monotonic() <= ticket[0]:
            return 0
    except IndexError:  # the watchdog has claimed the statement and is interrupting it
        return 1
    conn.timed_out = True
    return 1


def _start_watchdog() -> None:
    global _watchdog_started
    with _watch_lock:
        if not _watchdog_started:
            threading.Thread(target=_watchdog, name="t2s-sql-deadlines", daemon=True).start()
            _watchdog_started = True


def _watchdog() -> None:
    """Interrupt every statement past its deadline (see the ticket rules above)."""
    while True:
        time.sleep(limits.LIMITS.watchdog_poll)
        now = time.monotonic()
        for conn, ticket in list(_watching.items()):  # a snapshot: statements start and end meanwhile
            try:
                if now <= ticket[0]:
                    continue
            except IndexError:  # the statement has ended
                continue
            with _interrupt_lock:
                try:
                    ticket.pop()  # the claim; it fails once the statement has ended
                except IndexError:
                    continue
                conn.timed_out = True
                try:
                    conn.interrupt()
                except sqlite3.Error:
                    pass


def _reset_watchdog_in_child() -> None:
    """A forked child has no watchdog thread, and may hold a copy of a lock that was taken at the fork."""
    global _watch_lock, _interrupt_lock, _watching, _watchdog_started
    _watch_lock, _interrupt_lock, _watching, _watchdog_started = threading.Lock(), threading.Lock(), {}, False


os.register_at_fork(after_in_child=_reset_watchdog_in_child)
