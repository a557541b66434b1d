"""The decision log: every :class:`~capgate.decision.Decision` in an embedded SQLite file, or in a
shared PostgreSQL database (``DecisionLog("postgresql://user@host/db")``), with one API.

The log is written once, on a small store protocol (:mod:`capgate.decision.store._store`): a SQLite
file for concurrent writers on one host (:mod:`capgate.decision.store._sqlite`), PostgreSQL for many
hosts (:mod:`capgate.decision.store.postgres`). Both keep a schema version (``capgate_meta``) and its
migration history (``capgate_migrations``): an older log is migrated forward in one transaction on
opening; one written by a newer capgate is refused. Queries are stored as a SHA-256
(:func:`~capgate.core.messages.query_hash`), the text only with ``store_text=True``. Outcomes attach
later by decision id, one per source (:meth:`DecisionLog.record_outcome`, ``capgate log outcome
DECISION_ID --correct yes``; in bulk :meth:`DecisionLog.import_outcomes`, ``--file OUTCOMES.jsonl``:
:mod:`capgate.decision.store.outcomes`).

Examples:
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

import os
from collections.abc import Sequence
from datetime import UTC
from pathlib import Path
from types import TracebackType
from typing import Any

from pydantic import BaseModel, ConfigDict

from capgate._util.validate import check_positive_int
from capgate.core.backend import Prompt
from capgate.core.messages import query_hash
from capgate.core.types import Decision, Outcome
from capgate.decision.store import outcomes as _outcomes
from capgate.decision.store._sqlite import SQLiteStore
from capgate.decision.store._store import Store, read_in
from capgate.decision.store.calibrations import CalibrationLog
from capgate.decision.store.features import FeatureLog
from capgate.decision.store.postgres import PostgresStore
from capgate.decision.store.schema import (
    COLUMNS,
    INSERT,
    INSERT_SAMPLED,
    OUTCOME_COLUMNS,
    SCHEMA_VERSION,
    VERSION,
    Migration,
    is_database_url,
    parse_version,
    writer_id,
)
from capgate.decision.store.spill import SpilledDecision, SpillFile, default_spill_path, query_fields

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
        outcome: The most recently recorded of its outcomes (``None`` until one is).
        outcomes: Its outcomes, one per source, oldest first.
        writer: ``host:pid`` of the process that recorded it (``None`` for logs older than schema 2).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    decision: Decision
    query_sha256: str | None = None
    query_text: str | None = None
    samples_used: int | None = None
    latency_s: float | None = None
    outcome: Outcome | None = None
    outcomes: tuple[Outcome, ...] = ()
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

    @property
    def calibration(self) -> str | None:
        """The calibration version the decision was made under (``None``: uncalibrated)."""
        return self.decision.calibration

    @property
    def beside(self) -> str | None:
        """For a candidate calibration's shadow decision: the id of the decision it was made beside."""
        return self.decision.beside

    @property
    def value(self) -> float | None:
        """The outcome as one number in [0, 1]: the mean over its sources of each outcome's
        :attr:`~capgate.Outcome.value` (``None`` without an outcome)."""
        values = [v for v in (o.value for o in self.outcomes) if v is not None]
        return sum(values) / len(values) if values else None


_FROM = "FROM decisions d"
_HAS_OUTCOME = "EXISTS (SELECT 1 FROM outcomes o WHERE o.decision_id = d.id)"


