"""``capgate monitor`` split by target and calibration version, candidate shadows left out, and
a flagged drift pointing at ``capgate calibrate`` (on both stores)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import numpy as np
import pytest
from _fakes import decision
from typer.testing import CliRunner

from capgate import Estimate
from capgate.cli import app
from capgate.decision import Decision, DecisionLog
from capgate.decision.analysis.monitor import calibration_report


def _fill(log: DecisionLog, p: np.ndarray, y: np.ndarray, **kw: object) -> list[str]:
    ids = []
    for pi, yi in zip(p.tolist(), y.tolist(), strict=True):
        d = Decision(action="answer", estimate=Estimate(p=pi, method="probe"), reason="t", **kw)
        log.record(d)
        log.record_outcome(d.id, correct=bool(yi))
        ids.append(d.id)
    return ids


@pytest.fixture
def filled(log_location: str | Path) -> tuple[DecisionLog, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    p = rng.uniform(0.05, 0.95, 150)
    y = (rng.uniform(size=150) < p).astype(float)
    log = DecisionLog(log_location)
    _fill(log, np.full(150, 0.95), y, target="m1", calibration="cal-a")  # overconfident: drift
    ids = _fill(log, p, y, target="m1", calibration="cal-b")  # calibrated
    _fill(log, p[:40], y[:40], target="m2")  # uncalibrated, another target
    for i in ids[:50]:  # a candidate's shadows beside cal-b's decisions: left to `capgate report`
        log.record(decision(0.01, "abstain", target="m1", shadow=True, calibration="cal-c", beside=i))
    return log, p, y


def test_reports_are_split_by_target_and_version(filled: tuple[DecisionLog, np.ndarray, np.ndarray]) -> None:
    log, p, y = filled
    with log:
        reports = calibration_report(log, window=100)
        only_b = calibration_report(log, window=100, calibration="cal-b")
        uncalibrated = calibration_report(log, window=100, calibration="")
    assert [(r.method, r.target, r.calibration) for r in reports] == [
        ("probe", "m1", "cal-a"),
        ("probe", "m1", "cal-b"),
        ("probe", "m2", None),
    ]
    a, b, m2 = reports
    assert [r.label for r in reports] == ["probe m1 @ cal-a", "probe m1 @ cal-b", "probe m2"]
    assert (a.n_decisions, b.n_decisions, m2.n_decisions) == (150, 150, 40)  # no cal-c shadows
    assert b.window is not None
    assert b.window.brier == pytest.approx(float(np.mean((p[50:] - y[50:]) ** 2)))
    assert a.drift
    assert not b.drift
    assert b.advice is None
    assert a.advice == (
        f"recalibrate on the recent outcomes: capgate calibrate --db {shlex.quote(log.location)}"
        " --out DIR --method probe --target m1"
    )
    assert [r.calibration for r in only_b] == ["cal-b"]
    assert [(r.target, r.calibration) for r in uncalibrated] == [("m2", None)]


def test_cli_fail_on_drift_points_at_capgate_calibrate(
    filled: tuple[DecisionLog, np.ndarray, np.ndarray],
) -> None:
    log, _, _ = filled
    db = log.location
    log.close()
    runner = CliRunner()
    failed = runner.invoke(app, ["monitor", "--db", db, "--window", "100", "--fail-on-drift"])
    assert failed.exit_code == 1
    assert "DRIFT probe m1 @ cal-a: calibration-in-the-large" in failed.stdout
    assert (
        "drift flagged for probe m1 @ cal-a: recalibrate on the recent outcomes: capgate calibrate"
        in failed.stderr
    )
    assert "--method probe --target m1" in failed.stderr
    calm = runner.invoke(
        app, ["monitor", "--db", db, "--window", "100", "--calibration", "cal-b", "--fail-on-drift"]
    )
    assert calm.exit_code == 0, calm.output
    assert "capgate calibrate" not in calm.output
    as_json = runner.invoke(
        app, ["monitor", "--db", db, "--window", "100", "--calibration", "none", "--json"]
    )
    assert as_json.exit_code == 0, as_json.output
    assert [(r["target"], r["calibration"]) for r in json.loads(as_json.stdout)] == [("m2", None)]
