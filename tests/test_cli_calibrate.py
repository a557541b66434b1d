"""``capgate calibrate``: the held-out table, refusals as errors, and shadow -> promote -> rollback
recorded in the log (both stores)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from _learn_traffic import log_traffic, overconfident
from typer.testing import CliRunner

from capgate.cli import app
from capgate.decision import DecisionLog
from capgate.policies import Policy

MATH500 = Path(__file__).resolve().parents[1] / "sdk" / "assets" / "math500_gpt-oss-20b_probe-math.jsonl"
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
    assert "--since must be an ISO date or time (2026-12-01T08:00) or a span (24h, 7d)" in bad_time.output
    span = runner.invoke(app, ["calibrate", "--db", db, "--out", str(tmp_path / "y"), "--since", "36500d"])
    assert span.exit_code == 0, span.output  # a span back from now, as `capgate report --since` reads it


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


def test_options_before_a_subcommand_reach_it_and_a_mistyped_log_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    default = tmp_path / "default.sqlite3"  # where a dropped --db would go instead
    monkeypatch.setenv("CAPGATE_DB", str(default))
    db = _log(tmp_path / "log.sqlite3")
    folder = tmp_path / "cal"
    learnt = runner.invoke(app, ["calibrate", "--db", db, "--out", str(folder)])
    assert learnt.exit_code == 0, learnt.output
    assert f"next: capgate calibrate shadow --db {db} {folder} (then promote" in learnt.output
    version = json.loads((folder / "calibration.json").read_text())["version"]

    promote = runner.invoke(app, ["calibrate", "--db", db, "promote", str(folder)])
    assert promote.exit_code == 0, promote.output
    assert f"recorded in {db}" in promote.output
    with DecisionLog(db) as log:
        assert log.active_calibration("m").version == version
    for args in (["--db", db, "status", "--target", "m"], ["--db", db, "--target", "m", "status"]):
        status = runner.invoke(app, ["calibrate", *args])
        assert status.exit_code == 0, status.output
        assert f"target 'm': enforced {version}" in status.output
    refused = runner.invoke(app, ["calibrate", "--db", db, "--out", str(tmp_path / "x"), "status"])
    assert refused.exit_code == 2
    assert "error: `capgate calibrate status` takes no --out" in refused.output
    clash = runner.invoke(app, ["calibrate", "--db", db, "status", "--db", str(tmp_path / "other")])
    assert clash.exit_code == 2
    assert "--db given twice" in clash.output

    typo = tmp_path / "typo.sqlite3"
    for args in (
        ["status", "--db", str(typo)],
        ["--db", str(typo), "rollback"],
        ["promote", "--db", str(typo), str(folder)],
    ):
        missing = runner.invoke(app, ["calibrate", *args])
        assert missing.exit_code == 2, missing.output
        assert f"error: {typo}: no decision log at this path" in missing.output
    assert not typo.exists()
    assert not default.exists()


def test_policy_calibrate_writes_a_file_policy_validate_accepts(tmp_path: Path) -> None:
    """`capgate policy calibrate --policy` keeps a paper stop rule with its own ε and `mode: shadow`: the
    written file failed `capgate policy validate` (ε under a rule read as capgate's) and enforced."""
    base = tmp_path / "mine.yaml"
    base.write_text(
        "version: 1\nname: sampler\nmode: shadow\nbands:\n  - {below: 0.3, action: abstain}\n"
        "  - below: 0.6\n    action: resample\n    max_samples: 8\n"
        "    stop: {confidence_gap: {rule: paper, epsilon: 0.0}}\n  - {action: answer}\n"
        "on_degraded: abstain\n",
        encoding="utf-8",
    )
    out = tmp_path / "calibrated.yaml"
    args = ["policy", "calibrate", "--data", str(MATH500), "--confidence", "probe_conf_raw", "--risk", "0.03"]
    done = runner.invoke(app, [*args, "--policy", str(base), "--out", str(out)])
    assert done.exit_code == 0, done.output
    checked = runner.invoke(app, ["policy", "validate", str(out)])
    assert checked.exit_code == 0, checked.output
    assert yaml.safe_load(out.read_text(encoding="utf-8"))["mode"] == "shadow"
    written, original = Policy.from_yaml(out), Policy.from_yaml(base)
    assert written.mode == "shadow"
    assert written.bands[1].stop == original.bands[1].stop
    assert written.rule().edges[-1][0] > 0.6  # the answer edge moved: the resample band was rewritten
