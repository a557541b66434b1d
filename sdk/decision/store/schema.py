"""The decision log's schema and SQL, written once for both stores, and its forward migration.

Statements use ``?`` placeholders; the few words where SQLite and PostgreSQL differ (a float or a
timestamp column, the insertion-order column) are fields of a :class:`Dialect`, rendered into the
templates below for each store.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from capgate.errors import DataError

SCHEMA_VERSION = 4
"""The schema version this capgate writes; older logs are migrated forward to it when opened."""

Migration = tuple[int, str, tuple[str, ...]]
"""A forward migration: (version it brings the log to, what it does, its SQL statements)."""


@dataclass(frozen=True)
class Dialect:
    """Where the stores' SQL differs: the words rendered into this module's templates."""

    real: str  # a double-precision float column
    time: str  # a timestamp column (SQLite keeps ISO-8601 text)
    seq: str  # the insertion-order column of `decisions` (SQLite has its rowid)
    if_not_exists: str  # the ADD COLUMN guard, where the database has one
    order: str  # newest first: time, then insertion
    integrity: str  # a statement whose one row says "ok" for a sound store
    json_shadow: str  # 1 if decision_json says shadow: true, else 0
    json_target: str  # decision_json's target (NULL if none)
    same: str  # null-safe equality
    json_calibration: str  # decision_json's calibration version (NULL if none)
    json_beside: str  # decision_json's beside: the id a candidate's shadow decision was made beside
    blob: str  # a binary column
    serial: str  # an integer primary key that counts up (the insertion order)

    def render(self, template: str) -> str:
        """A template with this dialect's words filled in."""
        return template.format(**asdict(self))

    @property
    def migrations(self) -> tuple[Migration, ...]:
        """The forward migrations, oldest first (version 1 is the original schema)."""
        return tuple((v, what, tuple(self.render(s) for s in sql)) for v, what, sql in _MIGRATIONS)


SQLITE = Dialect(
    "REAL",
    "TEXT",
    "",
    "",
    "d.created_at DESC, d.rowid DESC",
    "PRAGMA integrity_check",
    "CASE WHEN json_extract(decision_json, '$.shadow') = 1 THEN 1 ELSE 0 END",
    "json_extract(decision_json, '$.target')",
    "IS",
    "json_extract(decision_json, '$.calibration')",
    "json_extract(decision_json, '$.beside')",
    "BLOB",
    "INTEGER PRIMARY KEY",
)
POSTGRES = Dialect(
    "DOUBLE PRECISION",
    "TIMESTAMPTZ",
    "seq BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,\n    ",
    "IF NOT EXISTS ",
    "d.created_at DESC, d.seq DESC",
    "SELECT 'ok'",
    "CASE WHEN decision_json::jsonb ->> 'shadow' = 'true' THEN 1 ELSE 0 END",
    "decision_json::jsonb ->> 'target'",
    "IS NOT DISTINCT FROM",
    "decision_json::jsonb ->> 'calibration'",
    "decision_json::jsonb ->> 'beside'",
    "BYTEA",
    "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
)

META_TABLE = """CREATE TABLE IF NOT EXISTS capgate_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
)"""

MIGRATIONS_TABLE = """CREATE TABLE IF NOT EXISTS capgate_migrations (
    version     INTEGER PRIMARY KEY,
    description TEXT NOT NULL,
    applied_at  TEXT NOT NULL,
    applied_by  TEXT NOT NULL
)"""

_V1 = (
    """CREATE TABLE IF NOT EXISTS decisions (
    {seq}id              TEXT PRIMARY KEY,
    created_at      {time} NOT NULL,
    step            TEXT,
    tool            TEXT,
    query_sha256    TEXT,
    query_text      TEXT,
    method          TEXT NOT NULL,
    p               {real},
    degraded        INTEGER NOT NULL,
    degraded_reason TEXT,
    action          TEXT NOT NULL,
    reason          TEXT NOT NULL,
    budget          INTEGER,
    samples_used    INTEGER,
    latency_s       {real},
    policy          TEXT,
    decision_json   TEXT NOT NULL
)""",
    "CREATE INDEX IF NOT EXISTS decisions_by_time ON decisions (created_at)",
    "CREATE INDEX IF NOT EXISTS decisions_by_method ON decisions (method, created_at)",
    """CREATE TABLE IF NOT EXISTS outcomes (
    decision_id  TEXT PRIMARY KEY REFERENCES decisions (id),
    correct      INTEGER,
    mu_hat       {real},
    samples_used INTEGER NOT NULL,
    latency_s    {real},
    recorded_at  {time} NOT NULL
)""",
)

