"""The decision log's schema: its version, the SQLite store's forward migrations, shared SQL."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from capgate.errors import DataError

__all__ = [
    "COLUMNS",
    "META_TABLE",
    "MIGRATIONS_TABLE",
    "SCHEMA_VERSION",
    "SQLITE_MIGRATIONS",
    "Migration",
    "check_not_newer",
    "is_database_url",
    "parse_version",
    "writer_id",
]

SCHEMA_VERSION = 2
"""The schema version this capgate writes; older logs are migrated forward to it when opened."""

Migration = tuple[int, str, tuple[str, ...]]
"""A forward migration: (version it brings the log to, what it does, its SQL statements)."""

META_TABLE = """CREATE TABLE IF NOT EXISTS capgate_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
)"""

_V1 = """
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

MIGRATIONS_TABLE = """CREATE TABLE IF NOT EXISTS capgate_migrations (
    version     INTEGER PRIMARY KEY,
    description TEXT NOT NULL,
    applied_at  TEXT NOT NULL,
    applied_by  TEXT NOT NULL
)"""

SQLITE_MIGRATIONS: tuple[Migration, ...] = (
    (1, "decisions and outcomes", tuple(s.strip() for s in _V1.split(";") if s.strip())),
    (
        2,
        "migration history; the writer (host:pid) of each decision",
        (MIGRATIONS_TABLE, "ALTER TABLE decisions ADD COLUMN writer TEXT"),
    ),
)
"""The SQLite store's forward migrations, oldest first (version 1 is the original schema)."""

COLUMNS = (
    "d.id, d.created_at, d.step, d.tool, d.query_sha256, d.query_text, d.method, d.p, d.degraded, "
    "d.degraded_reason, d.action, d.reason, d.budget, d.samples_used, d.latency_s, d.policy, "
    "d.decision_json, o.correct, o.mu_hat, o.samples_used, o.latency_s, o.recorded_at, "
    "o.decision_id IS NOT NULL, d.writer"
)


def is_database_url(location: object) -> bool:
    """Whether a log location is a database URL (``postgresql://...``) rather than a file path.

    Example:
        >>> is_database_url("postgresql://capgate@db.example/capgate"), is_database_url("d.sqlite3")
        (True, False)
    """
    return isinstance(location, str) and location.split("://", 1)[0] in ("postgresql", "postgres")


def writer_id() -> str:
    """Who writes a decision: ``host:pid`` of this process (stored with each decision)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def check_not_newer(found: int, location: str | Path) -> None:
    """Refuse a log whose schema a newer capgate wrote (a :class:`DataError` naming the log)."""
    if found > SCHEMA_VERSION:
        raise DataError(
            f"decision log schema version {found} is not the supported {SCHEMA_VERSION} "
            "(a newer capgate wrote it: upgrade capgate)",
            path=location,
            field="schema_version",
        )


def parse_version(value: object, location: str) -> int:
    """A stored schema version as an int; a :class:`DataError` naming the log if it is not one."""
    try:
        return int(str(value))
    except ValueError:
        raise DataError(
            f"schema version must be an integer; got {value!r}", path=location, field="schema_version"
        ) from None
