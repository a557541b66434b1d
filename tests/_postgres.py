"""A real PostgreSQL server for the decision-log tests, and a TCP proxy that fails on demand.

The server is the one ``scripts/with-vllm-server.sh`` starts (``scripts/postgres-server.sh``)
and exports as ``CAPGATE_TEST_POSTGRES_URL``. Without it the tests fail under CI (env ``CI``
set); elsewhere :func:`server_url` starts a throwaway one with the same script, or skips, with
that reason, where PostgreSQL is not installed. Each test gets its own schema (``fresh_url``).

The proxy (:class:`FaultProxy`) sits between a log and that real server, only to make faults a
server will not make on request: stop answering (``freeze``) and drop every connection (``cut``).
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from _pg_server import ThrowawayPostgres  # noqa: E402

_STARTED: list[ThrowawayPostgres] = []  # the one server this process started, if any


def server_url() -> str:
    """The test server's URL (see the module docstring for where it comes from)."""
    url = os.environ.get("CAPGATE_TEST_POSTGRES_URL")
    if url:
        return url
    msg = (
        "CAPGATE_TEST_POSTGRES_URL is not set: run the tests under "
        "`bash scripts/with-vllm-server.sh .venv/bin/python -m pytest`, which starts PostgreSQL"
    )
    if os.environ.get("CI"):
        pytest.fail(msg)
    if not _STARTED:
        server = ThrowawayPostgres("capgate-pg-test-")
        try:
            server.start()
        except RuntimeError as exc:
            server.stop()
            pytest.skip(f"{msg}; starting one here failed: {exc}")
        _STARTED.append(server)
    return _STARTED[0].url


def stop_started_server() -> None:
    """Stop the server :func:`server_url` started, if it started one."""
    if _STARTED:
        _STARTED.pop().stop()


def fresh_url(base: str) -> str:
    """A URL whose tables go into a new, empty schema of the test server."""
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}options=-csearch_path%3D{schema}"


def fetch(location: str | Path, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Rows of raw SQL (``?`` placeholders) on a log's store, bypassing capgate."""
    if isinstance(location, str) and location.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(location, autocommit=True) as conn:
            return list(conn.execute(sql.replace("?", "%s"), params).fetchall())
    import sqlite3

    with sqlite3.connect(location) as conn:
        return list(conn.execute(sql, params).fetchall())


def execute(location: str | Path, sql: str, params: tuple[Any, ...] = ()) -> None:
    """Run one raw statement on a log's store and commit it."""
    if isinstance(location, str) and location.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(location, autocommit=True) as conn:
            conn.execute(sql.replace("?", "%s"), params)
        return
    import sqlite3

    with sqlite3.connect(location) as conn:
        conn.execute(sql, params)


class FaultProxy:
    """A TCP forwarder on 127.0.0.1 to a real server; ``freeze()`` holds every byte (the server
    seems hung), ``thaw()`` forwards again, ``cut()`` closes every open connection."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.frozen = threading.Event()
        self.stopped = threading.Event()
        self.pairs: list[tuple[socket.socket, socket.socket]] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, base: str) -> str:
        """``base`` (a URL to the real server) pointed at the proxy instead."""
        from urllib.parse import urlsplit, urlunsplit

        parts = urlsplit(base)
        netloc = parts.netloc.rsplit("@", 1)
        host = f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host))

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            with self.lock:
                self.pairs.append((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        try:
            while not self.stopped.is_set():
                if self.frozen.is_set():
                    self.stopped.wait(0.02)
                    continue
                ready, _, _ = select.select([a, b], [], [], 0.05)
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    peers[sock].sendall(data)
        except OSError:
            return
        finally:
            a.close()
            b.close()

    def freeze(self) -> None:
        self.frozen.set()

    def thaw(self) -> None:
        self.frozen.clear()

    def cut(self) -> None:
        with self.lock:
            pairs, self.pairs = self.pairs, []
        for a, b in pairs:
            for sock in (a, b):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def close(self) -> None:
        self.stopped.set()
        self.listener.close()
        self.cut()