OUTCOME_VALUE = "COALESCE(CAST(o.correct AS {real}), o.mu_hat, o.score)"
"""An outcome row's value in [0, 1] (template): correct as 1/0, else mu_hat, else score."""
_SET_Y = (
    f"UPDATE decisions SET outcome_y = (SELECT AVG({OUTCOME_VALUE}) FROM outcomes o"
    " WHERE o.decision_id = decisions.id)"
)
UPDATE_Y = _SET_Y + " WHERE id = ?"
"""Refresh a decision's ``outcome_y`` (template; parameter: its id), in the transaction that
writes its outcomes: the mean value over its sources, which the report reads off its index."""

_V3 = (
    "ALTER TABLE decisions ADD COLUMN {if_not_exists}shadow INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE decisions ADD COLUMN {if_not_exists}target TEXT",
    "UPDATE decisions SET shadow = {json_shadow}, target = {json_target}",
    """CREATE TABLE outcomes_v3 (
    decision_id  TEXT NOT NULL REFERENCES decisions (id),
    source       TEXT NOT NULL,
    correct      INTEGER,
    mu_hat       {real},
    k            INTEGER,
    score        {real},
    note         TEXT,
    samples_used INTEGER NOT NULL,
    latency_s    {real},
    recorded_at  {time} NOT NULL,
    PRIMARY KEY (decision_id, source)
)""",
    "INSERT INTO outcomes_v3 (decision_id, source, correct, mu_hat, samples_used, latency_s, recorded_at)"
    " SELECT decision_id, 'unspecified', correct, mu_hat, samples_used, latency_s, recorded_at FROM outcomes",
    "DROP TABLE outcomes",
    "ALTER TABLE outcomes_v3 RENAME TO outcomes",
    "ALTER TABLE decisions ADD COLUMN {if_not_exists}outcome_y {real}",
    _SET_Y,
    # covering indexes of the report (capgate.decision.analysis.report): it reads only these columns
    "CREATE INDEX IF NOT EXISTS decisions_for_report ON decisions (policy, step, tool, target, shadow,"
    " created_at, action, p, degraded, latency_s, outcome_y, samples_used, id)",
    "CREATE INDEX IF NOT EXISTS outcomes_values ON outcomes (decision_id, source, correct, mu_hat, score)",
)

_V4 = (
    "ALTER TABLE decisions ADD COLUMN {if_not_exists}calibration TEXT",
    "ALTER TABLE decisions ADD COLUMN {if_not_exists}beside TEXT",
    # rows written before version 4 have neither key in their JSON: only rows that do are rewritten
    "UPDATE decisions SET calibration = {json_calibration}, beside = {json_beside}"
    " WHERE {json_calibration} IS NOT NULL OR {json_beside} IS NOT NULL",
    "DROP INDEX IF EXISTS decisions_for_report",
    "CREATE INDEX IF NOT EXISTS decisions_for_report ON decisions (policy, step, tool, target, shadow,"
    " calibration, created_at, action, p, degraded, latency_s, outcome_y, samples_used, beside, id)",
    # a candidate's shadow decisions, found by the decision they were made beside
    "CREATE INDEX IF NOT EXISTS decisions_beside ON decisions (beside) WHERE beside IS NOT NULL",
    """CREATE TABLE IF NOT EXISTS feature_specs (
    spec_sha256 TEXT PRIMARY KEY,
    spec_json   TEXT NOT NULL
)""",
    """CREATE TABLE IF NOT EXISTS features (
    decision_id TEXT PRIMARY KEY REFERENCES decisions (id),
    spec_sha256 TEXT NOT NULL REFERENCES feature_specs (spec_sha256),
    encoding    TEXT NOT NULL,
    dim         INTEGER NOT NULL,
    data        {blob} NOT NULL,
    recorded_at {time} NOT NULL
)""",
    """CREATE TABLE IF NOT EXISTS calibration_events (
    seq      {serial},
    at       {time} NOT NULL,
    event    TEXT NOT NULL,
    target   TEXT,
    version  TEXT NOT NULL,
    path     TEXT NOT NULL,
    previous TEXT,
    writer   TEXT
)""",
)

_MIGRATIONS: tuple[Migration, ...] = (
    (1, "decisions and outcomes", _V1),
    (
        2,
        "migration history; the writer (host:pid) of each decision",
        (MIGRATIONS_TABLE, "ALTER TABLE decisions ADD COLUMN {if_not_exists}writer TEXT"),
    ),
    (
        3,
        "outcomes per source (binary, rate with k, or score; a note); shadow, target and outcome_y"
        " columns and the report's covering indexes",
        _V3,
    ),
    (
        4,
        "calibration version and beside (a candidate's shadow decision) per decision; reader features"
        " (features, feature_specs); calibration events (shadow, promote, rollback)",
        _V4,
    ),
)

VERSION = "SELECT value FROM capgate_meta WHERE key = 'schema_version'"

