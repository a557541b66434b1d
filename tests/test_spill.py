"""A decision the log cannot take yet is kept on local disk and written later: none is lost.

The log down (its writes raising, as a PostgreSQL past its ``timeout_s`` does), or its writer
queue full: the gate keeps the decision in the log's spill file, counts it, and writes it back
once the log takes writes again; the replay is safe to repeat.
"""

from __future__ import annotations

import asyncio
import json
import logging
import stat
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import capgate
from capgate import Estimate, Gate
from capgate.cli import app
from capgate.core.types import Decision
from capgate.decision import DecisionLog
from capgate.decision.store.spill import SpillFile, default_spill_path
from capgate.errors import DataError, LogUnavailableError
from capgate.estimators import CapabilityEstimator
from capgate.gate._limits import log_key, log_writer


class Sure(CapabilityEstimator):
    method = "sure"

    def estimate(self, queries: Any) -> list[Estimate]:
        return [Estimate(p=0.9, method=self.method) for _ in queries]


def _decision(p: float = 0.9) -> Decision:
    return Decision(action="answer", estimate=Estimate(p=p, method="constant"), reason="test")


class Outage:
    """Make ``log``'s store refuse writes (as a database down does) until :meth:`end`."""

    def __init__(self, log: DecisionLog, monkeypatch: pytest.MonkeyPatch) -> None:
        self.down = True
        self.tries = 0
        write = log.store.write

        def refusing(sql: str, params: Any = ()) -> int:
            self.tries += self.down
            if self.down:
                raise LogUnavailableError("the database is down (planted)", location=log.location)
            return write(sql, params)

        monkeypatch.setattr(log.store, "write", refusing)

    def end(self) -> None:
        self.down = False


def _drain(log: DecisionLog) -> None:
    """Wait until the log's writer thread has done what it holds (a replay's batches included)."""
    writer = log_writer(log_key(log))
    for _ in range(100):  # each replay batch queues the next behind what came meanwhile
        writer.submit(lambda: None).result(timeout=10)
        if writer.pending == 0 and not (log.spill is not None and log.spill.pending()):
            return
    raise AssertionError("the log's writer did not drain")


def test_the_spill_file_keeps_decisions_and_replays_them_once(tmp_path: Path) -> None:
    log = DecisionLog(tmp_path / "log.sqlite3")
    kept = SpillFile(tmp_path / "spill" / "log.jsonl")
    decisions = [_decision(0.1 * i) for i in range(1, 4)]
    for d in decisions:
        kept.append(d, query="What is 2 + 2?", samples_used=3, store_text=False, why="planted")
    assert kept.pending()
    assert "What is 2 + 2?" not in kept.path.read_text()  # only the hash, like the log without store_text
    assert kept.replay(log) == 3
    assert not kept.pending()
    assert kept.replay(log) == 0
    rows = {r.id: r for r in log.decisions()}
    assert set(rows) == {d.id for d in decisions}
    assert {r.samples_used for r in rows.values()} == {3}
    assert {r.query_sha256 for r in rows.values()} == {capgate.core.messages.query_hash("What is 2 + 2?")}
    log.close()


def test_a_replay_cut_short_reruns_without_duplicates(tmp_path: Path) -> None:
    log = DecisionLog(tmp_path / "log.sqlite3")
    kept = SpillFile(tmp_path / "log.spill.jsonl")
    decisions = [_decision() for _ in range(3)]
    for d in decisions:
        kept.append(d, query=None, samples_used=None, store_text=False, why="planted")
    log.record(decisions[0])  # written before a crash; the file moved aside, not yet emptied
    kept.path.rename(kept.replaying_path)
    kept.append(_decision(), query=None, samples_used=None, store_text=False, why="spilled meanwhile")
    assert kept.replay(log) == 3  # the file moved aside first
    assert kept.replay(log) == 1  # then the new one
    assert log.count() == 4
    log.close()


