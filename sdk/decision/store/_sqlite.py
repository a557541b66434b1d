"""The decision log's embedded store: one SQLite file, safe for concurrent writers on one host.

WAL mode (readers never block the writer) and a busy timeout (concurrent writers wait their
turn). Every write is one ``BEGIN IMMEDIATE`` transaction: a process killed mid-write leaves the
whole row or none; committed rows survive (``synchronous=NORMAL`` in WAL mode loses nothing on a
process crash, at most the last transactions on a power cut). The file is user-only
(:func:`ensure_private_file`).
"""

from __future__ import annotations

import os
import sqlite3
import stat
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from capgate._util.validate import check_positive_number
from capgate.decision.store._store import Connections
from capgate.decision.store.schema import SCHEMA_VERSION, SQLITE, VERSION, migrate
from capgate.errors import DataError, LogUnavailableError


class SQLiteStore:
    """A :class:`~capgate.decision.store._store.Store` in a SQLite file.

    Args:
        path: The database file (created, with its folder, on first use).
        busy_timeout_s: How long a writer waits for another writer's lock before giving up.
    """

    dialect = SQLITE

    def __init__(self, path: Path, *, busy_timeout_s: float = 30.0) -> None:
        self.path = path
        self.busy_timeout_s = busy_timeout_s
        self._connections: Connections[sqlite3.Connection] = Connections(sqlite3.Connection.close)

    @property
    def location(self) -> str:
        """The file's path."""
        return str(self.path)

    def _open(self) -> sqlite3.Connection:
        timeout_s = check_positive_number("busy_timeout_s", self.busy_timeout_s)
        ensure_private_file(self.path)  # user-only: 0600 file, 0700 new folder
        conn = sqlite3.connect(self.path, timeout=timeout_s, isolation_level=None)
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
            _enable_wal(conn, timeout_s, self.location)
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA foreign_keys = ON")
            known = conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'capgate_meta'").fetchone()
            row = conn.execute(VERSION).fetchone() if known else None
            if row is None or row[0] != str(SCHEMA_VERSION):  # else nothing to write: no lock
                with _transaction(conn):
                    migrate(conn.execute, SQLITE, self.location)
        except BaseException as exc:
            conn.close()
            if isinstance(exc, sqlite3.OperationalError) and ("locked" in str(exc) or "busy" in str(exc)):
                raise LogUnavailableError(str(exc), location=self.location) from exc  # a bounded wait ran out
            if isinstance(exc, sqlite3.DatabaseError):
                raise DataError(f"not a usable capgate decision log: {exc}", path=self.location) from exc
            raise
        return conn

    @contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        """This thread's connection; an operational error while it is used is LogUnavailableError."""
        conn = self._connections.get(self._open)
        try:
            yield conn
        except sqlite3.OperationalError as exc:
            raise LogUnavailableError(str(exc), location=self.location) from exc

    def write(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement in one ``BEGIN IMMEDIATE`` transaction; the rows it wrote."""
        with self._connection() as conn, _transaction(conn):
            return conn.execute(sql, params).rowcount

    def write_all(self, batches: Sequence[tuple[str, Sequence[Sequence[Any]]]]) -> list[int]:
        """Run each batch (a statement per row of parameters) in one ``BEGIN IMMEDIATE`` transaction."""
        with self._connection() as conn, _transaction(conn):
            return [conn.executemany(sql, rows).rowcount for sql, rows in batches]

    def read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """The rows of one query."""
        with self._connection() as conn:
            return list(conn.execute(sql, params).fetchall())

    def close(self) -> None:
        """Close this thread's connection."""
        self._connections.drop()


@contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _enable_wal(conn: sqlite3.Connection, timeout_s: float, location: str) -> None:
    # Switching to WAL needs a moment of exclusive access and SQLite does not always call the
    # busy handler for it, so several processes opening a fresh file at once retry here.
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)
            continue
        if str(mode).lower() != "wal":
            raise DataError(f"could not switch the decision log to WAL mode (got {mode!r})", path=location)
        return


PRIVATE_FILE_MODE = 0o600
PRIVATE_DIR_MODE = 0o700


def ensure_private_file(path: Path) -> None:
    """Create ``path`` (and its folder) for its owner only: the log holds what an agent was asked
    and decided. The folder is created 0700; one every user may write to is refused unless it has
    the sticky bit (as ``/tmp``); the file is created, or tightened to, 0600 (SQLite's ``-wal`` and
    ``-shm`` files take its permissions).

    Raises:
        DataError: The folder is writable by every user without the sticky bit, or the file
            belongs to another user (the message names the path and its mode).
    """
    folder = path.parent
    folder.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    if os.name != "posix":  # no POSIX modes to check (Windows ACLs are the user's own)
        return
    mode = folder.stat().st_mode
    if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
        raise DataError(
            f"the decision log's folder is writable by every user (mode {stat.S_IMODE(mode):o}, no "
            "sticky bit), so another user could replace the log: chmod o-w it or choose another folder",
            path=folder,
        )
    # An existing file is checked by name, never opened: closing a descriptor of the database file
    # releases every POSIX lock this process holds on it, SQLite's included, and another process
    # could then delete the WAL this one is still writing to (its later writes lost).
    if not path.exists():
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, PRIVATE_FILE_MODE))
    info = path.stat()
    if info.st_uid != os.geteuid():
        raise DataError(
            f"the decision log belongs to another user (uid {info.st_uid}); refusing to use it",
            path=path,
        )
    if stat.S_IMODE(info.st_mode) & 0o077:
        path.chmod(PRIVATE_FILE_MODE)
