"""The store protocol: the few operations a :class:`~capgate.decision.DecisionLog` needs from a
database, and the per-thread connections both stores keep."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from capgate.decision.store.schema import Dialect

C = TypeVar("C")
_CHUNK = 500  # ids per read (well under SQLite's bound on query parameters)


@runtime_checkable
class Store(Protocol):
    """Where a decision log keeps its rows: a SQLite file (``_sqlite.SQLiteStore``) or a PostgreSQL
    database (``postgres.PostgresStore``). Statements use ``?`` placeholders and the SQL of
    :mod:`capgate.decision.store.schema`, rendered for :attr:`dialect`. Each thread and process
    connects on first use, migrating the schema. A store not reached or written in its time raises
    :class:`~capgate.LogUnavailableError`; one that is not a usable log, a :class:`~capgate.DataError`.
    """

    dialect: Dialect

    @property
    def location(self) -> str:
        """Where the store is, for messages (never a password)."""

    def write(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement in its own transaction; the number of rows it wrote."""

    def write_all(self, batches: Sequence[tuple[str, Sequence[Sequence[Any]]]]) -> list[int]:
        """Run each (statement, rows of parameters) batch, all in one transaction; the rows each
        batch wrote."""

    def read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """The rows of one query."""

    def close(self) -> None:
        """Close this thread's connection (others close when their threads end)."""


def read_in(store: Store, sql: str, ids: Sequence[str]) -> Iterator[tuple[Any, ...]]:
    """The rows of ``sql`` for each distinct id of ``ids``, read in chunks (``{ids}`` in ``sql``: the
    chunk's placeholders)."""
    unique = list(dict.fromkeys(ids))
    for start in range(0, len(unique), _CHUNK):
        chunk = unique[start : start + _CHUNK]
        yield from store.read(sql.format(ids=", ".join("?" * len(chunk))), chunk)


class Connections(Generic[C]):
    """One connection per thread and process, opened on first use. One inherited across ``fork()``
    is neither used nor closed in the child (a reference keeps GC from closing it under the parent).
    """

    def __init__(self, close: Callable[[C], None]) -> None:
        self._close = close
        self._local = threading.local()

    def held(self) -> bool:
        """Whether this thread of this process has its connection open."""
        return getattr(self._local, "conn", None) is not None and self._local.pid == os.getpid()

    def get(self, open_: Callable[[], C]) -> C:
        """This thread's connection; ``open_()`` makes it the first time."""
        if self.held():
            conn: C = self._local.conn
            return conn
        self.drop()
        conn = open_()
        self._local.conn, self._local.pid = conn, os.getpid()
        return conn

    def drop(self) -> None:
        """Close and forget this thread's connection (one inherited across fork is only forgotten)."""
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is None:
            return
        if self._local.pid == os.getpid():
            self._close(conn)
        else:
            self._local.inherited = [*getattr(self._local, "inherited", []), conn]
