"""The decision log: every :class:`~capgate.decision.Decision` in an embedded SQLite store, or in a
shared PostgreSQL database (``DecisionLog("postgresql://user@host/db")``, see
:mod:`capgate.decision.postgres`), with one API.

One file on disk, in WAL mode so readers never block the writer, with a busy timeout so concurrent
writers (threads or processes on one host) wait their turn instead of failing, one connection per
thread and per process (a forked child opens its own). Every write is one ``BEGIN IMMEDIATE``
transaction, so a process killed mid-write leaves either the whole row or none of it; committed
rows survive the kill (``synchronous=NORMAL`` in WAL mode loses nothing on a process crash, only,
possibly, the last transactions on a power cut).

Both stores carry a schema version (``capgate_meta``) and the history of the migrations applied
to them (``capgate_migrations``); opening an older log migrates it forward in one transaction, and
a log written by a newer capgate is refused.

Queries are stored as a SHA-256 hash; the text is kept only with ``store_text=True``. The file is
created user-only (0600) and its folder checked (:mod:`capgate.decision._private`).
Outcomes attach later by decision id (:meth:`DecisionLog.record_outcome`, or
``capgate log outcome DECISION_ID --correct yes``).

Example:
    >>> import tempfile, os
    >>> from capgate import Estimate
    >>> from capgate.decision import Decision
    >>> path = os.path.join(tempfile.mkdtemp(), "decisions.sqlite3")
    >>> with DecisionLog(path) as log:
    ...     d = Decision(action="answer", estimate=Estimate(p=0.9, method="probe"), reason="p >= 0.8")
    ...     _ = log.record(d, query="What is 2+2?")
    ...     _ = log.record_outcome(d.id, correct=True)
    ...     log.get(d.id).outcome.correct
    True
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from capgate._types import Decision, Outcome
from capgate.backend import Prompt, as_messages
from capgate.decision._private import ensure_private_file
from capgate.decision._schema import (
    COLUMNS,
    META_TABLE,
    SCHEMA_VERSION,
    SQLITE_MIGRATIONS,
    Migration,
    check_not_newer,
    is_database_url,
    parse_version,
    writer_id,
)
from capgate.errors import DataError, LogUnavailableError

__all__ = [
    "SCHEMA_VERSION",
    "DecisionLog",
    "LoggedDecision",
    "Migration",
    "default_log_path",
    "is_database_url",
    "query_hash",
    "register_url_store",
]


def default_log_path() -> Path:
    """Where the CLI looks when no ``--db`` is given: ``$CAPGATE_DB``, else the user data folder."""
    env = os.environ.get("CAPGATE_DB")
    if env:
        return Path(env)
    from platformdirs import user_data_path  # only needed for the default location

    return user_data_path("capgate") / "decisions.sqlite3"


def query_hash(query: Prompt) -> str:
    """SHA-256 (hex) of a query, as stored in the log.

    The query is normalized to chat messages first, so a bare string and the same text as a single
    user turn hash alike; the hash covers the whole transcript.

    Example:
        >>> query_hash("hi") == query_hash([{"role": "user", "content": "hi"}])
        True
    """
    canonical = json.dumps(as_messages(query), ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


class LoggedDecision(BaseModel):
    """A decision as read back from the log, with its outcome if one was recorded.

    Attributes:
        decision: The decision, exactly as recorded.
        query_sha256: Hash of the query (``None`` if no query was given).
        query_text: The query text, only if the log stores text.
        samples_used: Responses drawn for the decision, if recorded.
        latency_s: Seconds the decision took, if recorded.
        outcome: The outcome, once one was recorded.
        writer: ``host:pid`` of the process that recorded it (``None`` for logs older than schema 2).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    decision: Decision
    query_sha256: str | None = None
    query_text: str | None = None
    samples_used: int | None = None
    latency_s: float | None = None
    outcome: Outcome | None = None
    writer: str | None = None

    @property
    def id(self) -> str:
        """The decision id."""
        return self.decision.id

    @property
    def method(self) -> str:
        """The estimator method of the decision's estimate."""
        return self.decision.estimate.method

    @property
    def p(self) -> float | None:
        """The predicted capability (``None`` if the estimate was unavailable)."""
        return self.decision.estimate.p


