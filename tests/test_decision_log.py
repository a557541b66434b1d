"""The decision log on both stores (SQLite, and a real PostgreSQL server: the ``db`` fixture is each
in turn): round trips, outcomes, concurrent writers, a writer killed mid-write, the CLI; and the
SQLite file itself (WAL mode, integrity, files that are not a log)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from _postgres import execute, fetch
from typer.testing import CliRunner

from capgate import Cost, DataError, Estimate
from capgate.cli import app
from capgate.core.messages import query_hash
from capgate.decision import Decision, Outcome
from capgate.decision.store._sqlite import SQLiteStore
from capgate.decision.store._store import Store
from capgate.decision.store.log import DecisionLog, PostgresDecisionLog
from capgate.decision.store.outcomes import OutcomeConflictError
from capgate.decision.store.postgres import PostgresStore
from capgate.decision.store.schema import INSERT_OUTCOME, POSTGRES, SQLITE

REPO = Path(__file__).resolve().parents[1]


def make(p: float | None = 0.8, method: str = "probe", **kw: object) -> Decision:
    estimate = Estimate(p=p, method=method) if p is not None else Estimate.unavailable(method, "server down")
    return Decision(action="answer" if p is not None else "abstain", estimate=estimate, reason="test", **kw)


@pytest.fixture
def db(log_location: str | Path) -> str | Path:
    """A fresh log on each store in turn (``log_location`` in conftest.py)."""
    return log_location


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Path:
    return tmp_path / "logs" / "decisions.sqlite3"


def is_sqlite(db: str | Path) -> bool:
    return isinstance(db, Path)


def test_record_and_read_back(db: str | Path) -> None:
    d = Decision(
        action="resample",
        estimate=Estimate(p=0.42, method="probe", cost=Cost(latency_s=0.25)),
        reason="band 0.3-0.6: resample",
        budget=8,
        policy="default",
        step="solve",
        tool="calculator",
    )
    with DecisionLog(db) as log:
        assert log.record(d, query="What is 6*7?", samples_used=5) == d.id
        got = log.get(d.id)
    assert got.decision == d
    assert got.query_sha256 == query_hash("What is 6*7?")
    assert got.query_text is None  # text is off by default
    assert got.samples_used == 5
    assert got.latency_s == 0.25  # from the estimate's cost
    assert got.outcome is None
    assert (got.method, got.p) == ("probe", 0.42)
    (row,) = fetch(db, "SELECT step, tool, method, p, action, policy, budget, query_text FROM decisions")
    assert row == ("solve", "calculator", "probe", 0.42, "resample", "default", 8, None)


def test_query_hash_is_sha256_of_the_canonical_transcript() -> None:
    canonical = json.dumps([{"content": "hi", "role": "user"}], separators=(",", ":"))
    assert query_hash("hi") == hashlib.sha256(canonical.encode()).hexdigest()
    assert query_hash("hi") != query_hash("hi ")
    assert query_hash([{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]) != query_hash(
        "hi"
    )


def test_text_is_stored_only_when_asked(db: str | Path) -> None:
    d1, d2 = make(), make()
    with DecisionLog(db, store_text=True) as log:
        log.record(d1, query="secret question")
        log.record(d2, query=[{"role": "user", "content": "chat question"}])
        assert log.get(d1.id).query_text == "secret question"
        assert json.loads(log.get(d2.id).query_text or "") == [{"role": "user", "content": "chat question"}]
    with DecisionLog(db) as log:
        d3 = make()
        log.record(d3, query="another secret")
        assert log.get(d3.id).query_text is None
    assert fetch(db, "SELECT COUNT(*) FROM decisions WHERE query_text LIKE ?", ("%secret%",)) == [(1,)]
    if is_sqlite(db):
        assert isinstance(db, Path)
        assert b"another secret" not in db.read_bytes()


def test_degraded_decisions_keep_their_reason(db: str | Path) -> None:
    d = make(p=None, degraded=True)
    with DecisionLog(db) as log:
        log.record(d, latency_s=1.5)
        got = log.get(d.id)
    assert got.p is None
    assert got.latency_s == 1.5
    assert fetch(db, "SELECT degraded, degraded_reason FROM decisions") == [(1, "server down")]


def test_outcomes_attach_replace_and_validate(db: str | Path) -> None:
    d = make()
    with DecisionLog(db) as log:
        log.record(d)
        first = log.record_outcome(d.id, correct=False, samples_used=3, latency_s=2.0)
        assert log.get(d.id).outcome == first
        assert log.record_outcome(d.id, correct=False) == first  # the same again: kept as it was
        with pytest.raises(OutcomeConflictError, match="already has an outcome from source 'unspecified'"):
            log.record_outcome(Outcome(decision_id=d.id, correct=True, mu_hat=0.75))
        assert log.get(d.id).outcome == first
        second = log.record_outcome(Outcome(decision_id=d.id, correct=True, mu_hat=0.75), replace=True)
        stored = log.get(d.id).outcome
        assert stored == second
        assert stored is not None
        assert (stored.correct, stored.mu_hat) == (True, 0.75)
        with pytest.raises(DataError, match="no decision with id 'missing' in the log") as info:
            log.record_outcome("missing", correct=True)
        assert info.value.field == "decision_id"
        assert info.value.path == str(db)
        with pytest.raises(DataError, match="needs `correct`, `mu_hat` or `score`"):
            log.record_outcome(d.id)
        with pytest.raises(DataError, match="no decision with id"):
            log.get("missing")


def test_listing_filters_and_counts(db: str | Path) -> None:
    with DecisionLog(db) as log:
        ids = []
        for i in range(6):
            d = make(p=None if i == 5 else 0.1 * i, method="probe" if i % 2 == 0 else "verbalized")
            log.record(d)
            ids.append(d.id)
        log.record_outcome(ids[0], correct=True)
        log.record_outcome(ids[2], correct=False)
        assert [r.id for r in log.decisions()] == ids
        assert [r.id for r in log.decisions(last=2)] == ids[4:]
        assert [r.id for r in log.decisions(method="probe")] == [ids[0], ids[2], ids[4]]
        assert [r.id for r in log.decisions(with_outcome=True)] == [ids[0], ids[2]]
        assert [r.id for r in log.decisions(usable=False)] == [ids[5]]
        assert log.count(method="probe", with_outcome=False) == 1
        assert len(log) == 6
        assert log.methods() == ["probe", "verbalized"]
        # re-recording the same decision keeps one row
        log.record(log.get(ids[0]).decision)
        assert len(log) == 6
        with pytest.raises(ValueError, match="`last` must be a positive integer"):
            log.decisions(last=0)


def test_wal_mode_and_integrity(sqlite_db: Path) -> None:
    db = sqlite_db
    with DecisionLog(db) as log:
        log.record(make())
        assert log.integrity_check() == "ok"
    with sqlite3.connect(db) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_rejects_files_that_are_not_a_log(tmp_path: Path) -> None:
    junk = tmp_path / "junk.sqlite3"
    junk.write_bytes(b"this is not a database at all" * 100)
    with pytest.raises(DataError, match="not a usable capgate decision log") as info:
        DecisionLog(junk).record(make())
    assert info.value.path == str(junk)


def test_rejects_a_log_from_a_newer_capgate(db: str | Path) -> None:
    with DecisionLog(db) as log:
        log.record(make())
    execute(db, "UPDATE capgate_meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(DataError, match="schema version 99 is not the supported 4") as info:
        DecisionLog(db).record(make())
    assert info.value.field == "schema_version"


def test_threads_share_one_log_object(db: str | Path) -> None:
    log = DecisionLog(db)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(25):
                log.record(make())
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            log.close()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(log) == 100
    log.close()


_WRITER = """
import sys
from capgate import Estimate
from capgate.decision import Decision
from capgate.decision.store.log import DecisionLog

