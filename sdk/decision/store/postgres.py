"""The decision log in a shared PostgreSQL database: many writers on many hosts, one API.

``DecisionLog("postgresql://user@host/db")`` keeps its rows in a :class:`PostgresStore` (psycopg 3,
extra ``postgres``), with the SQLite log's API and CLI (``--db URL``).

- **No loss, no duplicates**: every write is one statement in its own transaction, a decision
  keyed by its id: a retry or a resumed run never writes a row twice, and a writer killed
  mid-write leaves nothing (the server rolls back a transaction whose client is gone).
- **Bounded failure**: connecting (libpq ``connect_timeout``) and every call are bounded by
  ``timeout_s``: a watchdog thread cuts the connection of a call not answered in time (a server
  that hangs, a network dropping packets), and the server cancels longer statements
  (``statement_timeout``). A connection that broke since its last use reconnects and retries once
  within the time left (a server restart); else the call raises
  :class:`~capgate.LogUnavailableError`, which a :class:`~capgate.Gate` counts (or fails the call
  with ``fail_closed=True``).
- **Schema**: a process's first connection migrates the database under an advisory lock, so
  writers starting at once on several hosts migrate it once.

Example (needs a server):
    >>> log = DecisionLog("postgresql://capgate@db.example/capgate", timeout_s=5)  # doctest: +SKIP
    >>> log.record(decision, query="What is 2+2?")  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from capgate._util.extras import import_extra
from capgate._util.validate import check_positive_number
from capgate.decision.store._store import Connections
from capgate.decision.store.schema import POSTGRES, migrate
from capgate.errors import DataError, LogUnavailableError

__all__ = ["PostgresStore"]

T = TypeVar("T")

_LOCK_KEY = 0x6361_7067_6174_65  # "capgate": the advisory lock that serializes migrations


def redact(url: str) -> str:
    """A database URL without its password (for messages and ``repr``).

    Examples:
        >>> redact("postgresql://bob:s3cret@db.example:5432/capgate?password=x&sslmode=require")
        'postgresql://bob:***@db.example:5432/capgate?password=***&sslmode=require'
    """
    url = re.sub(r"^([a-z]+://[^:/@?]*):[^@/?]*@", r"\1:***@", url)
    return re.sub(r"([?&]password=)[^&]*", r"\1***", url)


class _Watch:
    """One watched call: ``fired`` once the watchdog cut its connection."""

    fired = False


class _Watchdog:
    """One daemon thread per process that cuts (``shutdown()`` of its socket: the blocked call
    returns at once with a connection error) the connection of a call past its deadline."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._armed: dict[int, tuple[float, Any, _Watch]] = {}
        self._counter = 0
        self._until: float | None = None
        self._thread: threading.Thread | None = None

    @contextmanager
    def watch(self, conn: Any, deadline: float) -> Iterator[_Watch]:
        watch = _Watch()
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="capgate-log-watchdog", daemon=True)
                self._thread.start()
            key = self._counter = self._counter + 1
            self._armed[key] = (deadline, conn, watch)
            if self._until is None or deadline < self._until:
                self._cond.notify()
        try:
            yield watch
        finally:
            with self._cond:
                self._armed.pop(key, None)

    def _loop(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                for key, (deadline, conn, watch) in list(self._armed.items()):
                    if deadline <= now:
                        del self._armed[key]
                        watch.fired = True
                        _cut(conn)
                self._until = min((d for d, _, _ in self._armed.values()), default=None)
                self._cond.wait(None if self._until is None else max(self._until - now, 0.001))


def _cut(conn: Any) -> None:
    try:
        sock = socket.socket(fileno=os.dup(conn.pgconn.socket))
    except Exception:  # already closed: nothing to cut
        return
    with sock, contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


_WATCHDOG = _Watchdog()


def _reset_watchdog() -> None:  # a forked child has no watchdog thread (and maybe a held lock)
    global _WATCHDOG
    _WATCHDOG = _Watchdog()


os.register_at_fork(after_in_child=_reset_watchdog)


class PostgresStore:
    """A :class:`~capgate.decision.store._store.Store` in a PostgreSQL database.

    Args:
        url: A libpq URL, ``postgresql://user[:password]@host[:port]/dbname[?options]``. The
            tables go into the first schema of the connection's ``search_path``.
        busy_timeout_s: How long a write waits for a row or migration lock (``lock_timeout``).
        timeout_s: The most any one call (connecting included) may take before it raises
            :class:`~capgate.LogUnavailableError`.
    """

    dialect = POSTGRES

    def __init__(self, url: str, *, busy_timeout_s: float = 30.0, timeout_s: float = 10.0) -> None:
        self.url = url
        self.busy_timeout_s = busy_timeout_s
        self.timeout_s = timeout_s
        self._connections: Connections[Any] = Connections(_close_quietly)
        self._deadline = threading.local()  # of the call in progress on this thread

    @property
    def location(self) -> str:
        """The database URL, without its password."""
        return redact(self.url)

    def _open(self) -> Any:
        timeout_s = check_positive_number("timeout_s", self.timeout_s)
        lock_timeout_s = check_positive_number("busy_timeout_s", self.busy_timeout_s)
        psycopg = import_extra("psycopg", "postgres", "a PostgreSQL decision log")
        deadline = getattr(self._deadline, "at", None) or time.monotonic() + timeout_s
        remaining = max(deadline - time.monotonic(), 0.0)
        try:
            conn = psycopg.connect(
                self.url,
                autocommit=True,
                connect_timeout=max(2, math.ceil(remaining)),  # libpq's smallest is 2 s
                application_name="capgate",
            )
        except psycopg.Error as exc:
            raise LogUnavailableError(_message(exc), location=self.location) from exc
        try:
            with _WATCHDOG.watch(conn, deadline) as watch:
                try:
                    conn.execute(
                        "SELECT set_config('statement_timeout', %s, false),"
                        " set_config('lock_timeout', %s, false), set_config('TimeZone', 'UTC', false)",
                        (f"{int(timeout_s * 1000)}ms", f"{int(lock_timeout_s * 1000)}ms"),
                    )
                    with conn.transaction():  # migrate once, whoever connects first
                        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
                        migrate(lambda sql, params: conn.execute(_pg(sql), params), POSTGRES, self.location)
                except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                    message = _message(exc, watch, timeout_s)
                    raise LogUnavailableError(message, location=self.location) from exc
                except psycopg.Error as exc:
                    raise DataError(f"not a usable capgate decision log: {exc}", path=self.location) from exc
        except BaseException:
            conn.close()
            raise
        return conn

    def _run(self, work: Callable[[Any], T]) -> T:
        """Run ``work(connection)`` within ``timeout_s``; :class:`LogUnavailableError` if it cannot be."""
        psycopg = import_extra("psycopg", "postgres", "a PostgreSQL decision log")
        deadline = self._deadline.at = time.monotonic() + check_positive_number("timeout_s", self.timeout_s)
        retried = False
        try:
            while True:
                reused = self._connections.held()
                conn = self._connections.get(self._open)  # connecting raises LogUnavailableError itself
                with _WATCHDOG.watch(conn, deadline) as watch:
                    try:
                        return work(conn)
                    except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                        broken = conn.broken or conn.closed or watch.fired
                        if broken:
                            self._connections.drop()
                        fresh_try = reused and broken and not watch.fired and not retried
                        if fresh_try and time.monotonic() < deadline:
                            retried = True  # the server restarted or dropped us: once more
                            continue
                        raise LogUnavailableError(
                            _message(exc, watch, self.timeout_s), location=self.location
                        ) from exc
        finally:
            self._deadline.at = None

    def write(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement (its own transaction: the connection autocommits); the rows it wrote."""
        return int(self._run(lambda conn: conn.execute(_pg(sql), params).rowcount))

    def write_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        """Run one statement per row of parameters, in one transaction; the rows written."""
        return self.write_all([(sql, rows)])[0]

    def write_all(self, batches: Sequence[tuple[str, Sequence[Sequence[Any]]]]) -> list[int]:
        """Run each batch (a statement per row of parameters), all in one transaction."""

        def work(conn: Any) -> list[int]:
            written = []
            with conn.transaction(), conn.cursor() as cursor:
                for sql, rows in batches:
                    cursor.executemany(_pg(sql), rows)
                    written.append(int(cursor.rowcount))
            return written

        return self._run(work)

    def read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """The rows of one query."""
        return self._run(lambda conn: list(conn.execute(_pg(sql), params).fetchall()))

    def close(self) -> None:
        """Close this thread's connection."""
        self._connections.drop()


def _pg(sql: str) -> str:
    """A statement with ``?`` placeholders in psycopg's ``%s`` style."""
    return sql.replace("?", "%s")


def _close_quietly(conn: Any) -> None:
    with contextlib.suppress(Exception):  # a broken connection may not close cleanly
        conn.close()


def _message(exc: BaseException, watch: _Watch | None = None, timeout_s: float | None = None) -> str:
    if watch is not None and watch.fired:
        return f"no answer from the server within {timeout_s:g} s (timeout_s)"
    text = " ".join(str(exc).split())
    return text or type(exc).__name__