_DECISION = (
    "INSERT INTO decisions (id, created_at, step, tool, query_sha256, query_text, method, p, degraded,"
    " degraded_reason, action, reason, budget, samples_used, latency_s, policy, decision_json, writer,"
    f" shadow, target, calibration, beside) VALUES ({', '.join('?' * 22)}) ON CONFLICT (id) DO "
)
INSERT = _DECISION + "NOTHING"
"""A decision row (:meth:`DecisionLog._insert`); logging it again keeps the first."""
INSERT_SAMPLED = _DECISION + (
    "UPDATE SET samples_used = excluded.samples_used, decision_json = excluded.decision_json"
)
"""A sampled resample's row, which supersedes its first record."""
_OUTCOME = (
    "INSERT INTO outcomes (decision_id, source, correct, mu_hat, k, score, note, samples_used, latency_s,"
    " recorded_at) SELECT id, CAST(? AS TEXT), CAST(? AS INTEGER), CAST(? AS {real}), CAST(? AS INTEGER),"
    " CAST(? AS {real}), CAST(? AS TEXT), CAST(? AS INTEGER), CAST(? AS {real}), CAST(? AS {time})"
    " FROM decisions WHERE id = ? ON CONFLICT (decision_id, source) DO "
)
INSERT_OUTCOME = _OUTCOME + "NOTHING"
"""An outcome (template; parameters: source, correct, mu_hat, k, score, note, samples_used, latency_s,
recorded_at, decision_id): written if its decision is in the log and has none from that source yet."""
REPLACE_OUTCOME = _OUTCOME + (
    "UPDATE SET correct = excluded.correct, mu_hat = excluded.mu_hat, k = excluded.k, score = excluded.score,"
    " note = excluded.note, samples_used = excluded.samples_used, latency_s = excluded.latency_s,"
    " recorded_at = excluded.recorded_at"
)
"""An outcome that replaces the one from the same source (template, parameters as :data:`INSERT_OUTCOME`)."""

COLUMNS = (
    "d.id, d.created_at, d.step, d.tool, d.query_sha256, d.query_text, d.method, d.p, d.degraded, "
    "d.degraded_reason, d.action, d.reason, d.budget, d.samples_used, d.latency_s, d.policy, "
    "d.decision_json, d.writer"
)
"""A decision row's columns, as :meth:`DecisionLog._row` reads them."""
OUTCOME_COLUMNS = (
    "o.decision_id, o.source, o.correct, o.mu_hat, o.k, o.score, o.note, o.samples_used, o.latency_s,"
    " o.recorded_at"
)
"""An outcome row's columns, as :func:`capgate.decision._outcomes.outcome_of_row` reads them."""


def migrate(run: Callable[[str, Sequence[Any]], Any], dialect: Dialect, location: str) -> None:
    """Bring a store to :data:`SCHEMA_VERSION`, inside the caller's write transaction (which holds
    the store's migration lock). ``run(sql, params)`` executes a statement and returns a cursor."""
    run(META_TABLE, ())
    row = run(VERSION, ()).fetchone()
    found = 0 if row is None else parse_version(row[0], location)
    if found > SCHEMA_VERSION:
        raise DataError(
            f"decision log schema version {found} is not the supported {SCHEMA_VERSION} "
            "(a newer capgate wrote it: upgrade capgate)",
            path=location,
            field="schema_version",
        )
    if found == SCHEMA_VERSION:
        return
    for version, _, statements in dialect.migrations:
        if version > found:
            for statement in statements:
                run(statement, ())
    # A log that was at version 1 says so in the history, without the date (nobody recorded it).
    now = datetime.now(UTC).isoformat()
    for version, description, _ in _MIGRATIONS:
        applied = (now, writer_id()) if version > found else ("before the history", "unknown")
        run(
            "INSERT INTO capgate_migrations VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (version, description, *applied),
        )
    run(
        "INSERT INTO capgate_meta (key, value) VALUES ('schema_version', ?)"
        " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        (str(SCHEMA_VERSION),),
    )


def is_database_url(location: object) -> bool:
    """Whether a log location is a database URL (``postgresql://...``) rather than a file path.

    Examples:
        >>> is_database_url("postgresql://capgate@db.example/capgate"), is_database_url("d.sqlite3")
        (True, False)
    """
    return isinstance(location, str) and location.split("://", 1)[0] in ("postgresql", "postgres")


def writer_id() -> str:
    """Who writes a decision: ``host:pid`` of this process (stored with each decision)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def parse_version(value: object, location: str) -> int:
    """A stored schema version as an int; a :class:`DataError` naming the log if it is not one."""
    try:
        return int(str(value))
    except ValueError:
        raise DataError(
            f"schema version must be an integer; got {value!r}", path=location, field="schema_version"
        ) from None
