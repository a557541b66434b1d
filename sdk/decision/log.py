"""The decision log: every :class:`~capgate.decision.Decision` in an embedded SQLite store.

One file on disk, in WAL mode so readers never block the writer, with a busy timeout so concurrent
writers (threads or processes on one host) wait their turn instead of failing, one connection per
thread and per process (a forked child opens its own). Every write is one ``BEGIN IMMEDIATE``
transaction, so a process killed mid-write leaves either the whole row or none of it; committed
rows survive the kill (``synchronous=NORMAL`` in WAL mode loses nothing on a process crash, only,
possibly, the last transactions on a power cut).

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
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any

from pydantic import BaseModel, ConfigDict

from capgate._types import Decision, Outcome
from capgate.backend import Prompt, as_messages
from capgate.decision._private import ensure_private_file
from capgate.errors import DataError

__all__ = ["SCHEMA_VERSION", "DecisionLog", "LoggedDecision", "default_log_path", "query_hash"]

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS capgate_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS decisions (
    id              TEXT PRIMARY KEY,
    created_at      TEXT NOT NULL,
    step            TEXT,
    tool            TEXT,
    query_sha256    TEXT,
    query_text      TEXT,
    method          TEXT NOT NULL,
    p               REAL,
    degraded        INTEGER NOT NULL,
    degraded_reason TEXT,
    action          TEXT NOT NULL,
    reason          TEXT NOT NULL,
    budget          INTEGER,
    samples_used    INTEGER,
    latency_s       REAL,
    policy          TEXT,
    decision_json   TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS decisions_by_time ON decisions (created_at);
CREATE INDEX IF NOT EXISTS decisions_by_method ON decisions (method, created_at);
CREATE TABLE IF NOT EXISTS outcomes (
    decision_id  TEXT PRIMARY KEY REFERENCES decisions (id),
    correct      INTEGER,
    mu_hat       REAL,
    samples_used INTEGER NOT NULL,
    latency_s    REAL,
    recorded_at  TEXT NOT NULL
);
"""

_COLUMNS = (
    "d.id, d.created_at, d.step, d.tool, d.query_sha256, d.query_text, d.method, d.p, d.degraded, "
    "d.degraded_reason, d.action, d.reason, d.budget, d.samples_used, d.latency_s, d.policy, "
    "d.decision_json, o.correct, o.mu_hat, o.samples_used, o.latency_s, o.recorded_at, "
    "o.decision_id IS NOT NULL"
)


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
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    decision: Decision
    query_sha256: str | None = None
    query_text: str | None = None
    samples_used: int | None = None
    latency_s: float | None = None
    outcome: Outcome | None = None

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


