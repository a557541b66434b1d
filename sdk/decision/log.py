"""The decision log: every :class:`~capgate.decision.Decision` in an embedded SQLite file, or in a
shared PostgreSQL database (``DecisionLog("postgresql://user@host/db")``), with one API.

The log (records, outcomes, reads, the schema and its migrations) is written once, on a small store
protocol (:mod:`capgate.decision._store`) with two implementations: a SQLite file for concurrent
writers on one host (:mod:`capgate.decision._sqlite`), PostgreSQL for many writers on many hosts
(:mod:`capgate.decision.postgres`). Both carry a schema version (``capgate_meta``) and the history
of its migrations (``capgate_migrations``): opening an older log migrates it forward in one
transaction; a log written by a newer capgate is refused.

Queries are stored as a SHA-256 hash (:func:`~capgate.messages.query_hash`); the text only with
``store_text=True``. Outcomes attach later by decision id (:meth:`DecisionLog.record_outcome`, or
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

import json
import os
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any

from pydantic import BaseModel, ConfigDict

from capgate._types import Decision, Outcome
from capgate._validate import check_positive_int
from capgate.backend import Prompt, as_messages
from capgate.decision._schema import (
    COLUMNS,
    INSERT,
    INSERT_SAMPLED,
    SCHEMA_VERSION,
    UPSERT_OUTCOME,
    VERSION,
    Migration,
    is_database_url,
    parse_version,
    writer_id,
)
from capgate.decision._sqlite import SQLiteStore
from capgate.decision._store import Store
from capgate.decision.postgres import PostgresStore
from capgate.errors import DataError
from capgate.messages import query_hash

__all__ = [
    "SCHEMA_VERSION",
    "DecisionLog",
    "LoggedDecision",
    "Migration",
    "PostgresDecisionLog",
    "default_log_path",
    "is_database_url",
    "query_hash",
]


def default_log_path() -> Path:
    """Where the CLI looks when no ``--db`` is given: ``$CAPGATE_DB``, else the user data folder."""
    env = os.environ.get("CAPGATE_DB")
    if env:
        return Path(env)
    from platformdirs import user_data_path  # only needed for the default location

    return user_data_path("capgate") / "decisions.sqlite3"


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


_FROM = "FROM decisions d LEFT JOIN outcomes o ON o.decision_id = d.id"


class DecisionLog:
    """A store of decisions and their outcomes, safe for concurrent writers: an embedded SQLite
    file, or a PostgreSQL database when given a ``postgresql://`` URL, with the same API.

    Args:
        path: The database file (created, with its folder, on first use), or a database URL
            (``postgresql://user[:password]@host[:port]/dbname[?options]``; the tables go into
            the first schema of the connection's ``search_path``).
        store_text: Also store the query text (off by default: only its SHA-256 is kept).
        busy_timeout_s: How long a write waits for another writer's lock before giving up.
        timeout_s: PostgreSQL only (default 10 s): the most any one call, connecting included,
            may take.
        fail_closed: When a :class:`~capgate.Gate` cannot write a decision here, make the gated
            call raise :class:`~capgate.LogUnavailableError` instead of returning the decision (the
            default counts the failure in ``gate.stats.log_failures`` and logs a warning).

    The constructor only stores settings; each thread and process opens its own connection on
    first use. Use it as a context manager, or call :meth:`close`, to close this thread's
    connection. A call that fails for want of the store (locked beyond ``busy_timeout_s``, a
    database down or past ``timeout_s``, disk or I/O errors) raises
    :class:`~capgate.LogUnavailableError`.

    Raises:
        TypeError: ``timeout_s`` given for a SQLite file.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        store_text: bool = False,
        busy_timeout_s: float = 30.0,
        timeout_s: float | None = None,
        fail_closed: bool = False,
    ) -> None:
        self.path: str | Path = path if is_database_url(path) else Path(path)
        self.store_text = store_text
        self.fail_closed = fail_closed
        self.store: Store
        if isinstance(self.path, str):
            timeout_s = 10.0 if timeout_s is None else timeout_s
            self.store = PostgresStore(self.path, busy_timeout_s=busy_timeout_s, timeout_s=timeout_s)
        elif timeout_s is None:
            self.store = SQLiteStore(self.path, busy_timeout_s=busy_timeout_s)
        else:
            raise TypeError(f"`timeout_s` is for a postgresql:// log; {path} is a SQLite file")

    @property
    def location(self) -> str:
        """Where the log is, for messages: the file path (a database URL without its password)."""
        return self.store.location

    def close(self) -> None:
        """Close this thread's connection (others close when their threads end)."""
        self.store.close()

    def __enter__(self) -> DecisionLog:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"DecisionLog({self.location!r}, store_text={self.store_text})"

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
        row = (  # in the order of _schema.INSERT
            decision.id,
            decision.created_at.isoformat(),
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
        self.store.write(INSERT if decision.stopped_by is None else INSERT_SAMPLED, row)
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
            None if outcome.correct is None else int(outcome.correct),
            outcome.mu_hat,
            outcome.samples_used,
            outcome.latency_s,
            outcome.recorded_at.isoformat(),
            outcome.decision_id,
        )
        if not self.store.write(self.store.dialect.render(UPSERT_OUTCOME), values):
            raise DataError(
                f"no decision with id {outcome.decision_id!r} in the log",
                path=self.location,
                field="decision_id",
            )
        return outcome

    # ------------------------------------------------------------------ reads

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
        rows = self.store.read(f"SELECT {COLUMNS} {_FROM} WHERE d.id = ?", (decision_id,))
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
        sql = f"SELECT {COLUMNS} {_FROM}{where} ORDER BY {self.store.dialect.order}"
        if last is not None:
            sql += f" LIMIT {check_positive_int('last', last)}"
        rows = self.store.read(sql, params)
        return [self._row(r) for r in reversed(rows)]

    def count(
        self, *, method: str | None = None, with_outcome: bool | None = None, usable: bool | None = None
    ) -> int:
        """How many logged decisions match the filters (same meaning as in :meth:`decisions`)."""
        where, params = self._filters(method, with_outcome, usable)
        return int(self.store.read(f"SELECT COUNT(*) {_FROM}{where}", params)[0][0])

    def methods(self) -> list[str]:
        """The estimator methods that appear in the log, sorted."""
        return [r[0] for r in self.store.read("SELECT DISTINCT method FROM decisions ORDER BY method")]

    def schema_version(self) -> int:
        """The schema version of the log (after opening, which migrates it: :data:`SCHEMA_VERSION`)."""
        (row,) = self.store.read(VERSION)
        return parse_version(row[0], self.location)

    def migrations(self) -> list[tuple[int, str, str]]:
        """The migrations applied to the log: (version, description, when applied), oldest first."""
        return [
            (int(v), str(d), str(a))
            for v, d, a in self.store.read(
                "SELECT version, description, applied_at FROM capgate_migrations ORDER BY version"
            )
        ]

    def __len__(self) -> int:
        return self.count()

    def integrity_check(self) -> str:
        """``"ok"``, or what is wrong: the store's own check (SQLite's ``PRAGMA integrity_check``),
        the schema version, outcomes without their decision."""
        problems = [str(r[0]) for r in self.store.read(self.store.dialect.integrity) if r[0] != "ok"]
        ((version, orphans),) = self.store.read(
            f"SELECT ({VERSION}), (SELECT COUNT(*) FROM outcomes o LEFT JOIN decisions d"
            " ON d.id = o.decision_id WHERE d.id IS NULL)"
        )
        if version != str(SCHEMA_VERSION):
            problems.append(f"schema version {version!r}, expected {SCHEMA_VERSION}")
        if orphans:
            problems.append(f"{orphans} outcomes without their decision")
        return "; ".join(problems) or "ok"


class PostgresDecisionLog(DecisionLog):
    """``DecisionLog(url, **settings)`` for a ``postgresql://`` URL; anything else is a ``ValueError``."""

    def __init__(self, url: str, **settings: Any) -> None:
        if not is_database_url(url):
            raise ValueError(f"`url` must be a postgresql:// URL; got {url!r}")
        super().__init__(url, **settings)