def _iso(moment: datetime) -> str:
    return moment.isoformat()


_URL_STORES: dict[str, type[DecisionLog]] = {}
"""Stores for database URLs, by scheme; :mod:`capgate.decision.postgres` registers itself here
(``capgate.decision`` imports it, so it is registered before any log is opened)."""


def register_url_store(schemes: tuple[str, ...], store: type[DecisionLog]) -> None:
    """Make ``DecisionLog("<scheme>://...")`` open ``store`` (a subclass of :class:`DecisionLog`)."""
    for scheme in schemes:
        _URL_STORES[scheme] = store


class DecisionLog:
    """A store of decisions and their outcomes, safe for concurrent writers: an embedded SQLite
    file, or a PostgreSQL database when given a ``postgresql://`` URL (a
    :class:`~capgate.decision.postgres.PostgresDecisionLog`, with the same API).

    Args:
        path: The database file (created, with its folder, on first use), or a database URL.
        store_text: Also store the query text (off by default: only its SHA-256 is kept).
        busy_timeout_s: How long a writer waits for another writer's lock before giving up.
        fail_closed: When a :class:`~capgate.Gate` cannot write a decision here, make the gated
            call raise :class:`~capgate.LogUnavailableError` instead of returning the decision (the
            default counts the failure in ``gate.stats.log_failures`` and logs a warning).

    The constructor only stores settings; the file is opened on first use, once per thread and per
    process. Use it as a context manager, or call :meth:`close`, to close this thread's connection.
    A write that fails for want of the store (locked beyond ``busy_timeout_s``, disk or I/O
    errors) raises :class:`~capgate.LogUnavailableError`.
    """

    _ORDER: ClassVar[str] = "d.created_at DESC, d.rowid DESC"

    def __new__(cls, path: str | Path, **settings: Any) -> DecisionLog:
        """A database URL opens the store registered for its scheme; anything else, a SQLite file."""
        if cls is DecisionLog and is_database_url(path):
            assert isinstance(path, str)
            scheme = path.split("://", 1)[0]
            if scheme not in _URL_STORES:  # pragma: no cover - capgate.decision registers postgres
                raise ValueError(f"no decision-log store for {scheme}:// URLs")
            return super().__new__(_URL_STORES[scheme])
        return super().__new__(cls)

    def __init__(
        self,
        path: str | Path,
        *,
        store_text: bool = False,
        busy_timeout_s: float = 30.0,
        fail_closed: bool = False,
    ) -> None:
        self.path = Path(path)
        self.store_text = store_text
        self.busy_timeout_s = busy_timeout_s
        self.fail_closed = fail_closed
        self._local = threading.local()

    @property
    def location(self) -> str:
        """Where the log is, for messages: the file path (a database URL without its password)."""
        return str(self.path)

    # ------------------------------------------------------------------ connections

    def _connection(self) -> Any:
        conn = getattr(self._local, "conn", None)
        if conn is not None and getattr(self._local, "pid", None) == os.getpid():
            return conn
        # A connection inherited across fork() must not be used (nor closed) in the child; keep a
        # reference so garbage collection does not close it under the parent.
        if conn is not None:
            self._local.inherited = [*getattr(self._local, "inherited", []), conn]
        conn = self._open()
        self._local.conn = conn
        self._local.pid = os.getpid()
        return conn

    def _open(self) -> Any:
        if not (isinstance(self.busy_timeout_s, int | float) and self.busy_timeout_s > 0):
            raise ValueError(f"`busy_timeout_s` must be a positive number; got {self.busy_timeout_s!r}")
        ensure_private_file(self.path)  # user-only: 0600 file, 0700 new folder
        conn = sqlite3.connect(self.path, timeout=self.busy_timeout_s, isolation_level=None)
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
            self._enable_wal(conn)
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA foreign_keys = ON")
            if self._stored_version(conn) != str(SCHEMA_VERSION):  # else nothing to write: no lock
                with self._transaction(conn):
                    self._migrate(conn)
        except sqlite3.OperationalError as exc:
            conn.close()
            if "locked" in str(exc) or "busy" in str(exc):  # other writers: a bounded wait ran out
                raise LogUnavailableError(str(exc), location=self.location) from exc
            raise DataError(f"not a usable capgate decision log: {exc}", path=self.path) from exc
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise DataError(f"not a usable capgate decision log: {exc}", path=self.path) from exc
        except BaseException:
            conn.close()
            raise
        return conn

    @staticmethod
    def _stored_version(conn: sqlite3.Connection) -> str | None:
        if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'capgate_meta'").fetchone() is None:
            return None
        row = conn.execute("SELECT value FROM capgate_meta WHERE key = 'schema_version'").fetchone()
        return None if row is None else str(row[0])

    def _migrate(self, conn: sqlite3.Connection) -> None:
        """Bring the log to :data:`SCHEMA_VERSION` (inside the caller's write transaction)."""
        conn.execute(META_TABLE)
        row = conn.execute("SELECT value FROM capgate_meta WHERE key = 'schema_version'").fetchone()
        found = 0 if row is None else parse_version(row[0], self.location)
        check_not_newer(found, self.path)
        for version, _, statements in SQLITE_MIGRATIONS:
            if version > found:
                for statement in statements:
                    conn.execute(statement)
        if found < SCHEMA_VERSION:
            # The history table exists from version 2 on; a log that was at version 1 already
            # says so, without the date (nobody recorded it).
            now = _iso(datetime.now(UTC))
            for version, description, _ in SQLITE_MIGRATIONS:
                applied = (now, writer_id()) if version > found else ("before the history", "unknown")
                conn.execute(
                    "INSERT OR IGNORE INTO capgate_migrations VALUES (?, ?, ?, ?)",
                    (version, description, *applied),
                )
        if found != SCHEMA_VERSION:
            conn.execute(
                "INSERT OR REPLACE INTO capgate_meta (key, value) VALUES ('schema_version', ?)",
                (str(SCHEMA_VERSION),),
            )

    def _enable_wal(self, conn: sqlite3.Connection) -> None:
        # Switching to WAL needs a moment of exclusive access and SQLite does not always call the
        # busy handler for it, so several processes opening a fresh file at once retry here.
        deadline = time.monotonic() + self.busy_timeout_s
        while True:
            try:
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
                continue
            if str(mode).lower() != "wal":
                raise DataError(
                    f"could not switch the decision log to WAL mode (got {mode!r})", path=self.path
                )
            return

    @staticmethod
    @contextmanager
    def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    @contextmanager
    def _writing(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; a store that fails under it raises :class:`LogUnavailableError`."""
        conn = self._connection()
        try:
            with self._transaction(conn):
                yield conn
        except sqlite3.OperationalError as exc:
            raise LogUnavailableError(str(exc), location=self.location) from exc

    def close(self) -> None:
        """Close this thread's connection (others close when their threads end)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None and getattr(self._local, "pid", None) == os.getpid():
            conn.close()
        self._local.conn = None

    def __enter__(self) -> DecisionLog:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.location!r}, store_text={self.store_text})"

    # ------------------------------------------------------------------ writes

    def record(
        self,
        decision: Decision,
        *,
        query: Prompt | None = None,
        samples_used: int | None = None,
        latency_s: float | None = None,
    ) -> str:
        """Record a decision; returns its id.

        Args:
            decision: The policy's decision.
            query: The query it was made on: hashed always, stored as text only with
                ``store_text=True``.
            samples_used: Responses drawn to reach it (e.g. a CAS run's ``samples_used``).
            latency_s: Seconds it took; defaults to the estimate's ``cost.latency_s``.

        Recording the same decision id again keeps the first record (a resumed run may re-log
        what it had already logged without duplicating it), except that a sampled ``resample``
        decision (``stopped_by`` set) updates the record's ``samples_used`` and stored decision:
        a graph that logs the decision before sampling still ends with the sampling's account.

        Raises:
            LogUnavailableError: The store could not be written.
        """
        row = self._decision_row(decision, query, samples_used, latency_s)
        self._insert(row, sampled=decision.stopped_by is not None)
        return decision.id

    def _decision_row(
        self, decision: Decision, query: Prompt | None, samples_used: int | None, latency_s: float | None
    ) -> tuple[Any, ...]:
        """The decisions row of a decision (checked); ``decision_json`` is second to last."""
        if not isinstance(decision, Decision):
            raise TypeError(f"record() takes a capgate Decision; got {type(decision).__name__}")
        if samples_used is not None and samples_used < 0:
            raise ValueError(f"`samples_used` must be >= 0; got {samples_used}")
        if latency_s is not None and latency_s < 0:
            raise ValueError(f"`latency_s` must be >= 0; got {latency_s}")
        estimate = decision.estimate
        text: str | None = None
        if query is not None and self.store_text:
            text = query if isinstance(query, str) else json.dumps(as_messages(query), ensure_ascii=False)
        return (
            decision.id,
            _iso(decision.created_at),
            decision.step,
            decision.tool,
            None if query is None else query_hash(query),
            text,
            estimate.method,
            estimate.p,
            int(decision.degraded or estimate.degraded),
            estimate.reason if (decision.degraded or estimate.degraded) else None,
            decision.action,
            decision.reason,
            decision.budget,
            samples_used,
            estimate.cost.latency_s if latency_s is None else latency_s,
            decision.policy,
            decision.model_dump_json(),
            writer_id(),
        )

    def _insert(self, row: tuple[Any, ...], *, sampled: bool) -> None:
        with self._writing() as conn:
            conn.execute(
                "INSERT OR IGNORE INTO decisions (id, created_at, step, tool, query_sha256, query_text,"
                " method, p, degraded, degraded_reason, action, reason, budget, samples_used, latency_s,"
                " policy, decision_json, writer) VALUES (" + ", ".join("?" * 18) + ")",
                row,
            )
            if sampled:  # the sampled decision supersedes its first record
                conn.execute(
                    "UPDATE decisions SET samples_used = ?, decision_json = ? WHERE id = ?",
                    (row[13], row[16], row[0]),
                )

    def record_outcome(
        self,
        decision_id: str | Outcome,
        *,
        correct: bool | None = None,
        mu_hat: float | None = None,
        samples_used: int = 0,
        latency_s: float | None = None,
    ) -> Outcome:
        """Attach what happened to a logged decision; returns the stored :class:`Outcome`.

        Pass an :class:`Outcome`, or a decision id with the outcome's fields. At least one of
        ``correct`` and ``mu_hat`` must be known. Recording again for the same decision replaces
        the earlier outcome (a correction).

        Raises:
            DataError: No decision with that id is in the log, or the outcome says nothing.
            LogUnavailableError: The store could not be written.
        """
        if isinstance(decision_id, Outcome):
            outcome = decision_id
        else:
            outcome = Outcome(
                decision_id=decision_id,
                correct=correct,
                mu_hat=mu_hat,
                samples_used=samples_used,
                latency_s=latency_s,
            )
        if outcome.correct is None and outcome.mu_hat is None:
            raise DataError("an outcome needs `correct` or `mu_hat`", path=self.location, field="correct")
        values = (
            outcome.decision_id,
            None if outcome.correct is None else int(outcome.correct),
            outcome.mu_hat,
            outcome.samples_used,
            outcome.latency_s,
            _iso(outcome.recorded_at),
        )
        if not self._upsert_outcome(values):
            raise DataError(
                f"no decision with id {outcome.decision_id!r} in the log",
                path=self.location,
                field="decision_id",
            )
        return outcome

    def _upsert_outcome(self, values: tuple[Any, ...]) -> bool:
        """Store an outcome row; ``False`` (nothing written) if its decision is not in the log."""
        with self._writing() as conn:
            if conn.execute("SELECT 1 FROM decisions WHERE id = ?", (values[0],)).fetchone() is None:
                return False
            conn.execute(
                "INSERT OR REPLACE INTO outcomes (decision_id, correct, mu_hat, samples_used, latency_s,"
                " recorded_at) VALUES (?, ?, ?, ?, ?, ?)",
                values,
            )
        return True

    # ------------------------------------------------------------------ reads

    def _fetchall(self, sql: str, params: list[Any] | tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Rows of one read (``?`` placeholders)."""
        try:
            return list(self._connection().execute(sql, params).fetchall())
        except sqlite3.OperationalError as exc:
            raise LogUnavailableError(str(exc), location=self.location) from exc

    @staticmethod
    def _row(row: tuple[Any, ...]) -> LoggedDecision:
        outcome = None
        if row[22]:
            recorded = row[21]
            outcome = Outcome(
                decision_id=row[0],
                correct=None if row[17] is None else bool(row[17]),
                mu_hat=row[18],
                samples_used=row[19],
                latency_s=row[20],
                recorded_at=recorded if isinstance(recorded, datetime) else datetime.fromisoformat(recorded),
            )
        return LoggedDecision(
            decision=Decision.model_validate_json(row[16]),
            query_sha256=row[4],
            query_text=row[5],
            samples_used=row[13],
            latency_s=row[14],
            outcome=outcome,
            writer=row[23],
        )

    def get(self, decision_id: str) -> LoggedDecision:
        """The logged decision with this id.

        Raises:
            DataError: No decision with that id is in the log.
        """
        rows = self._fetchall(
            f"SELECT {COLUMNS} FROM decisions d LEFT JOIN outcomes o ON o.decision_id = d.id WHERE d.id = ?",
            (decision_id,),
        )
        if not rows:
            raise DataError(
                f"no decision with id {decision_id!r} in the log", path=self.location, field="decision_id"
            )
        return self._row(rows[0])

    @staticmethod
    def _filters(method: str | None, with_outcome: bool | None, usable: bool | None) -> tuple[str, list[Any]]:
        where: list[str] = []
        params: list[Any] = []
        if method is not None:
            where.append("d.method = ?")
            params.append(method)
        if with_outcome is not None:
            where.append("o.decision_id IS " + ("NOT NULL" if with_outcome else "NULL"))
        if usable is not None:
            where.append("d.p IS " + ("NOT NULL" if usable else "NULL"))
        return (" WHERE " + " AND ".join(where) if where else ""), params

    def decisions(
        self,
        *,
        method: str | None = None,
        with_outcome: bool | None = None,
        usable: bool | None = None,
        last: int | None = None,
    ) -> list[LoggedDecision]:
        """Logged decisions, oldest first.

        Args:
            method: Only those whose estimate came from this estimator method.
            with_outcome: ``True``: only those with an outcome; ``False``: only those without.
            usable: ``True``: only those whose estimate had a value p; ``False``: only unavailable ones.
            last: Only the most recent ``last`` of them (still returned oldest first).
        """
        where, params = self._filters(method, with_outcome, usable)
        sql = f"SELECT {COLUMNS} FROM decisions d LEFT JOIN outcomes o ON o.decision_id = d.id{where}"
        sql += f" ORDER BY {self._ORDER}"
        if last is not None:
            if isinstance(last, bool) or not isinstance(last, int) or last < 1:
                raise ValueError(f"`last` must be a positive integer; got {last!r}")
            sql += f" LIMIT {last}"
        rows = self._fetchall(sql, params)
        return [self._row(r) for r in reversed(rows)]

    def count(
        self, *, method: str | None = None, with_outcome: bool | None = None, usable: bool | None = None
    ) -> int:
        """How many logged decisions match the filters (same meaning as in :meth:`decisions`)."""
        where, params = self._filters(method, with_outcome, usable)
        sql = f"SELECT COUNT(*) FROM decisions d LEFT JOIN outcomes o ON o.decision_id = d.id{where}"
        return int(self._fetchall(sql, params)[0][0])

    def methods(self) -> list[str]:
        """The estimator methods that appear in the log, sorted."""
        return [r[0] for r in self._fetchall("SELECT DISTINCT method FROM decisions ORDER BY method")]

    def schema_version(self) -> int:
        """The schema version of the log (after opening, which migrates it: :data:`SCHEMA_VERSION`)."""
        (row,) = self._fetchall("SELECT value FROM capgate_meta WHERE key = 'schema_version'")
        return parse_version(row[0], self.location)

    def migrations(self) -> list[tuple[int, str, str]]:
        """The migrations applied to the log: (version, description, when applied), oldest first."""
        return [
            (int(v), str(d), str(a))
            for v, d, a in self._fetchall(
                "SELECT version, description, applied_at FROM capgate_migrations ORDER BY version"
            )
        ]

    def __len__(self) -> int:
        return self.count()

    def integrity_check(self) -> str:
        """SQLite's ``PRAGMA integrity_check`` verdict (``"ok"`` for a sound file)."""
        return str(self._fetchall("PRAGMA integrity_check")[0][0])
