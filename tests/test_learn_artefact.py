"""The calibration folder: versions derived from content, checked on load, applied to estimators;
thresholds written as a policy; a probe learnt from logged features; the previous calibration
carried forward when it stays best."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from _learn_traffic import SPEC, START, log_traffic, overconfident

from capgate import Estimate
from capgate.decision import DecisionLog
from capgate.errors import DataError, ProbeMismatchError
from capgate.estimators import CapabilityEstimator, ProbeEstimator, Recalibrated
from capgate.learn import Calibration, CalibrationRefusedError, calibrate


class Fixed(CapabilityEstimator):
    """Returns the p given for each query (queries are the p's as text)."""

    def __init__(self, method: str = "verbalized") -> None:
        self.method = method

    def estimate(self, queries):  # type: ignore[no-untyped-def]
        return [Estimate(p=float(q), method=self.method) for q in queries]


class Toy:
    """A featurizer whose features are the query's numbers (a query is 'a b c d')."""

    spec = SPEC

    def transform(self, queries):  # type: ignore[no-untyped-def]
        return np.array([[float(v) for v in q.split()] for q in queries], dtype=np.float32)


@pytest.fixture
def isotonic_dir(tmp_path: Path) -> Path:
    p, y = overconfident(400)
    with DecisionLog(tmp_path / "log.sqlite3") as log:
        log_traffic(log, p, y)
        result = calibrate(log, out=tmp_path / "cal")
    assert result.kind in ("isotonic", "platt")
    return tmp_path / "cal"


def test_apply_maps_estimates_of_the_calibrated_method_only(isotonic_dir: Path) -> None:
    cal = Calibration.load(isotonic_dir)
    applied = cal.apply(Fixed())
    assert isinstance(applied, Recalibrated)
    e = applied.estimate_one("0.9")
    assert e.method == f"verbalized+{cal.kind}"
    assert e.details["raw_p"] == 0.9
    assert e.p == pytest.approx(float(applied.calibrator.predict([0.9])[0]))
    assert e.p < 0.85  # the estimator was overconfident (truth p**3)
    with pytest.raises(DataError, match=r"maps 'verbalized' estimates; refusing to apply it to 'ptrue'"):
        cal.apply(Fixed("ptrue"))
    assert cal.policy is None


def test_a_tampered_folder_is_refused(isotonic_dir: Path) -> None:
    calibrator = isotonic_dir / "calibrator.json"
    calibrator.write_text(calibrator.read_text().replace("0.", "0.1", 1))
    with pytest.raises(DataError, match=r"calibrator\.json: does not match the SHA-256"):
        Calibration.load(isotonic_dir)


def test_the_version_is_derived_from_the_content(isotonic_dir: Path) -> None:
    meta_path = isotonic_dir / "calibration.json"
    meta = json.loads(meta_path.read_text())
    assert meta["version"].startswith("cal-")
    assert len(meta["version"]) == 16
    meta["summary"]["n"] += 1
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(DataError, match=r"version 'cal-\w+' does not match the content"):
        Calibration.load(isotonic_dir)


def test_thresholds_are_written_as_a_policy(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    p = rng.uniform(0, 1, 600)
    y = (rng.random(600) < p).astype(float)  # a calibrated estimator
    with DecisionLog(tmp_path / "log.sqlite3") as log:
        log_traffic(log, p, y)
        result = calibrate(log, out=tmp_path / "cal", risk=0.2, delta=0.1, policy="balanced")
    cal = result.calibration
    assert result.threshold is not None
    assert 0.6 < result.threshold < 0.95
    policy = cal.policy
    assert policy is not None
    assert policy.name == "balanced"
    assert policy.rule().answer_edge == result.threshold
    text = (cal.path / "policy.yaml").read_text()
    assert "Calibrated by `capgate calibrate`" in text
    assert "600 logged decisions" in text
    assert result.summary["thresholds"]["n"] == 600  # every outcome, each scored honestly
    # what the threshold answers in the window has an error rate <= the risk, as certified
    answered = p >= result.threshold
    assert 1 - y[answered].mean() <= 0.2


def _truth(p: np.ndarray) -> np.ndarray:
    """The capability behind the estimates of the selection tests: higher than p says."""
    return np.clip(p + 0.3, 0, 1)


def test_thresholds_never_go_below_the_outcomes_enforced_traffic_has(tmp_path: Path) -> None:
    """Replay where the truth is known: an enforcing gate answered p >= 0.5 and abstained below,
    so only answered queries have outcomes. A threshold certified on those alone would answer the
    blocked queries too, unseen; calibrate floors it, and the floored policy keeps its risk on
    the next traffic, blocked queries included, where the unfloored one does not."""
    rng = np.random.default_rng(6)
    p = rng.uniform(0, 1, 800)
    y = (rng.random(800) < _truth(p)).astype(float)
    action = np.where(p >= 0.5, "answer", "abstain")
    outcomes = [yi if a == "answer" else None for yi, a in zip(y, action, strict=True)]
    with DecisionLog(tmp_path / "enforced.sqlite3") as log:
        log_traffic(log, p, outcomes, action=list(action))
        enforced = calibrate(log, out=tmp_path / "enforced", risk=0.2, probe=False)
    counts = enforced.summary["counts"]["enforce"]
    assert counts["abstain"] == {"with_outcome": 0, "without": int((p < 0.5).sum())}
    assert enforced.summary["selection_gap"] == int((p < 0.5).sum())
    thresholds = enforced.summary["thresholds"]
    floor = thresholds["floor"]
    assert enforced.threshold is not None
    assert enforced.threshold >= floor
    assert thresholds["certified"] < floor  # without the floor it would answer blocked queries
    # the floor: the kept estimator's confidence at the lowest estimate that has an outcome
    estimator = enforced.calibration.apply(Fixed())
    lowest = float(p[p >= 0.5].min())
    assert floor == pytest.approx(estimator.estimate_one(repr(lowest)).p)
    # the next traffic, every query (blocked ones too), scored against the known truth
    nxt = rng.uniform(0, 1, 20_000)
    conf = estimator.predict([repr(float(x)) for x in nxt])
    error_floored = 1 - _truth(nxt)[conf >= enforced.threshold].mean()
    error_unfloored = 1 - _truth(nxt)[conf >= thresholds["certified"]].mean()
    assert error_floored <= 0.2 < error_unfloored
    with DecisionLog(tmp_path / "shadow.sqlite3") as log:  # shadow traffic: every call proceeded
        log_traffic(log, p, y, action=list(action), shadow=True)
        shadow = calibrate(log, out=tmp_path / "shadow", risk=0.2, probe=False)
    assert shadow.summary["selection_gap"] == 0
    assert shadow.threshold is not None
    assert shadow.threshold < floor


def test_enforced_decisions_blocked_before_any_enforced_outcome_floor_on_shadow_outcomes(
    tmp_path: Path,
) -> None:
    """The rollout: shadow traffic with outcomes, then the first enforced calls blocked without
    any. No enforced decision has an outcome yet: the floor is the lowest estimate that has one."""
    rng = np.random.default_rng(6)
    p = rng.uniform(0, 1, 400)
    y = (rng.random(400) < _truth(p)).astype(float)
    with DecisionLog(tmp_path / "rollout.sqlite3") as log:
        log_traffic(log, p, y, action=list(np.where(p >= 0.5, "answer", "abstain")), shadow=True)
        later = START + timedelta(days=1)
        log_traffic(log, [0.1, 0.1, 0.1], [None, None, None], action="abstain", start=later)
        result = calibrate(log, out=tmp_path / "cal", risk=0.2, probe=False)
    assert result.summary["selection_gap"] == 3
    thresholds = result.summary["thresholds"]
    assert thresholds["floor"] <= thresholds["certified"]
    assert result.threshold == thresholds["certified"] is not None


def test_a_probe_learnt_from_logged_features_replaces_a_flat_prior(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    X = rng.normal(size=(300, 4)).astype(np.float32)
    mu = 1 / (1 + np.exp(-2.5 * X[:, 0]))
    y = (rng.random(300) < mu).astype(float)
    with DecisionLog(tmp_path / "log.sqlite3") as log:
        log_traffic(log, np.full(300, 0.5), y, features=X)
        result = calibrate(log, out=tmp_path / "cal", n_splits=3)
    assert result.kind == "probe", result.table
    probe_row = next(r for r in result.table if r.candidate == "probe")
    assert probe_row.crossfit_brier is not None
    assert probe_row.n_fit == 210
    cal = result.calibration
    assert sorted(p.name for p in cal.path.iterdir()) == [
        "calibration.json",
        "probe.json",
        "probe.safetensors",
    ]
    applied = cal.apply(Fixed(), featurizer=Toy())
    assert isinstance(applied, ProbeEstimator)
    assert applied.target_model == "m"
    queries = [" ".join(str(v) for v in row) for row in X[-5:]]
    assert applied.predict(queries) == pytest.approx(applied.probe.predict(X[-5:]), abs=1e-5)
    with pytest.raises(ProbeMismatchError):
        cal.apply(Fixed())  # no featurizer of that reader at hand: the default model is another


def test_the_previous_calibration_is_carried_forward_when_it_stays_best(tmp_path: Path) -> None:
    p, y = overconfident(300)
    with DecisionLog(tmp_path / "log.sqlite3") as log:
        log_traffic(log, p, y)
        first = calibrate(log, out=tmp_path / "v1")
        v1 = first.calibration
        log.record_calibration_event("promote", v1.version, str(v1.path), target="m")
        applied = v1.apply(Fixed())
        p2, y2 = overconfident(300, seed=1)
        est = applied.estimate([str(x) for x in p2])
        later = START.replace(day=3)
        log_traffic(log, [e.p for e in est], y2, method=est[0].method, calibration=v1.version,
                    start=later, details=[e.details for e in est])  # fmt: skip
        second = calibrate(log, out=tmp_path / "v2", since=later)
    assert second.summary["previous_version"] == v1.version
    assert [r.candidate for r in second.table if r.chosen] == ["previous"]
    assert second.kind == v1.kind  # v1's map, carried into the new version
    assert (tmp_path / "v2" / "calibrator.json").read_bytes() == (
        tmp_path / "v1" / "calibrator.json"
    ).read_bytes()
    assert second.version != v1.version
    assert any("stays" in n for n in second.notes)


def test_a_previous_calibration_the_log_cannot_locate_is_not_silently_dropped(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    p = rng.uniform(0.05, 0.95, 200)
    y = (rng.random(200) < p).astype(float)
    with DecisionLog(tmp_path / "log.sqlite3") as log:
        log_traffic(log, p, y, calibration="cal-0123456789ab")
        with pytest.raises(CalibrationRefusedError, match=r"cal-0123456789ab\) stays best .* no folder"):
            calibrate(log, out=tmp_path / "cal")


@pytest.mark.slow
def test_load_estimator_applies_a_calibration(tmp_path: Path) -> None:
    from capgate import load_estimator
    from capgate.estimators.guarded import InjectionGuard

    p, y = overconfident(300)
    with DecisionLog(tmp_path / "log.sqlite3") as log:
        log_traffic(log, p, y, method="probe")
        result = calibrate(log, out=tmp_path / "cal")
    assert result.kind in ("isotonic", "platt")
    estimator = load_estimator("default", device="cpu", calibration=tmp_path / "cal")
    assert isinstance(estimator, Recalibrated)
    assert isinstance(estimator.estimator, ProbeEstimator)
    e = estimator.estimate_one("What is 2 + 2?")
    assert e.method == f"probe+{result.kind}"
    assert e.p == pytest.approx(float(estimator.calibrator.predict([e.details["raw_p"]])[0]))
    guarded = load_estimator("default", device="cpu", calibration=result.calibration, guard=True)
    assert isinstance(guarded, InjectionGuard)
    assert guarded.method == f"probe+{result.kind}"
    with DecisionLog(tmp_path / "log.sqlite3") as log:
        log_traffic(log, p, y, method="verbalized", target="other", start=START.replace(day=5))
        verbal = calibrate(log, out=tmp_path / "verbal", target="other")
    with pytest.raises(DataError, match="maps 'verbalized' estimates; refusing to apply it to 'probe'"):
        load_estimator("default", device="cpu", calibration=verbal.calibration)


def test_a_probe_gets_no_threshold_from_enforced_traffic_with_blocked_queries(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    X = rng.normal(size=(400, 4)).astype(np.float32)
    y = (rng.random(400) < 1 / (1 + np.exp(-2.5 * X[:, 0]))).astype(float)
    p = rng.uniform(0.3, 0.7, 400)  # the enforced estimator knew nothing
    action = np.where(p >= 0.4, "answer", "abstain")
    outcomes = [yi if a == "answer" else None for yi, a in zip(y, action, strict=True)]
    with DecisionLog(tmp_path / "log.sqlite3") as log:
        log_traffic(log, p, outcomes, action=list(action), features=X)
        result = calibrate(log, out=tmp_path / "cal", risk=0.3, n_splits=3)
    assert result.kind == "probe", result.table
    assert result.threshold is None
    assert result.calibration.policy is None
    assert any("a probe orders queries its own way" in n for n in result.notes)
    assert result.summary["thresholds"]["selection_gap"] == int((p < 0.4).sum())


THREE_BANDS = """\
version: 1
name: three-bands
bands:
  - below: 0.25
    action: abstain
  - below: 0.55
    action: clarify
    question: "Which case do you mean?"
  - action: answer
on_degraded: abstain
"""


def test_a_custom_policys_bands_are_kept_or_calibrate_refuses_naming_policy(tmp_path: Path) -> None:
    """A learned version keeps the bands of the policy its decisions were made under: given that
    policy, only the answer edge moves; without it, calibrate refuses and names --policy instead
    of writing a two-band policy."""
    from capgate.learn import CalibrationRefusedError

    rng = np.random.default_rng(5)
    p = rng.uniform(0, 1, 600)
    y = (rng.random(600) < p).astype(float)
    custom = tmp_path / "three.yaml"
    custom.write_text(THREE_BANDS)
    with DecisionLog(tmp_path / "log.sqlite3") as log:
        log_traffic(log, p, y, policy="three-bands")
        with pytest.raises(CalibrationRefusedError, match=r"'three-bands'.*--policy"):
            calibrate(log, out=tmp_path / "refused", risk=0.2, delta=0.1)
        assert not (tmp_path / "refused").exists()
        result = calibrate(log, out=tmp_path / "cal", risk=0.2, delta=0.1, policy=str(custom))
    policy = result.calibration.policy
    assert policy is not None
    assert result.threshold is not None
    assert [band.action for band in policy.bands] == ["abstain", "clarify", "answer"]
    assert policy.rule().answer_edge == result.threshold
    assert policy.rule().edges[0] == (0.0, 0.25)  # the lower band stays where it was
