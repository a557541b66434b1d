"""A decision log that cannot be written: bounded failures, the gate's report, fail closed.

PostgreSQL faults are real: a port nothing listens on (server down), and a TCP proxy in front of
the real test server that stops forwarding (a hung server or a dead network) or drops every
connection (a server restart). SQLite's: a writer holding the lock past the busy timeout.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from _postgres import FaultProxy, fetch, fresh_url

from capgate import Estimate, Gate, LogUnavailableError, guard
from capgate.decision import Decision, DecisionLog
from capgate.estimators import CapabilityEstimator

DOWN = "postgresql://capgate@127.0.0.1:1/capgate"  # nothing listens on port 1


class Fixed(CapabilityEstimator):
    method = "fixed"

    def estimate(self, queries: list[object]) -> list[Estimate]:  # type: ignore[override]
        return [Estimate(p=0.95, method=self.method) for _ in queries]


def make() -> Decision:
    return Decision(action="answer", estimate=Estimate(p=0.9, method="probe"), reason="t")


@pytest.fixture
def proxied(postgres_url: str) -> Iterator[tuple[FaultProxy, str]]:
    url = fresh_url(postgres_url)
    target = urlsplit(postgres_url)
    proxy = FaultProxy(target.hostname or "127.0.0.1", target.port or 5432)
    yield proxy, proxy.url(url)
    proxy.close()


def test_a_database_that_is_down_fails_at_once_and_clearly() -> None:
    log = DecisionLog(DOWN, timeout_s=3)
    began = time.monotonic()
    with pytest.raises(LogUnavailableError, match="Connection refused") as info:
        log.record(make())
    assert time.monotonic() - began < 3
    assert info.value.location == DOWN
    assert str(info.value).startswith(f"{DOWN}: decision log unavailable: ")


def test_the_gate_returns_its_decision_counts_and_reports_the_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate = Gate(policy="balanced", estimator=Fixed(), log=DecisionLog(DOWN, timeout_s=3))
    calls: list[str] = []

    @guard(gate=gate)
    def ask(q: str) -> str:
        calls.append(q)
        return "42"

    with caplog.at_level(logging.WARNING, logger="capgate"):
        assert ask("What is 6*7?") == "42"
        assert ask("And 7*6?") == "42"
    assert calls == ["What is 6*7?", "And 7*6?"]
    assert gate.stats.calls == 2
    assert gate.stats.log_failures == 2
    assert gate.stats.last_log_error is not None
    assert "Connection refused" in gate.stats.last_log_error
    warnings = [r for r in caplog.records if r.name == "capgate" and r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "was not logged" in warnings[0].getMessage()
    assert gate.stats.last_decision is not None
    assert gate.stats.last_decision.id in warnings[1].getMessage()
    gate.stats.reset()
    assert (gate.stats.log_failures, gate.stats.last_log_error) == (0, None)


def test_fail_closed_blocks_the_call() -> None:
    gate = Gate(policy="balanced", estimator=Fixed(), log=DecisionLog(DOWN, timeout_s=3, fail_closed=True))
    calls: list[str] = []

    @guard(gate=gate)
    def ask(q: str) -> str:
        calls.append(q)
        return "42"

    with pytest.raises(LogUnavailableError):
        ask("What is 6*7?")
    assert calls == []  # the answer is not produced when its decision cannot be logged
    assert gate.stats.log_failures == 1


def test_the_async_gate_reports_too() -> None:
    import asyncio

    gate = Gate(policy="balanced", estimator=Fixed(), log=DecisionLog(DOWN, timeout_s=3))

    @guard(gate=gate)
    async def ask(q: str) -> str:
        return "42"

    assert asyncio.run(ask("q")) == "42"
    assert gate.stats.log_failures == 1


def test_a_hung_server_fails_within_the_time_limit_and_loses_nothing(proxied: tuple[FaultProxy, str]) -> None:
    proxy, url = proxied
    log = DecisionLog(url, timeout_s=1.5)
    first = make()
    log.record(first)  # connected through the proxy
    proxy.freeze()
    stuck = make()
    began = time.monotonic()
    with pytest.raises(LogUnavailableError, match=r"no answer from the server within 1.5 s"):
        log.record(stuck)
    assert 1.4 < time.monotonic() - began < 4
    # a new connection to the hung server is bounded too (libpq's connect_timeout, at least 2 s)
    other = DecisionLog(url, timeout_s=1.5)
    began = time.monotonic()
    with pytest.raises(LogUnavailableError):
        other.record(make())
    assert time.monotonic() - began < 5
    proxy.thaw()
    # the failed write may or may not have reached the server before the cut; logging it again
    # (what a caller that saw the failure does) leaves exactly one row
    log.record(stuck)
    log.record(stuck)
    assert fetch(url, "SELECT COUNT(*) FROM decisions WHERE id = ?", (stuck.id,)) == [(1,)]
    assert len(log) == 2


def test_a_dropped_connection_reconnects_and_retries_once(proxied: tuple[FaultProxy, str]) -> None:
    proxy, url = proxied
    log = DecisionLog(url, timeout_s=5)
    log.record(make())
    proxy.cut()  # as a server restart or a failover does
    d = make()
    log.record(d)  # no error: a fresh connection, the same write
    log.record_outcome(d.id, correct=True)
    assert len(log) == 2
    assert log.get(d.id).outcome is not None


def test_sqlite_locked_past_its_busy_timeout_is_a_bounded_failure(tmp_path: Path) -> None:
    path = tmp_path / "d.sqlite3"
    log = DecisionLog(path, busy_timeout_s=0.3)
    log.record(make())
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another writer that does not let go
    gate = Gate(policy="balanced", estimator=Fixed(), log=log)

    @guard(gate=gate)
    def ask(q: str) -> str:
        return "42"

    began = time.monotonic()
    result: list[str] = []
    worker = threading.Thread(target=lambda: result.append(ask("q")))
    worker.start()
    worker.join(timeout=10)
    holder.execute("ROLLBACK")
    holder.close()
    assert result == ["42"]
    assert time.monotonic() - began < 5
    assert gate.stats.log_failures == 1
    assert "locked" in (gate.stats.last_log_error or "")
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(LogUnavailableError, match="locked"):
            log.record(make())
    finally:
        other.execute("ROLLBACK")
        other.close()
    log.record(make())  # writable again once the lock is gone
    assert len(log) == 2


def test_a_new_threads_connection_keeps_another_processs_reader_from_dropping_the_wal(tmp_path: Path) -> None:
    """A thread opening its connection never closes a descriptor of the database file: that would
    release the process's POSIX locks, SQLite's included, so another process closing the log would
    think itself the last one and delete the WAL this process still writes to (its writes lost).
    Seen as lost shadow decisions when ``capgate calibrate shadow`` ran beside a gate's threads."""
    import subprocess
    import sys

    db = tmp_path / "log.sqlite3"
    log = DecisionLog(db)
    log.record(make())
    held, release = threading.Event(), threading.Event()

    def keep_open() -> None:  # a worker whose connection stays open, as a shadow thread's does
        log.record(make())
        held.set()
        release.wait()

    worker = threading.Thread(target=keep_open)
    worker.start()
    held.wait()
    later = threading.Thread(target=lambda: log.record(make()))  # a new thread opens a connection
    later.start()
    later.join()
    count = "from capgate.decision import DecisionLog; log = DecisionLog({!r}); print(len(log)); log.close()"
    subprocess.run([sys.executable, "-c", count.format(str(db))], check=True, capture_output=True)
    for _ in range(5):
        log.record(make())
    release.set()
    worker.join()
    log.close()
    done = subprocess.run(
        [sys.executable, "-c", count.format(str(db))], check=True, capture_output=True, text=True
    )
    assert int(done.stdout) == 8