class DecisionLog(FeatureLog, CalibrationLog):
    """Decisions and their outcomes, safe for concurrent writers: a SQLite file, or a PostgreSQL
    database for a ``postgresql://`` URL, with one API.

    Args:
        path: The database file (created, with its folder, on first use), or a database URL
            (``postgresql://user[:password]@host[:port]/dbname[?options]``; the tables go into
            the first schema of the connection's ``search_path``).
        store_text: Also store the query text (off by default: only its SHA-256 is kept).
        busy_timeout_s: How long a write waits for another writer's lock before giving up.
        timeout_s: PostgreSQL only (default 10 s): the most any one call, connecting included,
            may take.
        fail_closed: When a :class:`~capgate.Gate` cannot write a decision here, the gated call
            raises :class:`~capgate.LogUnavailableError` (default: the failure is counted in
            ``gate.stats.log_failures``, warned, and the decision kept in the spill file).
        spill: Where a gate keeps the decisions this log cannot take yet (down, or its write
            queue full) until it takes writes again (:mod:`capgate.decision.store.spill`):
            ``"auto"`` (default) beside a SQLite file, or in the user's state folder for a URL; a
            path; or ``None`` to drop them (counted and warned).

    The constructor only stores settings; each thread and process connects on first use (a
    context manager, or :meth:`close`, closes this thread's connection). A call that fails for
    want of the store (locked beyond ``busy_timeout_s``, a database down or past ``timeout_s``,
    disk or I/O errors) raises :class:`~capgate.LogUnavailableError`.

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
        spill: str | Path | None = "auto",
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
        self.spill: SpillFile | None = None
        """Where decisions wait when this log cannot take them (``None``: they are dropped)."""
        if spill is not None:
            where = default_spill_path(self.path if isinstance(self.path, Path) else self.location)
            self.spill = SpillFile(where if spill == "auto" else spill)

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

        Recording a decision id again keeps the first record (a resumed run may re-log), except
        that a sampled ``resample`` decision (``stopped_by`` set) updates its ``samples_used`` and
        stored decision (a graph that logs before sampling ends with the sampling's account).

        Raises:
            LogUnavailableError: The store could not be written.
        """
        if not isinstance(decision, Decision):
            raise TypeError(f"record() takes a capgate Decision; got {type(decision).__name__}")
        if samples_used is not None and samples_used < 0:
            raise ValueError(f"`samples_used` must be >= 0; got {samples_used}")
        if latency_s is not None and latency_s < 0:
            raise ValueError(f"`latency_s` must be >= 0; got {latency_s}")
        return self._insert(decision, *query_fields(query, self.store_text), samples_used, latency_s)

    def record_spilled(self, spilled: SpilledDecision) -> str:
        """Record a decision kept in a spill file (:mod:`capgate.decision.store.spill`); returns its id.

        The query text is kept as the file holds it: a spilled line carries text only because the
        log that spilled it stores text, whatever this handle's ``store_text``.

        Raises:
            LogUnavailableError: The store could not be written.
        """
        decision, sha, text = spilled.decision, spilled.query_sha256, spilled.query_text
        return self._insert(decision, sha, text, spilled.samples_used, None)

    def _insert(
        self,
        decision: Decision,
        query_sha256: str | None,
        text: str | None,
        samples_used: int | None,
        latency_s: float | None,
    ) -> str:
        estimate, at = decision.estimate, decision.created_at
        row = (  # in the order of _schema.INSERT
            decision.id,
            (at if at.utcoffset() is None else at.astimezone(UTC)).isoformat(),  # SQLite compares text
            decision.step,
            decision.tool,
            query_sha256,
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
            int(decision.shadow),
            decision.target,
            decision.calibration,
            decision.beside,
        )
        self.store.write(INSERT if decision.stopped_by is None else INSERT_SAMPLED, row)
        return decision.id

    def record_outcome(
        self,
        decision_id: str | Outcome,
        *,
        correct: bool | None = None,
        mu_hat: float | None = None,
        k: int | None = None,
        score: float | None = None,
        source: str = "unspecified",
        note: str | None = None,
        samples_used: int = 0,
        latency_s: float | None = None,
        replace: bool = False,
    ) -> Outcome:
        """Attach what happened to a logged decision; returns the stored :class:`Outcome`.

        Pass an :class:`Outcome`, or a decision id with its fields: at least one of ``correct``
        (binary), ``mu_hat`` (a rate measured on ``k`` responses) or ``score`` (in [0, 1]);
        ``source``: who judged it (``"user"``, ``"grader"``, ``"test"``, ``"tool"`` or your own
        label); ``note``: free text. One outcome per source: the same judgement again is a no-op
        returning the first record; a different one is an error unless ``replace=True``.

        Raises:
            DataError: No decision with that id is in the log (the message names it), or the
                outcome says nothing.
            OutcomeConflictError: The decision has a different outcome from this source and
                ``replace`` is false.
            LogUnavailableError: The store could not be written.
        """
        if isinstance(decision_id, Outcome):
            outcome = decision_id
        else:
            outcome = Outcome(
                decision_id=decision_id,
                correct=correct,
                mu_hat=mu_hat,
                k=k,
                score=score,
                source=source,
                note=note,
                samples_used=samples_used,
                latency_s=latency_s,
            )
        return _outcomes.attach(self, outcome, replace=replace)

    def import_outcomes(
        self, path: str | Path, *, skip_bad: bool = False, replace: bool = False
    ) -> _outcomes.ImportSummary:
        """Attach the outcomes of a JSONL file: :func:`capgate.decision.store.outcomes.import_outcomes`."""
        return _outcomes.import_outcomes(self, path, skip_bad=skip_bad, replace=replace)

    @staticmethod
    def _row(row: tuple[Any, ...], outcomes: dict[str, list[Outcome]]) -> LoggedDecision:
        attached = tuple(sorted(outcomes.get(row[0], ()), key=lambda o: o.recorded_at))
        return LoggedDecision(
            decision=Decision.model_validate_json(row[16]),
            query_sha256=row[4],
            query_text=row[5],
            samples_used=row[13],
            latency_s=row[14],
            outcome=attached[-1] if attached else None,
            outcomes=attached,
            writer=row[17],
        )

    def _read(self, where: str, params: Sequence[Any], limit: str = "") -> list[LoggedDecision]:
        """Decisions matching ``where``, newest first, each with its outcomes (read for the ids of
        the rows returned: a decision written meanwhile cannot shift a ``limit`` window)."""
        selected = f"{_FROM}{where} ORDER BY {self.store.dialect.order}{limit}"
        rows = self.store.read(f"SELECT {COLUMNS} {selected}", params)
        outcomes: dict[str, list[Outcome]] = {}
        sql = f"SELECT {OUTCOME_COLUMNS} FROM outcomes o WHERE o.decision_id IN ({{ids}})"
        for found in read_in(self.store, sql, [r[0] for r in rows]):
            outcome = _outcomes.outcome_of_row(found)
            outcomes.setdefault(outcome.decision_id, []).append(outcome)
        return [self._row(r, outcomes) for r in rows]

    def get(self, decision_id: str) -> LoggedDecision:
        """The logged decision with this id.

        Raises:
            DataError: No decision with that id is in the log.
        """
        rows = self._read(" WHERE d.id = ?", (decision_id,))
        if not rows:
            raise _outcomes.unknown(decision_id, self.location)
        return rows[0]

    @staticmethod
    def _filters(method: str | None, with_outcome: bool | None, usable: bool | None) -> tuple[str, list[Any]]:
        where: list[str] = []
        params: list[Any] = []
        if method is not None:
            where.append("d.method = ?")
            params.append(method)
        if with_outcome is not None:
            where.append(_HAS_OUTCOME if with_outcome else f"NOT {_HAS_OUTCOME}")
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
        limit = "" if last is None else f" LIMIT {check_positive_int('last', last)}"
        return self._read(where, params, limit)[::-1]

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
        the schema version, outcomes without their decision, feature vectors whose size is not
        their dimension's."""
        problems = [str(r[0]) for r in self.store.read(self.store.dialect.integrity) if r[0] != "ok"]
        ((version, orphans, malformed),) = self.store.read(
            f"SELECT ({VERSION}), (SELECT COUNT(*) FROM outcomes o LEFT JOIN decisions d"
            " ON d.id = o.decision_id WHERE d.id IS NULL),"
            " (SELECT COUNT(*) FROM features WHERE encoding <> 'float16' OR LENGTH(data) <> 2 * dim)"
        )
        if version != str(SCHEMA_VERSION):
            problems.append(f"schema version {version!r}, expected {SCHEMA_VERSION}")
        if orphans:
            problems.append(f"{orphans} outcomes without their decision")
        if malformed:
            problems.append(f"{malformed} feature vectors of an unknown encoding or the wrong size")
        return "; ".join(problems) or "ok"


class PostgresDecisionLog(DecisionLog):
    """``DecisionLog(url, **settings)`` for a ``postgresql://`` URL; anything else is a ``ValueError``."""

    def __init__(self, url: str, **settings: Any) -> None:
        if not is_database_url(url):
            raise ValueError(f"`url` must be a postgresql:// URL; got {url!r}")
        super().__init__(url, **settings)
