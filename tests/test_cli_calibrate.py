"""``capgate calibrate``: the held-out table, refusals as errors, and shadow -> promote -> rollback
recorded in the log (both stores)."""

from __future__ import annotations

import json
from pathlib import Path

from _learn_traffic import log_traffic, overconfident
from typer.testing import CliRunner

from capgate.cli import app
from capgate.decision import DecisionLog

runner = CliRunner()


def _log(location: str | Path, n: int = 300, seed: int = 0) -> str:
    p, y = overconfident(n, seed=seed)
    with DecisionLog(location) as log:
        log_traffic(log, p, y)
    return str(location)


def test_calibrate_prints_the_held_out_table_and_writes_the_folder(tmp_path: Path) -> None:
    db = _log(tmp_path / "log.sqlite3")
    done = runner.invoke(app, ["calibrate", "--db", db, "--out", str(tmp_path / "cal")])
    assert done.exit_code == 0, done.output
    out = done.output
    assert "held-out: the latest 90 of 300 outcomes" in out
    for name in ("previous", "isotonic", "platt"):
        assert name in out
    assert "enforce decisions with outcomes, by action: answer 300/300" in out
    assert "wrote " + str(tmp_path / "cal") in out
    assert (tmp_path / "cal" / "calibration.json").is_file()


def test_calibrate_json_and_refusals(tmp_path: Path) -> None:
    db = _log(tmp_path / "log.sqlite3")
    done = runner.invoke(app, ["calibrate", "--db", db, "--out", str(tmp_path / "cal"), "--json"])
    assert done.exit_code == 0, done.output
    payload = json.loads(done.output)
    assert payload["version"].startswith("cal-")
    assert payload["n"] == 300
    assert [r["candidate"] for r in payload["table"]] == ["previous", "isotonic", "platt"]
    refused = runner.invoke(
        app, ["calibrate", "--db", db, "--out", str(tmp_path / "x"), "--min-outcomes", "400"]
    )
    assert refused.exit_code == 2
    assert "error: " in refused.output
    assert "too few outcomes: 300" in refused.output
    assert "at least 400" in refused.output
    other = runner.invoke(app, ["calibrate", "--db", db, "--out", str(tmp_path / "x"), "--target", "nope"])
    assert other.exit_code == 2
    assert "no outcomes for target 'nope'" in other.output
    assert not (tmp_path / "x").exists()
    missing = runner.invoke(app, ["calibrate", "--db", db])
    assert missing.exit_code == 2
    assert "give --out DIR" in missing.output
    bad_time = runner.invoke(app, ["calibrate", "--db", db, "--out", str(tmp_path / "x"), "--since", "soon"])
    assert bad_time.exit_code == 2
    assert "--since must be an ISO 8601 time" in bad_time.output


def test_shadow_promote_rollback_are_recorded(log_location: str | Path, tmp_path: Path) -> None:
    db = _log(log_location)
    first, second = tmp_path / "v1", tmp_path / "v2"
    assert runner.invoke(app, ["calibrate", "--db", db, "--out", str(first)]).exit_code == 0
    assert (
        runner.invoke(app, ["calibrate", "--db", db, "--out", str(second), "--holdout", "0.4"]).exit_code == 0
    )
    v1 = json.loads((first / "calibration.json").read_text())["version"]
    v2 = json.loads((second / "calibration.json").read_text())["version"]
    assert v1 != v2

    status = runner.invoke(app, ["calibrate", "status", "--db", db, "--target", "m"])
    assert status.exit_code == 0, status.output
    assert "enforced none (uncalibrated)" in status.output

    shadow = runner.invoke(app, ["calibrate", "shadow", "--db", db, str(first)])
    assert shadow.exit_code == 0, shadow.output
    assert f"{v1}" in shadow.output
    assert "shadows the enforced version" in shadow.output
    promote = runner.invoke(app, ["calibrate", "promote", "--db", db, str(first)])
    assert promote.exit_code == 0, promote.output
    assert "was: uncalibrated" in promote.output
    again = runner.invoke(app, ["calibrate", "promote", "--db", db, str(first)])
    assert again.exit_code == 2
    assert "already enforced" in again.output
    assert runner.invoke(app, ["calibrate", "promote", "--db", db, str(second)]).exit_code == 0

    with DecisionLog(db) as log:
        assert log.active_calibration("m").version == v2
        assert log.active_calibration("m").previous == v1
        assert [e.event for e in log.calibration_events("m")] == ["shadow", "promote", "promote"]

    back = runner.invoke(app, ["calibrate", "rollback", "--db", db])  # the log's only target
    assert "for target 'm'" in back.output
    assert back.exit_code == 0, back.output
    assert f"rolled back {v2}" in back.output
    assert f"now {v1}" in back.output
    as_json = json.loads(
        runner.invoke(app, ["calibrate", "status", "--db", db, "--target", "m", "--json"]).output
    )
    assert as_json["enforced"]["version"] == v1
    assert [e["event"] for e in as_json["events"]] == ["shadow", "promote", "promote", "rollback"]
    assert runner.invoke(app, ["calibrate", "rollback", "--db", db, "--target", "m"]).exit_code == 0
    last = runner.invoke(app, ["calibrate", "rollback", "--db", db, "--target", "m"])
    assert last.exit_code == 2
    assert "nothing to roll back" in last.output