class DecisionLog:
    """An embedded SQLite store of decisions and their outcomes, safe for concurrent writers.

    Args:
        path: The database file (created, with its folder, on first use).
        store_text: Also store the query text (off by default: only its SHA-256 is kept).
        busy_timeout_s: How long a writer waits for another writer's lock before giving up.

    The constructor only stores settings; the file is opened on first use, once per thread and per
    process. Use it as a context manager, or call :meth:`close`, to close this thread's connection.
    """

    def __init__(self, path: str | Path, *, store_text: bool = False, busy_timeout_s: float = 30.0) -> None:
        self.path = Path(path)
        self.store_text = store_text
        self.busy_timeout_s = busy_timeout_s
        self._local = threading.local()

    # ------------------------------------------------------------------ connections

    def _connection(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
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

    def _open(self) -> sqlite3.Connection:
        if not (isinstance(self.busy_timeout_s, int | float) and self.busy_timeout_s > 0):
            raise ValueError(f"`busy_timeout_s` must be a positive number; got {self.busy_timeout_s!r}")
        ensure_private_file(self.path)  # user-only: 0600 file, 0700 new folder
        conn = sqlite3.connect(self.path, timeout=self.busy_timeout_s, isolation_level=None)
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
            self._enable_wal(conn)
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA foreign_keys = ON")
            with self._transaction(conn):
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                row = conn.execute("SELECT value FROM capgate_meta WHERE key = 'schema_version'").fetchone()
                if row is None:
                    conn.execute(
                        "INSERT INTO capgate_meta (key, value) VALUES ('schema_version', ?)",
                        (str(SCHEMA_VERSION),),
                    )
                elif row[0] != str(SCHEMA_VERSION):
                    raise DataError(
                        f"decision log schema version {row[0]} is not the supported {SCHEMA_VERSION}",
                        path=self.path,
                        field="schema_version",
                    )
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise DataError(f"not a usable capgate decision log: {exc}", path=self.path) from exc
        except BaseException:
            conn.close()
            raise
        return conn

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

    def close(self) -> None:
        """Close this thread's connection (others close when their threads end)."""
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
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
        return f"DecisionLog({str(self.path)!r}, store_text={self.store_text})"

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
        """
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
        row = (
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
        )
        conn = self._connection()
        with self._transaction(conn):
            conn.execute(
                "INSERT OR IGNORE INTO decisions (id, created_at, step, tool, query_sha256, query_text,"
                " method, p, degraded, degraded_reason, action, reason, budget, samples_used, latency_s,"
                " policy, decision_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                row,
            )
            if decision.stopped_by is not None:  # the sampled decision supersedes its first record
                conn.execute(
                    "UPDATE decisions SET samples_used = ?, decision_json = ? WHERE id = ?",
                    (samples_used, row[-1], decision.id),
                )
        return decision.id

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
            raise DataError("an outcome needs `correct` or `mu_hat`", path=self.path, field="correct")
        conn = self._connection()
        with self._transaction(conn):
            if (
                conn.execute("SELECT 1 FROM decisions WHERE id = ?", (outcome.decision_id,)).fetchone()
                is None
            ):
                raise DataError(
                    f"no decision with id {outcome.decision_id!r} in the log",
                    path=self.path,
                    field="decision_id",
                )
            conn.execute(
                "INSERT OR REPLACE INTO outcomes (decision_id, correct, mu_hat, samples_used, latency_s,"
                " recorded_at) VALUES (?, ?, ?, ?, ?, ?)",
                (
                    outcome.decision_id,
                    None if outcome.correct is None else int(outcome.correct),
                    outcome.mu_hat,
                    outcome.samples_used,
                    outcome.latency_s,
                    _iso(outcome.recorded_at),
                ),
            )
        return outcome

    # ------------------------------------------------------------------ reads

    @staticmethod
    def _row(row: tuple[Any, ...]) -> LoggedDecision:
        outcome = None
        if row[22]:
            outcome = Outcome(
                decision_id=row[0],
                correct=None if row[17] is None else bool(row[17]),
                mu_hat=row[18],
                samples_used=row[19],
                latency_s=row[20],
                recorded_at=datetime.fromisoformat(row[21]),
            )
        return LoggedDecision(
            decision=Decision.model_validate_json(row[16]),
            query_sha256=row[4],
            query_text=row[5],
            samples_used=row[13],
            latency_s=row[14],
            outcome=outcome,
        )

    def get(self, decision_id: str) -> LoggedDecision:
        """The logged decision with this id.

        Raises:
            DataError: No decision with that id is in the log.
        """
        row = (
            self._connection()
            .execute(
                f"SELECT {_COLUMNS} FROM decisions d LEFT JOIN outcomes o ON o.decision_id = d.id"
                " WHERE d.id = ?",
                (decision_id,),
            )
            .fetchone()
        )
        if row is None:
            raise DataError(
                f"no decision with id {decision_id!r} in the log", path=self.path, field="decision_id"
            )
        return self._row(row)

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
        sql = f"SELECT {_COLUMNS} FROM decisions d LEFT JOIN outcomes o ON o.decision_id = d.id{where}"
        sql += " ORDER BY d.created_at DESC, d.rowid DESC"
        if last is not None:
            if isinstance(last, bool) or not isinstance(last, int) or last < 1:
                raise ValueError(f"`last` must be a positive integer; got {last!r}")
            sql += f" LIMIT {last}"
        rows = self._connection().execute(sql, params).fetchall()
        return [self._row(r) for r in reversed(rows)]

    def count(
        self, *, method: str | None = None, with_outcome: bool | None = None, usable: bool | None = None
    ) -> int:
        """How many logged decisions match the filters (same meaning as in :meth:`decisions`)."""
        where, params = self._filters(method, with_outcome, usable)
        sql = f"SELECT COUNT(*) FROM decisions d LEFT JOIN outcomes o ON o.decision_id = d.id{where}"
        return int(self._connection().execute(sql, params).fetchone()[0])

    def methods(self) -> list[str]:
        """The estimator methods that appear in the log, sorted."""
        return [
            r[0] for r in self._connection().execute("SELECT DISTINCT method FROM decisions ORDER BY method")
        ]

    def __len__(self) -> int:
        return self.count()

    def integrity_check(self) -> str:
        """SQLite's ``PRAGMA integrity_check`` verdict (``"ok"`` for a sound file)."""
        return str(self._connection().execute("PRAGMA integrity_check").fetchone()[0])