def test_the_spill_file_is_private_as_the_log_beside_it(tmp_path: Path) -> None:
    """It holds what the agent was asked and decided, as the log does (mode 0600), and a replay's
    rewrite of what is left keeps that mode."""
    log = DecisionLog(tmp_path / "log.sqlite3")
    kept = SpillFile(tmp_path / "log.spill.jsonl")
    for _ in range(3):
        kept.append(_decision(), query="a secret", samples_used=1, store_text=True, why="planted")
    assert stat.S_IMODE(kept.path.stat().st_mode) == 0o600
    assert kept.replay(log, limit=1) == 1  # the other two rewritten
    assert stat.S_IMODE(kept.replaying_path.stat().st_mode) == 0o600
    log.close()


def test_a_replay_in_batches_keeps_the_rest(tmp_path: Path) -> None:
    log = DecisionLog(tmp_path / "log.sqlite3")
    kept = SpillFile(tmp_path / "log.spill.jsonl")
    for _ in range(25):
        kept.append(_decision(), query="q", samples_used=1, store_text=False, why="planted")
    assert [kept.replay(log, limit=10) for _ in range(4)] == [10, 10, 5, 0]
    assert log.count() == 25
    assert not kept.pending()
    log.close()


def test_a_cut_last_line_is_skipped_and_a_bad_line_is_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    kept = SpillFile(tmp_path / "s.jsonl")
    kept.append(_decision(), query=None, samples_used=None, store_text=False, why="planted")
    whole = kept.path.read_text()
    kept.path.write_text(whole + whole[: len(whole) // 2])  # a crash mid-append
    with caplog.at_level(logging.WARNING, logger="capgate"):
        assert len(kept.read()) == 1
    assert "s.jsonl:2: skipped a spilled decision cut short" in caplog.text
    kept.path.write_text('{"decision": {"action": "answer"}}\n' + whole)
    with pytest.raises(DataError, match=r"s\.jsonl:1: not a spilled decision"):
        kept.read()


def test_a_decision_spilled_after_a_cut_append_is_kept_whole_and_replayed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A crash mid-append (here cut inside a multi-byte character of the stored text), then the
    restarted process spills again: the new decision is not glued to the fragment, and the replay
    writes every whole decision instead of failing on the fragment at each try."""
    log = DecisionLog(tmp_path / "log.sqlite3")
    kept = SpillFile(tmp_path / "s.jsonl")
    first, after = _decision(), _decision()
    kept.append(first, query="Combien coûte ça ?", samples_used=None, store_text=True, why="planted")
    whole = kept.path.read_bytes()
    cut = whole.index("ç".encode()) + 1  # inside the two bytes of 'ç'
    kept.path.write_bytes(whole + whole[:cut])
    kept.append(after, query=None, samples_used=None, store_text=False, why="after the restart")
    with caplog.at_level(logging.WARNING, logger="capgate"):
        assert kept.replay(log) == 2
    assert "s.jsonl.replaying:2: skipped a spilled decision cut short" in caplog.text
    assert {r.id for r in log.decisions()} == {first.id, after.id}
    assert not kept.pending()
    log.close()


def test_default_spill_paths() -> None:
    assert default_spill_path(Path("/x/log.sqlite3")) == Path("/x/log.sqlite3.spill.jsonl")
    url = default_spill_path("postgresql://u@db.example:5432/capgate")
    assert url.parent.parts[-2:] == ("capgate", "spill")
    assert url != default_spill_path("postgresql://u@db.example:5432/other")
    assert DecisionLog("/tmp/x.sqlite3", spill=None).spill is None


def test_a_down_log_keeps_the_gates_decisions_and_gets_them_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first failed write rests the log for RETRY_LOG_AFTER_S: the decisions meanwhile go
    straight to the spill file, untried (an outage costs one time limit, not one per call)."""
    monkeypatch.setattr("capgate.gate._limits.RETRY_LOG_AFTER_S", 0.3)
    log = DecisionLog(tmp_path / "log.sqlite3")
    outage = Outage(log, monkeypatch)
    guarded = capgate.guard(policy="balanced", estimator=Sure(), log=log)(lambda q: "42")
    monkeypatch.setattr("capgate.gate._record.REPLAY_BATCH", 2)  # written back over three turns
    for i in range(5):
        assert guarded(f"q{i}") == "42"
    stats = guarded.gate.stats  # type: ignore[attr-defined]
    assert outage.tries == 1
    assert stats.log_failures == 5
    assert stats.log_spilled == 5
    assert log.spill is not None
    assert len(log.spill.read()) == 5
    outage.end()
    assert guarded("q5") == "42"  # still resting: kept untried
    assert outage.tries == 1
    time.sleep(0.35)
    assert guarded("q6") == "42"  # tried, written, and the spilled six follow from the writer
    _drain(log)
    assert log.count() == 7
    assert not log.spill.pending()
    log.close()


def test_without_a_spill_file_the_loss_is_counted_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = DecisionLog(tmp_path / "log.sqlite3", spill=None)
    Outage(log, monkeypatch)
    gate = Gate(policy="balanced", estimator=Sure(), log=log)
    gate.record(gate.assess("q"))
    assert gate.stats.log_failures == 1
    assert gate.stats.log_spilled == 0
    assert not list(tmp_path.glob("*.spill.jsonl"))


def test_a_full_write_queue_spills_instead_of_growing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Async and shadow decisions do not pile up in memory behind a stuck log: past the writer's
    queue limit they go to the spill file, and all reach the log once it drains."""
    log = DecisionLog(tmp_path / "log.sqlite3")
    writer = log_writer(log_key(log))
    monkeypatch.setattr(writer, "max_pending", 0)  # the queue counts as full from the start
    enforce = capgate.guard(policy="balanced", estimator=Sure(), log=log)

    @enforce
    async def ask(q: str) -> str:
        return "42"

    shadow = Gate(policy="balanced", estimator=Sure(), log=log, mode="shadow")

    async def main() -> None:
        assert await asyncio.gather(*(ask(f"q{i}") for i in range(4))) == ["42"] * 4

    asyncio.run(main())
    for i in range(3):
        shadow.record(shadow.shadow(f"s{i}"))
    shadow.flush()
    assert log.count() == 0
    assert log.spill is not None
    whys = {json.loads(line)["why"] for line in log.spill.path.read_text().splitlines()}
    assert whys == {"the log's write queue was full"}
    assert ask.gate.stats.log_spilled + shadow.stats.log_spilled == 7  # type: ignore[attr-defined]
    monkeypatch.setattr(writer, "max_pending", 10_000)
    asyncio.run(main())  # written through the queue again; the next write brings the spill back
    _drain(log)
    assert log.count() == 4 + 3 + 4
    log.close()


def test_the_cli_replays_a_spill_file(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite3"
    log = DecisionLog(path)
    log.count()  # creates the file
    assert log.spill is not None
    log.spill.append(_decision(), query="hi", samples_used=None, store_text=False, why="planted")
    result = CliRunner().invoke(app, ["log", "replay-spill", "--db", str(path)])
    assert result.exit_code == 0, result.output
    assert "wrote 1 spilled decisions" in result.output
    assert log.count() == 1
    result = CliRunner().invoke(app, ["log", "replay-spill", "--db", str(path)])
    assert "wrote 0 spilled decisions" in result.output
    log.close()


def test_the_cli_replay_keeps_the_query_text_a_text_log_spilled(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite3"
    log = DecisionLog(path, store_text=True)
    log.count()  # creates the file
    assert log.spill is not None
    d = _decision()
    log.spill.append(
        d, query="What is the capital of France?", samples_used=None, store_text=True, why="down"
    )
    result = CliRunner().invoke(app, ["log", "replay-spill", "--db", str(path)])  # opens without store_text
    assert result.exit_code == 0, result.output
    assert log.get(d.id).query_text == "What is the capital of France?"
    log.close()
