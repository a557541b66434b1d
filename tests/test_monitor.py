"""Rolling calibration of logged decisions and drift flags; the ``capgate monitor`` command (each on
both stores: SQLite and PostgreSQL)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from capgate import DataError, Estimate
from capgate.cli import app
from capgate.decision import Decision
from capgate.decision.analysis.monitor import calibration_report
from capgate.decision.store.log import DecisionLog
from capgate.metrics import expected_calibration_error


def fill(
    log: DecisionLog,
    p: np.ndarray,
    outcome: np.ndarray,
    *,
    method: str = "probe",
    as_mu_hat: bool = False,
) -> None:
    for pi, yi in zip(p.tolist(), outcome.tolist(), strict=True):
        d = Decision(action="answer", estimate=Estimate(p=pi, method=method), reason="t")
        log.record(d)
        if as_mu_hat:
            log.record_outcome(d.id, mu_hat=yi)
        else:
            log.record_outcome(d.id, correct=bool(yi))


@pytest.fixture
def log(log_location: str | Path) -> Iterator[DecisionLog]:
    store = DecisionLog(log_location)
    yield store
    store.close()


def test_calibrated_stream_reports_exact_metrics_and_no_drift(log: DecisionLog) -> None:
    rng = np.random.default_rng(0)
    p = rng.uniform(0, 1, 400)
    y = (rng.uniform(0, 1, 400) < p).astype(float)
    fill(log, p, y)
    (report,) = calibration_report(log, window=200)
    assert (report.method, report.n_decisions, report.n_scored, report.n_unavailable) == (
        "probe",
        400,
        400,
        0,
    )
    win, ref = report.window, report.reference
    assert win is not None
    assert ref is not None
    assert win.n == 200
    assert ref.n == 200
    # independent recomputation on the last 200 and the 200 before
    assert win.brier == pytest.approx(float(np.mean((p[200:] - y[200:]) ** 2)))
    assert ref.brier == pytest.approx(float(np.mean((p[:200] - y[:200]) ** 2)))
    assert win.ece == pytest.approx(expected_calibration_error(p[200:], y[200:]))
    assert win.z == pytest.approx(
        float(np.sum(y[200:] - p[200:]) / math.sqrt(np.sum(p[200:] * (1 - p[200:]))))
    )
    assert report.brier_delta == pytest.approx(win.brier - ref.brier)
    assert abs(win.z or 0) < 3
    assert not report.drift
    assert report.reasons == []


def test_a_shift_in_accuracy_is_flagged_by_both_rules(
    log: DecisionLog, new_log_location: Callable[[], str | Path]
) -> None:
    rng = np.random.default_rng(1)
    p = rng.uniform(0.2, 1.0, 400)
    truth = np.where(np.arange(400) < 200, p, p * 0.4)  # the model got worse; the estimator did not notice
    y = (rng.uniform(0, 1, 400) < truth).astype(float)
    fill(log, p, y)
    (report,) = calibration_report(log, window=200)
    assert report.drift
    assert report.brier_delta is not None
    assert report.brier_delta > 0.05
    assert any(r.startswith("Brier rose by") for r in report.reasons)
    assert any("over-confident" in r for r in report.reasons)
    # the same stream, before the shift, was fine
    earlier = DecisionLog(new_log_location())
    fill(earlier, p[:200], y[:200])
    assert not calibration_report(earlier, window=100)[0].drift
    earlier.close()


def test_miscalibration_from_the_start_needs_no_reference(log: DecisionLog) -> None:
    rng = np.random.default_rng(2)
    p = np.full(60, 0.9)
    y = (rng.uniform(0, 1, 60) < 0.4).astype(float)
    fill(log, p, y)
    (report,) = calibration_report(log, window=100)
    assert report.reference is None
    assert report.brier_delta is None
    assert report.drift
    assert report.window is not None
    assert report.window.z is not None
    assert report.window.z < -3


def test_small_windows_do_not_flag(log: DecisionLog) -> None:
    fill(log, np.full(10, 0.95), np.zeros(10))
    (report,) = calibration_report(log, window=50, min_count=30)
    assert not report.drift
    assert report.window is not None
    assert report.window.brier == pytest.approx(0.95**2)
    (strict,) = calibration_report(log, window=50, min_count=5)
    assert strict.drift


def test_mu_hat_outcomes_degraded_and_methods(log: DecisionLog) -> None:
    fill(log, np.array([0.5, 0.7]), np.array([0.25, 0.75]), as_mu_hat=True)
    fill(log, np.array([0.2]), np.array([1.0]), method="verbalized")
    log.record(
        Decision(
            action="abstain", estimate=Estimate.unavailable("probe", "timeout"), reason="fail", degraded=True
        )
    )
    log.record(Decision(action="answer", estimate=Estimate(p=0.4, method="probe"), reason="no outcome yet"))
    reports = {r.method: r for r in calibration_report(log, window=10)}
    assert set(reports) == {"probe", "verbalized"}
    probe = reports["probe"]
    assert (probe.n_decisions, probe.n_unavailable, probe.n_scored) == (4, 1, 2)
    assert probe.window is not None
    assert probe.window.brier == pytest.approx(((0.5 - 0.25) ** 2 + (0.7 - 0.75) ** 2) / 2)
    only = calibration_report(log, window=10, method="verbalized")
    assert [r.method for r in only] == ["verbalized"]
    assert only[0].window is not None
    assert only[0].window.brier == pytest.approx(0.64)


def test_each_decision_is_scored_on_the_mean_of_its_sources_as_report_does(log: DecisionLog) -> None:
    for i in range(40):
        d = Decision(action="answer", estimate=Estimate(p=0.5, method="probe"), reason="t")
        log.record(d)
        log.record_outcome(d.id, correct=True, source="grader")
        if i < 20:  # a later user's score only: still scored, on the mean of both sources
            log.record_outcome(d.id, score=0.0, source="user")
    (report,) = calibration_report(log, window=100)
    assert report.window is not None
    assert (report.n_scored, report.window.n) == (40, 40)
    assert report.window.mean_outcome == pytest.approx((20 * 0.5 + 20 * 1.0) / 40)


def test_bad_settings_and_missing_log(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="`window` must be a positive integer; got 0"):
        calibration_report(tmp_path / "x.sqlite3", window=0)
    with pytest.raises(DataError, match="no decision log at this path"):
        calibration_report(tmp_path / "missing.sqlite3")
    assert not (tmp_path / "missing.sqlite3").exists()


# --------------------------------------------------------------------------- CLI


def test_cli_monitor_json_table_and_drift_exit(log: DecisionLog) -> None:
    rng = np.random.default_rng(3)
    p = rng.uniform(0.3, 1.0, 120)
    y = (rng.uniform(0, 1, 120) < p * 0.3).astype(float)
    fill(log, p, y)
    runner = CliRunner()
    db = log.location
    result = runner.invoke(app, ["monitor", "--db", db, "--window", "60", "--json"])
    assert result.exit_code == 0, result.output
    (report,) = json.loads(result.output)
    assert report["method"] == "probe"
    assert report["window"]["n"] == 60
    assert report["drift"] is True
    table = runner.invoke(app, ["monitor", "--db", db, "--window", "60"])
    assert table.exit_code == 0
    assert "DRIFT probe: calibration-in-the-large" in table.output
    assert runner.invoke(app, ["monitor", "--db", db, "--window", "60", "--fail-on-drift"]).exit_code == 1
    fine = runner.invoke(
        app, ["monitor", "--db", db, "--window", "60", "--z-threshold", "1000", "--fail-on-drift"]
    )
    assert fine.exit_code == 0


def test_cli_monitor_follow_refreshes(log: DecisionLog) -> None:
    fill(log, np.array([0.5, 0.5]), np.array([1.0, 0.0]))
    result = CliRunner().invoke(
        app,
        ["monitor", "--db", log.location, "--json", "--follow", "--interval", "0", "--max-refreshes", "3"],
    )
    assert result.exit_code == 0, result.output
    assert len(result.output.strip().splitlines()) == 3


def test_cli_monitor_missing_db_exits_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["monitor", "--db", str(tmp_path / "none.sqlite3")])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ")
