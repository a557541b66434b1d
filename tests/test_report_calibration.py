"""``capgate report`` split by calibration version, and a candidate calibration compared with the
enforced one on the same decisions (c.beside == d.id, both scored on d's outcome), on both
stores; every figure checked against numpy on the same data."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from _fakes import decision
from typer.testing import CliRunner

from capgate.cli import app
from capgate.decision import DecisionLog
from capgate.decision.analysis.report import gate_report, wilson

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
N = 120


def _traffic(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per query: the true rate q, the outcome y ~ Bernoulli(q), and a flat enforced estimate."""
    rng = np.random.default_rng(seed)
    q = rng.uniform(0.05, 0.95, N)
    y = (rng.uniform(size=N) < q).astype(float)
    return q, y, np.full(N, 0.6)


def _fill(log: DecisionLog, *, stopped_unscored: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    q, y, flat = _traffic()
    for i in range(N):
        at = T0 + timedelta(seconds=i)
        enforced = decision(
            float(flat[i]), policy="balanced", target="m1", calibration="cal-a", created_at=at
        )
        if stopped_unscored and i % 3 == 0:
            enforced = enforced.model_copy(update={"action": "abstain"})
        candidate = decision(
            float(q[i]),
            "answer" if q[i] >= 0.5 else "abstain",
            policy="balanced",
            target="m1",
            calibration="cal-b",
            shadow=True,
            beside=enforced.id,
            created_at=at,
        )
        log.record(enforced)
        log.record(candidate)
        if not (stopped_unscored and enforced.action == "abstain"):
            log.record_outcome(enforced.id, correct=bool(y[i]), source="grader")
    for i in range(5):  # uncalibrated decisions of the same policy and target: a group of their own
        log.record(decision(0.5, policy="balanced", target="m1", created_at=T0 + timedelta(seconds=i)))
    return q, y, flat


def test_groups_split_by_version_and_the_candidate_is_scored_on_the_enforced_outcomes(
    log_location: str | Path,
) -> None:
    with DecisionLog(log_location) as log:
        q, y, flat = _fill(log)
        report = gate_report(log, min_outcomes=30)
        by_source = gate_report(log, min_outcomes=30, source="grader")
    groups = {(g.mode, g.calibration_version): g for g in report.groups}
    assert set(groups) == {("enforce", "cal-a"), ("candidate", "cal-b"), ("enforce", None)}
    enforced, candidate, plain = (
        groups["enforce", "cal-a"],
        groups["candidate", "cal-b"],
        groups["enforce", None],
    )
    assert (enforced.decisions, candidate.decisions, plain.decisions) == (N, N, 5)
    assert enforced.label == "balanced / - / - / m1 / enforce @ cal-a"
    assert plain.label == "balanced / - / - / m1 / enforce"
    assert candidate.with_outcome == N  # each on the outcome of the decision beside it
    assert plain.with_outcome == 0
    assert candidate.calibration is not None
    assert enforced.calibration is not None
    assert candidate.calibration.brier.value == pytest.approx(np.mean((q - y) ** 2))
    assert enforced.calibration.brier.value == pytest.approx(np.mean((flat - y) ** 2))
    through = q >= 0.5
    assert candidate.accuracy_gated == wilson(float(y[through].sum()), int(through.sum()))
    assert any("scored on the outcomes of the decisions beside them" in note for note in candidate.notes)
    by_source_groups = {(g.mode, g.calibration_version): g for g in by_source.groups}
    assert by_source_groups["candidate", "cal-b"].calibration == candidate.calibration

    (c,) = report.comparisons
    assert (c.target, c.enforced, c.candidate, c.pairs, c.with_outcome) == ("m1", "cal-a", "cal-b", N, N)
    assert c.enough_outcomes
    assert c.brier_candidate is not None
    assert c.brier_enforced is not None
    assert c.brier_difference is not None
    assert c.brier_candidate.value == pytest.approx(np.mean((q - y) ** 2))
    assert c.brier_enforced.value == pytest.approx(np.mean((flat - y) ** 2))
    diff = (q - y) ** 2 - (flat - y) ** 2
    half = 1.959963984540054 * diff.std(ddof=1) / np.sqrt(N)
    assert (c.brier_difference.value, c.brier_difference.low, c.brier_difference.high) == pytest.approx(
        (diff.mean(), diff.mean() - half, diff.mean() + half)
    )
    assert c.brier_difference.high < 0  # the informative candidate beats the flat estimate
    assert c.coverage_candidate == wilson(float(through.sum()), N)
    enforced_through = np.ones(N, dtype=bool)  # the flat 0.6 lets everything through
    assert c.coverage_enforced == wilson(float(enforced_through.sum()), N)
    assert c.agreement == wilson(float((through == enforced_through).sum()), N)
    assert c.auroc_enforced is None or c.auroc_enforced == pytest.approx(0.5)
    assert c.auroc_candidate is not None
    assert c.auroc_candidate > 0.6
    assert by_source.comparisons == report.comparisons
    text = report.format()
    assert "== candidate calibration m1: cal-b vs cal-a (same decisions) ==" in text
    assert "the candidate is better" in text
    assert json.loads(json.dumps(report.to_dict()))["comparisons"][0]["candidate"] == "cal-b"


def test_enforced_stops_without_outcomes_are_counted_and_left_out(log_location: str | Path) -> None:
    with DecisionLog(log_location) as log:
        _fill(log, stopped_unscored=True)
        (c,) = gate_report(log, min_outcomes=30).comparisons
    stopped = N // 3  # every third enforced decision abstained, and got no outcome
    assert c.pairs == N
    assert c.with_outcome == N - stopped
    assert c.stopped_without_outcome == stopped
    assert any(f"{stopped} pairs were stopped by the enforced version" in n for n in c.notes)


def test_too_few_paired_outcomes_give_no_rate(log_location: str | Path) -> None:
    with DecisionLog(log_location) as log:
        _fill(log)
        (c,) = gate_report(log, min_outcomes=500).comparisons
    assert not c.enough_outcomes
    assert c.brier_difference is None
    assert any(f"only {N} pairs have an outcome (at least 500 needed)" in n for n in c.notes)


def test_the_window_applies_to_the_pairs(log_location: str | Path) -> None:
    with DecisionLog(log_location) as log:
        _fill(log)
        (c,) = gate_report(log, since=T0 + timedelta(seconds=100), min_outcomes=5).comparisons
    assert c.pairs == N - 100


def test_capgate_report_json_carries_the_comparison(tmp_path: Path) -> None:
    db = tmp_path / "d.sqlite3"
    with DecisionLog(db) as log:
        _fill(log)
    done = CliRunner().invoke(app, ["report", "--db", str(db), "--json"])
    assert done.exit_code == 0, done.output
    data = json.loads(done.output)
    assert [c["label"] for c in data["comparisons"]] == ["m1: cal-b vs cal-a"]
    assert {(g["mode"], g["calibration_version"]) for g in data["groups"]} == {
        ("enforce", "cal-a"),
        ("candidate", "cal-b"),
        ("enforce", None),
    }
