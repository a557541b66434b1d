"""The decision log in a shared PostgreSQL database: many writers on many hosts, one API.

``DecisionLog("postgresql://user@host/db")`` opens a :class:`PostgresDecisionLog` (psycopg 3,
extra ``postgres``): the same ``record``, ``record_outcome``, reads, ``monitor`` and CLI
(``--db URL``) as the embedded SQLite log.

- **No loss, no duplicates**: every write is one statement in its own transaction; a decision is
  keyed by its id (``INSERT ... ON CONFLICT DO NOTHING``), so a writer that retries, or a resumed
  run that logs again, never writes a row twice, and a writer killed mid-write leaves nothing (the
  server rolls back a transaction whose client is gone).
- **Bounded failure**: connecting is bounded by ``timeout_s`` (libpq ``connect_timeout``), and so
  is every call: a watchdog thread cuts the connection of a call that has not been answered in
  time (a server that hangs, a network that drops packets), and the server cancels statements
  running longer (``statement_timeout``). A call on a connection that broke since its last use
  reconnects and retries once within the time left (a server restart); otherwise the call
  raises :class:`~capgate.LogUnavailableError`. A :class:`~capgate.Gate` counts that failure and
  returns its decision, or fails the call (``fail_closed=True``).
- **Schema**: ``capgate_meta`` holds the schema version and ``capgate_migrations`` the history;
  the first connection of a process migrates the database forward under an advisory lock, so
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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, ClassVar, TypeVar

from capgate.decision._schema import (
    META_TABLE,
    MIGRATIONS_TABLE,
    SCHEMA_VERSION,
    Migration,
    check_not_newer,
    parse_version,
    writer_id,
)
from capgate.decision.log import DecisionLog, register_url_store
from capgate.errors import DataError, LogUnavailableError

__all__ = ["POSTGRES_MIGRATIONS", "PostgresDecisionLog"]

T = TypeVar("T")

_V1 = (
    """CREATE TABLE IF NOT EXISTS decisions (
    seq             BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
    id              TEXT PRIMARY KEY,
    created_at      TIMESTAMPTZ NOT NULL,
    step            TEXT,
    tool            TEXT,
    query_sha256    TEXT,
    query_text      TEXT,
    method          TEXT NOT NULL,
    p               DOUBLE PRECISION,
    degraded        INTEGER NOT NULL,
    degraded_reason TEXT,
    action          TEXT NOT NULL,
    reason          TEXT NOT NULL,
    budget          INTEGER,
    samples_used    INTEGER,
    latency_s       DOUBLE PRECISION,
    policy          TEXT,
    decision_json   TEXT NOT NULL
)""",
    "CREATE INDEX IF NOT EXISTS decisions_by_time ON decisions (created_at)",
    "CREATE INDEX IF NOT EXISTS decisions_by_method ON decisions (method, created_at)",
    """CREATE TABLE IF NOT EXISTS outcomes (
    decision_id  TEXT PRIMARY KEY REFERENCES decisions (id),
    correct      INTEGER,
    mu_hat       DOUBLE PRECISION,
    samples_used INTEGER NOT NULL,
    latency_s    DOUBLE PRECISION,
    recorded_at  TIMESTAMPTZ NOT NULL
)""",
)

POSTGRES_MIGRATIONS: tuple[Migration, ...] = (
    (1, "decisions and outcomes", _V1),
    (
        2,
        "migration history; the writer (host:pid) of each decision",
        (MIGRATIONS_TABLE, "ALTER TABLE decisions ADD COLUMN IF NOT EXISTS writer TEXT"),
    ),
)
"""The PostgreSQL store's forward migrations, oldest first (the same versions as SQLite's)."""

_LOCK_KEY = 0x6361_7067_6174_65  # "capgate": the advisory lock that serializes migrations

_DECISION_COLUMNS = (
    "id, created_at, step, tool, query_sha256, query_text, method, p, degraded, degraded_reason,"
    " action, reason, budget, samples_used, latency_s, policy, decision_json, writer"
)
_INSERT = (
    f"INSERT INTO decisions ({_DECISION_COLUMNS}) VALUES ({', '.join(['%s'] * 18)})"
    " ON CONFLICT (id) DO NOTHING"
)
# A sampled resample supersedes its first record (see DecisionLog.record).
_INSERT_SAMPLED = (
    f"INSERT INTO decisions ({_DECISION_COLUMNS}) VALUES ({', '.join(['%s'] * 18)})"
    " ON CONFLICT (id) DO UPDATE SET samples_used = EXCLUDED.samples_used,"
    " decision_json = EXCLUDED.decision_json"
)
_UPSERT_OUTCOME = (
    "INSERT INTO outcomes (decision_id, correct, mu_hat, samples_used, latency_s, recorded_at)"
    " SELECT %s::text, %s::integer, %s::double precision, %s::integer, %s::double precision,"
    " %s::timestamptz WHERE EXISTS (SELECT 1 FROM decisions WHERE id = %s)"
    " ON CONFLICT (decision_id) DO UPDATE SET correct = EXCLUDED.correct, mu_hat = EXCLUDED.mu_hat,"
    " samples_used = EXCLUDED.samples_used, latency_s = EXCLUDED.latency_s,"
    " recorded_at = EXCLUDED.recorded_at"
)


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError as exc:  # pragma: no cover - the extra is installed in CI
        raise ImportError(
            "a PostgreSQL decision log needs psycopg 3: pip install 'capgate[postgres]'"
        ) from exc
    return psycopg


def redact(url: str) -> str:
    """A database URL without its password (for messages and ``repr``).

    Example:
        >>> redact("postgresql://bob:s3cret@db.example:5432/capgate?password=x&sslmode=require")
        'postgresql://bob:***@db.example:5432/capgate?password=***&sslmode=require'
    """
    url = re.sub(r"^([a-z]+://[^:/@?]*):[^@/?]*@", r"\1:***@", url)
    return re.sub(r"([?&]password=)[^&]*", r"\1***", url)


class _Watch:
    """One watched call: ``fired`` once the watchdog cut its connection."""

    fired = False


class _Watchdog:
    """One daemon thread per process that cuts the connection of a call past its deadline.

    Cutting is ``shutdown()`` of the connection's socket: the call blocked on it returns at once
    with a connection error, whatever the server does.
    """

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
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.close()


_WATCHDOG = _Watchdog()


def _reset_watchdog() -> None:  # a forked child has no watchdog thread (and maybe a held lock)
    global _WATCHDOG
    _WATCHDOG = _Watchdog()


os.register_at_fork(after_in_child=_reset_watchdog)


class PostgresDecisionLog(DecisionLog):
    """The decision log in a PostgreSQL database (open it as ``DecisionLog(url)``).

    Args:
        url: A libpq URL, ``postgresql://user[:password]@host[:port]/dbname[?options]``. The
            tables go into the first schema of the connection's ``search_path``.
        store_text: Also store the query text (off by default: only its SHA-256 is kept).
        busy_timeout_s: How long a write waits for a row or migration lock (``lock_timeout``).
        timeout_s: The most any one call (connecting included) may take before it raises
            :class:`~capgate.LogUnavailableError`.
        fail_closed: As for :class:`~capgate.decision.DecisionLog`: a gate whose write fails
            raises instead of returning the decision.

    The constructor only stores settings; each thread and process opens its own connection on
    first use (psycopg is imported then).
    """

    _ORDER: ClassVar[str] = "d.created_at DESC, d.seq DESC"

    def __init__(
        self,
        url: str,
        *,
        store_text: bool = False,
        busy_timeout_s: float = 30.0,
        timeout_s: float = 10.0,
        fail_closed: bool = False,
    ) -> None:
        self.url = url
        self.store_text = store_text
        self.busy_timeout_s = busy_timeout_s
        self.timeout_s = timeout_s
        self.fail_closed = fail_closed
        self._local = threading.local()

    @property
    def location(self) -> str:
        """The database URL, without its password."""
        return redact(self.url)

    # ------------------------------------------------------------------ connections

    def _open(self) -> Any:
        for name in ("busy_timeout_s", "timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, int | float) and value > 0):
                raise ValueError(f"`{name}` must be a positive number; got {value!r}")
        psycopg = _psycopg()
        deadline = getattr(self._local, "deadline", None) or time.monotonic() + self.timeout_s
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
                        (f"{int(self.timeout_s * 1000)}ms", f"{int(self.busy_timeout_s * 1000)}ms"),
                    )
                    self._migrate(conn)
                except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                    message = _message(exc, watch, self.timeout_s)
                    raise LogUnavailableError(message, location=self.location) from exc
                except psycopg.Error as exc:
                    raise DataError(f"not a usable capgate decision log: {exc}", path=self.location) from exc
        except BaseException:
            conn.close()
            raise
        return conn

    def _migrate(self, conn: Any) -> None:
        """Bring the database to :data:`SCHEMA_VERSION`, once, whoever connects first."""
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
            conn.execute(META_TABLE)
            row = conn.execute("SELECT value FROM capgate_meta WHERE key = 'schema_version'").fetchone()
            found = 0 if row is None else parse_version(row[0], self.location)
            check_not_newer(found, self.location)
            if found == SCHEMA_VERSION:
                return
            for version, _, statements in POSTGRES_MIGRATIONS:
                if version > found:
                    for statement in statements:
                        conn.execute(statement)
            now = datetime.now(UTC).isoformat()
            for version, description, _ in POSTGRES_MIGRATIONS:
                applied = (now, writer_id()) if version > found else ("before the history", "unknown")
                conn.execute(
                    "INSERT INTO capgate_migrations VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
                    (version, description, *applied),
                )
            conn.execute(
                "INSERT INTO capgate_meta (key, value) VALUES ('schema_version', %s)"
                " ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                (str(SCHEMA_VERSION),),
            )

    def _discard(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None and getattr(self._local, "pid", None) == os.getpid():
            with contextlib.suppress(Exception):  # a broken connection may not close cleanly
                conn.close()

    def _run(self, work: Callable[[Any], T]) -> T:
        """Run ``work(connection)`` within ``timeout_s``; :class:`LogUnavailableError` if it cannot be."""
        psycopg = _psycopg()
        deadline = time.monotonic() + self.timeout_s
        self._local.deadline = deadline
        retried = False
        try:
            while True:
                reused = getattr(self._local, "conn", None) is not None
                conn = self._connection()  # connecting raises LogUnavailableError itself
                with _WATCHDOG.watch(conn, deadline) as watch:
                    try:
                        return work(conn)
                    except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                        broken = conn.broken or conn.closed or watch.fired
                        if broken:
                            self._discard()
                        fresh_try = reused and broken and not watch.fired and not retried
                        if fresh_try and time.monotonic() < deadline:
                            retried = True  # the server restarted or dropped us: once more
                            continue
                        raise LogUnavailableError(
                            _message(exc, watch, self.timeout_s), location=self.location
                        ) from exc
        finally:
            self._local.deadline = None

    # ------------------------------------------------------------------ writes and reads

    def _insert(self, row: tuple[Any, ...], *, sampled: bool) -> None:
        sql = _INSERT_SAMPLED if sampled else _INSERT
        self._run(lambda conn: conn.execute(sql, row))

    def _upsert_outcome(self, values: tuple[Any, ...]) -> bool:
        written = self._run(lambda conn: conn.execute(_UPSERT_OUTCOME, (*values, values[0])).rowcount)
        return bool(written)

    def _fetchall(self, sql: str, params: list[Any] | tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        query = sql.replace("?", "%s")
        return self._run(lambda conn: list(conn.execute(query, params).fetchall()))

    def integrity_check(self) -> str:
        """``"ok"``, or what is wrong: the schema version, or outcomes without their decision."""
        ((version, orphans),) = self._fetchall(
            "SELECT (SELECT value FROM capgate_meta WHERE key = 'schema_version'),"
            " (SELECT COUNT(*) FROM outcomes o LEFT JOIN decisions d ON d.id = o.decision_id"
            " WHERE d.id IS NULL)"
        )
        problems = []
        if version != str(SCHEMA_VERSION):
            problems.append(f"schema version {version!r}, expected {SCHEMA_VERSION}")
        if orphans:
            problems.append(f"{orphans} outcomes without their decision")
        return "; ".join(problems) or "ok"

    def __repr__(self) -> str:
        return f"DecisionLog({self.location!r}, store_text={self.store_text})"


def _message(exc: BaseException, watch: _Watch | None = None, timeout_s: float | None = None) -> str:
    if watch is not None and watch.fired:
        return f"no answer from the server within {timeout_s:g} s (timeout_s)"
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


register_url_store(("postgresql", "postgres"), PostgresDecisionLog)
