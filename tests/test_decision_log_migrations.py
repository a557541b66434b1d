"""The decision log's schema version and forward migrations, on both stores.

``tests/data/decision_log_v1.sqlite3`` was written by capgate before schema 2 (the first
release's schema, version 1): six decisions (one degraded, with query text stored), three with
outcomes. Opening it must migrate it forward in place and keep every row readable.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from _postgres import execute, fetch

from capgate import Estimate
from capgate.decision import Decision, DecisionLog
from capgate.decision.store.schema import POSTGRES, SCHEMA_VERSION, SQLITE

V1_FILE = Path(__file__).parent / "data" / "decision_log_v1.sqlite3"


def test_a_fresh_log_is_at_the_current_version_with_its_history(log_location: str | Path) -> None:
    with DecisionLog(log_location) as log:
        assert log.schema_version() == SCHEMA_VERSION == 4
        history = log.migrations()
        log.record(Decision(action="answer", estimate=Estimate(p=0.5, method="m"), reason="r"))
        (row,) = log.decisions()
    assert [(v, d) for v, d, _ in history] == [(v, d) for v, d, _ in SQLITE.migrations]
    assert all(applied != "before the history" for _, _, applied in history)
    assert row.writer is not None
    host, pid = row.writer.rsplit(":", 1)
    assert host
    assert int(pid) > 0


def test_a_version_1_sqlite_file_migrates_forward_in_place(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    shutil.copy(V1_FILE, path)
    assert fetch(path, "SELECT value FROM capgate_meta WHERE key = 'schema_version'") == [("1",)]
    assert "writer" not in {r[1] for r in fetch(path, "PRAGMA table_info(decisions)")}
    with DecisionLog(path) as log:
        assert log.schema_version() == 4
        old = log.decisions()
        assert [r.id for r in old] == [f"v1-{i}" for i in range(6)]
        assert [r.outcome is not None for r in old] == [True] * 3 + [False] * 3
        assert old[1].outcome is not None
        assert old[1].outcome.correct is True
        assert old[5].p is None
        assert old[5].decision.degraded
        assert old[4].query_text == "question 4"
        assert old[3].samples_used == 3
        assert all(r.writer is None for r in old)  # version 1 did not record writers
        history = log.migrations()
        new = Decision(action="answer", estimate=Estimate(p=0.7, method="probe"), reason="after")
        log.record(new)
        log.record_outcome(new.id, correct=False)
        assert log.get(new.id).writer is not None
        assert log.count(method="probe") == 5  # v1-0, v1-2, v1-4, v1-5 (degraded) and the new one
        assert log.integrity_check() == "ok"
    assert history[0][:2] == (1, "decisions and outcomes")
    assert history[0][2] == "before the history"
    assert history[1][0] == 2
    assert history[1][2] != "before the history"
    # opening again changes nothing
    with DecisionLog(path) as log:
        assert log.migrations() == history
        assert len(log) == 7


def test_a_version_1_postgres_schema_migrates_forward(postgres_url: str) -> None:
    from _postgres import fresh_url

    url = fresh_url(postgres_url)
    for statement in POSTGRES.migrations[0][2]:  # the schema as version 1 left it
        execute(url, statement)
    execute(url, "CREATE TABLE capgate_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    execute(url, "INSERT INTO capgate_meta VALUES ('schema_version', '1')")
    old = Decision(action="abstain", estimate=Estimate(p=0.1, method="probe"), reason="v1")
    execute(
        url,
        "INSERT INTO decisions (id, created_at, method, p, degraded, action, reason, decision_json)"
        " VALUES (?, ?, 'probe', 0.1, 0, 'abstain', 'v1', ?)",
        (old.id, old.created_at.isoformat(), old.model_dump_json()),
    )
    with DecisionLog(url) as log:
        assert log.schema_version() == 4
        (row,) = log.decisions()
        assert row.decision == old
        assert row.writer is None
        log.record_outcome(old.id, correct=True)
        assert [(v, a == "before the history") for v, _, a in log.migrations()] == [
            (1, True),
            (2, False),
            (3, False),
            (4, False),
        ]
        assert log.integrity_check() == "ok"


def test_a_newer_schema_is_refused_without_touching_it(log_location: str | Path) -> None:
    with DecisionLog(log_location) as log:
        log.record(Decision(action="answer", estimate=Estimate(p=0.5, method="m"), reason="r"))
    execute(log_location, "UPDATE capgate_meta SET value = '5' WHERE key = 'schema_version'")
    with pytest.raises(Exception, match="schema version 5 is not the supported 4") as info:
        DecisionLog(log_location).decisions()
    assert "upgrade capgate" in str(info.value)
    assert fetch(log_location, "SELECT value FROM capgate_meta WHERE key = 'schema_version'") == [("5",)]


def log_at_version(location: str | Path, version: int) -> str | Path:
    """``location`` holding an empty log with the schema as ``version`` left it."""
    dialect = SQLITE if isinstance(location, Path) else POSTGRES
    if isinstance(location, Path):
        location.parent.mkdir(parents=True, exist_ok=True)
    for _, _, statements in dialect.migrations[:version]:
        for statement in statements:
            execute(location, statement)
    execute(location, "CREATE TABLE capgate_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    execute(location, f"INSERT INTO capgate_meta VALUES ('schema_version', '{version}')")
    return location


def test_a_version_2_log_migrates_to_outcomes_per_source(new_log_location: Callable[[], str | Path]) -> None:
    """Version 3 keys outcomes by (decision, source) and adds the shadow and target columns: a
    version 2 log's outcomes come forward as source 'unspecified', its shadow decisions (known
    only from their JSON) are marked shadow, and their targets are filled in."""
    location = log_at_version(new_log_location(), 2)
    estimate = Estimate(p=0.3, method="probe")
    shadow = Decision(action="abstain", estimate=estimate, reason="v2", shadow=True, target="m1")
    plain = Decision(action="answer", estimate=estimate, reason="v2")
    for d in (shadow, plain):
        execute(
            location,
            "INSERT INTO decisions (id, created_at, method, p, degraded, action, reason, decision_json)"
            " VALUES (?, ?, 'probe', 0.3, 0, ?, 'v2', ?)",
            (d.id, d.created_at.isoformat(), d.action, d.model_dump_json()),
        )
    execute(
        location,
        "INSERT INTO outcomes (decision_id, correct, mu_hat, samples_used, latency_s, recorded_at)"
        " VALUES (?, 1, NULL, 1, NULL, ?)",
        (shadow.id, shadow.created_at.isoformat()),
    )
    with DecisionLog(location) as log:
        assert log.schema_version() == 4
        old = log.get(shadow.id)
        assert [(o.source, o.correct) for o in old.outcomes] == [("unspecified", True)]
        log.record_outcome(shadow.id, score=0.5, source="grader")
        assert sorted(o.source for o in log.get(shadow.id).outcomes) == ["grader", "unspecified"]
        assert log.integrity_check() == "ok"
    assert sorted(fetch(location, "SELECT id, shadow, target, outcome_y FROM decisions")) == sorted(
        [(shadow.id, 1, "m1", 0.75), (plain.id, 0, None, None)]  # outcome_y: the mean of 1 and 0.5
    )


def test_a_version_3_log_migrates_to_calibration_versions_and_features(
    new_log_location: Callable[[], str | Path],
) -> None:
    """Version 4 adds the calibration and beside columns, backfilled from each decision's JSON
    (a decision that carries them in its JSON gets them; older rows get NULL), the features and
    calibration-event tables, and the report index over the new columns."""
    location = log_at_version(new_log_location(), 3)
    estimate = Estimate(p=0.3, method="probe")
    enforced = Decision(action="abstain", estimate=estimate, reason="v3", calibration="cal-a")
    candidate = Decision(
        action="answer", estimate=estimate, reason="v3", shadow=True, calibration="cal-b", beside=enforced.id
    )
    old = Decision(action="answer", estimate=estimate, reason="v3")
    old_json = old.model_dump_json(exclude={"calibration", "beside"})  # as capgate 3 wrote it
    assert "calibration" not in old_json
    for d, text in (
        (enforced, enforced.model_dump_json()),
        (candidate, candidate.model_dump_json()),
        (old, old_json),
    ):
        execute(
            location,
            "INSERT INTO decisions (id, created_at, method, p, degraded, action, reason, decision_json,"
            " shadow) VALUES (?, ?, 'probe', 0.3, 0, ?, 'v3', ?, ?)",
            (d.id, d.created_at.isoformat(), d.action, text, int(d.shadow)),
        )
    with DecisionLog(location) as log:
        assert log.schema_version() == 4
        assert log.get(candidate.id).beside == enforced.id
        assert log.get(candidate.id).calibration == "cal-b"
        assert log.get(old.id).calibration is None
        assert log.integrity_check() == "ok"
        assert [v for v, _, _ in log.migrations()][-1] == 4
        # the new tables work on the migrated log
        assert log.record_features([(old.id, [1.0, 2.0])], {"model_id": "m"}) == 1
        assert log.features([old.id])[old.id].vector.tolist() == [1.0, 2.0]
        log.record_calibration_event("promote", "cal-a", "/a", target=None)
        assert log.active_calibration(None) is not None
    assert sorted(fetch(location, "SELECT id, calibration, beside FROM decisions")) == sorted(
        [(enforced.id, "cal-a", None), (candidate.id, "cal-b", enforced.id), (old.id, None, None)]
    )