path, tag, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
log = DecisionLog(path)
i = 0
while count < 0 or i < count:
    d = Decision(id=f"{tag}-{i}", action="answer", estimate=Estimate(p=0.5, method=tag), reason="load")
    log.record(d, query=f"{tag} {i}")
    if i % 2 == 0:
        log.record_outcome(d.id, correct=bool(i % 4))
    print(d.id, flush=True)
    i += 1
"""


def _writer(db: str | Path, tag: str, count: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(db), tag, str(count)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )


def test_several_processes_write_at_once(db: str | Path) -> None:
    n_proc, per_proc = 4, 60
    procs = [_writer(db, f"w{k}", per_proc) for k in range(n_proc)]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        assert len(out.split()) == per_proc
    with DecisionLog(db) as log:
        assert len(log) == n_proc * per_proc
        assert log.count(with_outcome=True) == n_proc * per_proc // 2
        assert log.integrity_check() == "ok"
        assert log.methods() == [f"w{k}" for k in range(n_proc)]
        ids = {r.id for r in log.decisions()}
    assert ids == {f"w{k}-{i}" for k in range(n_proc) for i in range(per_proc)}
    with DecisionLog(db) as log:  # the writers opened a fresh log at once: it migrated once
        assert [v for v, _, _ in log.migrations()] == [1, 2, 3, 4]


def test_writer_killed_mid_write_loses_nothing_committed(db: str | Path) -> None:
    # Two writers contend for the lock; one is SIGKILLed while it loops inserting.
    steady = _writer(db, "steady", 150)
    victim = _writer(db, "victim", -1)
    assert victim.stdout is not None
    committed: list[str] = []
    deadline = time.monotonic() + 240
    while len(committed) < 120 and time.monotonic() < deadline:
        line = victim.stdout.readline()
        if not line:
            break
        committed.append(line.strip())
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(timeout=60)
    # anything the victim printed had been committed before the kill
    committed += [line.strip() for line in victim.stdout.read().split()]
    _out, err = steady.communicate(timeout=300)
    assert steady.returncode == 0, err
    assert victim.returncode == -signal.SIGKILL
    assert len(committed) >= 120, victim.stderr.read() if victim.stderr else ""

    with DecisionLog(db) as log:
        assert log.integrity_check() == "ok"
        stored = {r.id for r in log.decisions(method="victim")}
        assert set(committed) <= stored
        assert len(stored) - len(committed) <= 1  # at most the row whose print the kill cut off
        assert len(log.decisions(method="steady")) == 150
        # and the log is still writable
        log.record(make())
    if is_sqlite(db):
        with sqlite3.connect(db) as raw:
            assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


# --------------------------------------------------------------------------- CLI


def test_cli_log_outcome_and_show(db: str | Path) -> None:
    d, other = make(), make(p=0.3, method="verbalized")
    with DecisionLog(db) as log:
        log.record(d)
        log.record(other)
    runner = CliRunner()
    result = runner.invoke(app, ["log", "outcome", d.id, "--correct", "yes", "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert f"recorded outcome for {d.id}: correct=True" in result.output
    result = runner.invoke(
        app, ["log", "outcome", other.id, "--mu-hat", "0.25", "--samples", "4", "--db", str(db)]
    )
    assert result.exit_code == 0, result.output
    with DecisionLog(db) as log:
        o1, o2 = log.get(d.id).outcome, log.get(other.id).outcome
    assert o1 is not None
    assert o1.correct is True
    assert o2 is not None
    assert (o2.mu_hat, o2.samples_used, o2.correct) == (0.25, 4, None)

    shown = runner.invoke(app, ["log", "show", "--json", "--db", str(db)])
    assert shown.exit_code == 0, shown.output
    lines = [json.loads(line) for line in shown.output.splitlines()]
    assert [x["decision"]["id"] for x in lines] == [d.id, other.id]
    table = runner.invoke(app, ["log", "show", "--db", str(db)])
    assert table.exit_code == 0
    assert d.id in table.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["log", "outcome", "nope", "--correct", "no"], "no decision with id 'nope' in the log"),
        (["log", "outcome", "ID", "--correct", "maybe"], "--correct must be yes or no; got 'maybe'"),
        (["log", "outcome", "ID"], "give --correct yes|no, --mu-hat X or --score X"),
        (["log", "outcome", "ID", "--mu-hat", "1.5"], "`--mu-hat` must be a number in [0, 1]; got 1.5"),
        (["log", "outcome", "ID", "--correct", "no", "--samples", "-1"], "`--samples` must be an integer"),
        (["log", "outcome", "ID", "--correct", "no", "--latency", "-1"], "`--latency` must be a non-neg"),
    ],
)
def test_cli_log_outcome_bad_input_exits_2(db: str | Path, args: list[str], message: str) -> None:
    d = make()
    with DecisionLog(db) as log:
        log.record(d)
    args = [d.id if a == "ID" else a for a in args]
    result = CliRunner().invoke(app, [*args, "--db", str(db)])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ")
    assert message in result.stderr


def test_cli_unreachable_database_is_an_error() -> None:
    url = "postgresql://capgate@127.0.0.1:1/capgate"  # nothing listens on port 1
    result = CliRunner().invoke(app, ["log", "show", "--db", url])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {url}: decision log unavailable: ")
    assert "Connection refused" in result.stderr


def test_cli_missing_db_is_an_error_not_a_new_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.sqlite3"
    result = CliRunner().invoke(app, ["log", "outcome", "x", "--correct", "yes", "--db", str(missing)])
    assert result.exit_code == 2
    assert "no decision log at this path" in result.stderr
    assert not missing.exists()
    env_result = CliRunner(env={"CAPGATE_DB": str(missing)}).invoke(app, ["log", "show"])
    assert env_result.exit_code == 2
    assert str(missing) in env_result.stderr


def test_a_sampled_resample_updates_its_first_record(db: str | Path) -> None:
    from capgate import SamplingPlan

    first = Decision(
        id="r-1",
        action="resample",
        estimate=Estimate(p=0.6, method="m"),
        reason="band",
        plan=SamplingPlan(max_samples=8, batch_size=2),
    )
    with DecisionLog(db) as log:
        log.record(first)  # logged before sampling (as the LangGraph node does)
        sampled = first.model_copy(update={"stopped_by": "beta_consensus(threshold=0.95)"})
        log.record(sampled, samples_used=4)
        log.record(first, samples_used=99)  # an unsampled re-log never overwrites the sampled one
        (row,) = log.decisions()
    assert row.samples_used == 4
    assert row.decision.stopped_by == "beta_consensus(threshold=0.95)"
    assert row.decision.id == "r-1"


# --------------------------------------------------------------------------- the store protocol


def test_the_schema_is_declared_once_and_rendered_for_each_store() -> None:
    source = "\n".join(p.read_text(encoding="utf-8") for p in (REPO / "sdk" / "decision").rglob("*.py"))
    for table in ("decisions", "outcomes", "capgate_meta", "capgate_migrations"):
        assert source.count(f"CREATE TABLE IF NOT EXISTS {table} (") == 1, table
    sqlite, postgres = SQLITE.migrations, POSTGRES.migrations
    assert [(v, d, len(s)) for v, d, s in sqlite] == [(v, d, len(s)) for v, d, s in postgres]
    assert "p               REAL," in sqlite[0][2][0]
    assert "p               DOUBLE PRECISION," in postgres[0][2][0]
    assert "seq BIGINT" in postgres[0][2][0]
    assert "seq" not in sqlite[0][2][0]  # SQLite orders by its rowid


def test_each_store_implements_the_store_protocol(db: str | Path) -> None:
    log = DecisionLog(db)
    store = log.store
    assert type(log) is DecisionLog  # one log over either store, not a subclass per store
    assert isinstance(store, Store)
    assert isinstance(store, SQLiteStore) == is_sqlite(db)
    assert isinstance(store, PostgresStore) == (not is_sqlite(db))
    d = make()
    log.record(d)
    assert store.read("SELECT id, method FROM decisions WHERE id = ?", (d.id,)) == [(d.id, "probe")]
    outcome = store.dialect.render(INSERT_OUTCOME)
    now = "2026-01-01T00:00:00+00:00"
    assert store.write(outcome, ("user", 1, None, None, None, None, 0, None, now, d.id)) == 1
    assert store.write(outcome, ("user", 1, None, None, None, None, 0, None, now, "missing")) == 0  # no row
    assert log.get(d.id).outcome is not None
    assert store.location == str(db)
    store.close()
    assert len(log) == 1  # reopens on next use


def test_a_postgres_log_is_not_a_sqlite_store(postgres_url: str, tmp_path: Path) -> None:
    pg, file = DecisionLog(postgres_url, timeout_s=3), DecisionLog(tmp_path / "d.sqlite3")
    assert not isinstance(pg.store, SQLiteStore)
    assert not isinstance(file.store, PostgresStore)
    assert isinstance(PostgresDecisionLog(postgres_url).store, PostgresStore)
    assert repr(pg) == f"DecisionLog({postgres_url!r}, store_text=False)"
    with pytest.raises(ValueError, match=r"`url` must be a postgresql:// URL; got 'd\.sqlite3'"):
        PostgresDecisionLog("d.sqlite3")
    with pytest.raises(TypeError, match="`timeout_s` is for a postgresql:// log"):
        DecisionLog(tmp_path / "d.sqlite3", timeout_s=3)


def test_last_n_rows_keep_their_outcomes_when_a_decision_is_written_between_reads(
    sqlite_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with DecisionLog(sqlite_db) as log, DecisionLog(sqlite_db) as other:
        ids = [log.record(make(0.1 * i)) for i in range(1, 6)]
        for decision_id in ids:
            log.record_outcome(decision_id, correct=True, source="grader")
        read, calls = log.store.read, []

        def read_then_a_gate_writes(sql: str, params: object = ()) -> list[tuple[object, ...]]:
            rows = read(sql, params)  # type: ignore[arg-type]
            calls.append(sql)
            if len(calls) == 1:  # another gate logs a decision between this read and the next
                other.record(make(0.5))
            return rows

        monkeypatch.setattr(log.store, "read", read_then_a_gate_writes)
        shown = log.decisions(last=3)
    assert [r.id for r in shown] == ids[2:]
    assert [None if r.outcome is None else r.outcome.correct for r in shown] == [True, True, True]


def test_a_created_at_with_another_offset_is_stored_in_utc_for_the_report_window(sqlite_db: Path) -> None:
    from datetime import UTC, datetime, timedelta, timezone

    from capgate.decision import gate_report

    made = datetime(2026, 1, 1, 12, 0, tzinfo=timezone(timedelta(hours=5)))  # 07:00 UTC
    with DecisionLog(sqlite_db) as log:
        log.record(make(0.9, created_at=made))
        assert gate_report(log, since=datetime(2026, 1, 1, 8, 0, tzinfo=UTC)).decisions == 0
        assert gate_report(log, since=datetime(2026, 1, 1, 6, 0, tzinfo=UTC)).decisions == 1
        assert log.decisions()[0].decision.created_at == made  # the decision itself as recorded
