"""``capgate.learn.calibrate`` on both stores: what it keeps and writes, what it refuses, and that
an interrupted run leaves nothing half-written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _learn_traffic import SPEC, START, log_traffic, overconfident

from capgate.decision import DecisionLog
from capgate.errors import DataError
from capgate.learn import Calibration, CalibrationRefusedError, calibrate

REPO = Path(__file__).resolve().parents[1]


def test_a_miscalibrated_estimator_is_replaced_by_a_map(log_location: str | Path, tmp_path: Path) -> None:
    p, y = overconfident(400)
    with DecisionLog(log_location) as log:
        log_traffic(log, p, y)
        result = calibrate(log, out=tmp_path / "cal")
    assert result.kind in ("isotonic", "platt")
    table = {r.candidate: r for r in result.table}
    assert set(table) == {"previous", "isotonic", "platt"}
    chosen = [r for r in result.table if r.chosen]
    assert [r.candidate for r in chosen] == [result.kind]
    assert chosen[0].brier < table["previous"].brier
    assert chosen[0].diff_high < 0
    # every figure says how many outcomes it rests on: the latest 30%, fitted on the rest
    assert all(r.n == 120 for r in result.table)
    assert table["isotonic"].n_fit == 280
    assert table["previous"].n_fit == 0
    assert all(r.brier_low <= r.brier <= r.brier_high for r in result.table)
    # the held-out figures are recomputable from the log alone
    assert table["previous"].brier == pytest.approx(float(np.mean((p[280:] - y[280:]) ** 2)))
    summary = result.summary
    assert summary["counts"] == {"enforce": {"answer": {"with_outcome": 400, "without": 0}}}
    assert summary["window"]["first"] == START.isoformat()
    loaded = Calibration.load(tmp_path / "cal")
    assert loaded.version == result.version
    assert (loaded.kind, loaded.method, loaded.target) == (result.kind, "verbalized", "m")
    assert sorted(os.listdir(tmp_path / "cal")) == ["calibration.json", "calibrator.json"]


def _shuffled(seed: int, n: int = 500) -> tuple[np.ndarray, np.ndarray]:
    """A calibrated estimator's estimates with their outcomes shuffled: no signal left."""
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.4, 0.6, n)
    y = (rng.random(n) < p).astype(float)
    return p, rng.permutation(y)


@pytest.mark.parametrize("seed", range(4))
def test_the_previous_estimator_wins_when_outcomes_carry_no_signal(seed: int, tmp_path: Path) -> None:
    p, y = _shuffled(seed)
    rng = np.random.default_rng(100 + seed)
    features = rng.normal(size=(len(p), 4)).astype(np.float32)  # features without signal either
    with DecisionLog(tmp_path / "log.sqlite3") as log:
        log_traffic(log, p, y, features=features)
        result = calibrate(log, out=tmp_path / "cal", seed=seed)
    assert {r.candidate for r in result.table} == {"previous", "isotonic", "platt", "probe"}
    assert result.kind == "identity"
    assert [r.candidate for r in result.table if r.chosen] == ["previous"]
    assert sorted(os.listdir(tmp_path / "cal")) == ["calibration.json"]


# ----------------------------------------------------------------------------- refusals


def test_too_few_outcomes_is_refused_naming_the_counts(log_location: str | Path, tmp_path: Path) -> None:
    p, y = overconfident(60)
    with DecisionLog(log_location) as log:
        log_traffic(log, p, [*y[:40], *([None] * 20)])
        with pytest.raises(CalibrationRefusedError, match=r"too few outcomes: 40 decisions .* at least 100"):
            calibrate(log, out=tmp_path / "cal")
        with pytest.raises(CalibrationRefusedError, match=r"at least 50 are needed"):
            calibrate(log, out=tmp_path / "cal", min_outcomes=50)
        with pytest.raises(ValueError, match=r"give risk \(--risk\) too"):
            calibrate(log, out=tmp_path / "cal", policy="balanced")
    assert not (tmp_path / "cal").exists()


def test_outcomes_of_another_target_are_refused(log_location: str | Path, tmp_path: Path) -> None:
    p, y = overconfident(150)
    with DecisionLog(log_location) as log:
        log_traffic(log, p, y, target="model-a")
        with pytest.raises(CalibrationRefusedError, match=r"no outcomes for target 'model-b'.*model-a: 150"):
            calibrate(log, out=tmp_path / "cal", target="model-b")
        log_traffic(log, p, y, target="model-b")
        with pytest.raises(CalibrationRefusedError, match=r"several targets \(model-a: 150, model-b: 150\)"):
            calibrate(log, out=tmp_path / "cal")
        result = calibrate(log, out=tmp_path / "cal", target="model-b")
    assert result.calibration.target == "model-b"
    assert result.summary["n"] == 150
    assert result.summary["excluded"] == {"other target": 150}


def test_several_methods_need_one_chosen(tmp_path: Path) -> None:
    p, y = overconfident(150)
    with DecisionLog(tmp_path / "log.sqlite3") as log:
        log_traffic(log, p, y, method="verbalized")
        log_traffic(log, p, y, method="ptrue")
        with pytest.raises(CalibrationRefusedError, match=r"several methods \(ptrue: 150, verbalized: 150\)"):
            calibrate(log, out=tmp_path / "cal")
        with pytest.raises(CalibrationRefusedError, match=r"method 'probe'"):
            calibrate(log, out=tmp_path / "cal", method="probe")
        assert calibrate(log, out=tmp_path / "cal", method="ptrue").calibration.method == "ptrue"


def test_features_from_another_reader_are_refused(log_location: str | Path, tmp_path: Path) -> None:
    p, y = overconfident(150)
    rng = np.random.default_rng(0)
    other = {**SPEC, "weights_fingerprint": "sha256:other"}
    with DecisionLog(log_location) as log:
        log_traffic(log, p[:100], y[:100], features=rng.normal(size=(100, 4)))
        log_traffic(
            log, p[100:], y[100:], features=rng.normal(size=(50, 4)), spec=other, start=START.replace(day=2)
        )
        with pytest.raises(
            CalibrationRefusedError, match=r"features come from 2 reader specs \(\w{12}: 100, \w{12}: 50"
        ):
            calibrate(log, out=tmp_path / "cal")
        # without the probe candidate, the features are not read
        assert calibrate(log, out=tmp_path / "cal", probe=False).summary["features"] is None


def test_a_window_mixing_calibration_versions_is_refused_unless_allowed(
    log_location: str | Path, tmp_path: Path
) -> None:
    p, y = overconfident(200)
    with DecisionLog(log_location) as log:
        log_traffic(log, p[:100], y[:100])
        log_traffic(log, p[100:], y[100:], calibration="cal-000000000001", start=START.replace(day=2))
        with pytest.raises(
            CalibrationRefusedError, match=r"mixes decisions made under 2 calibration versions"
        ):
            calibrate(log, out=tmp_path / "cal")
        result = calibrate(log, out=tmp_path / "cal", allow_mixed_versions=True)
    assert result.summary["versions"] == [None, "cal-000000000001"]
    with DecisionLog(log_location) as log:  # a window of one version is fine
        one = calibrate(log, out=tmp_path / "cal2", until=START.replace(day=2))
        # a time without a zone is read as UTC: the window holds the calibrated decisions only,
        # whose calibration stays best but has no folder in the log to carry forward
        with pytest.raises(CalibrationRefusedError, match=r"calibration cal-000000000001\) stays best"):
            calibrate(log, out=tmp_path / "cal3", since=START.replace(day=2, tzinfo=None))
    assert one.summary["n"] == 100


def test_candidate_shadow_decisions_are_not_learnt_from(tmp_path: Path) -> None:
    from capgate import Estimate
    from capgate.decision import Decision

    p, y = overconfident(150)
    with DecisionLog(tmp_path / "log.sqlite3") as log:
        ids = log_traffic(log, p, y)
        for i in ids[:30]:  # a candidate's shadow decisions, each beside an enforced one
            log.record(Decision(action="abstain", estimate=Estimate(p=0.01, method="verbalized"), reason="c",
                                target="m", shadow=True, beside=i, calibration="cal-candidate0"))  # fmt: skip
        result = calibrate(log, out=tmp_path / "cal")
    assert result.summary["n"] == 150
    assert result.summary["excluded"] == {"candidate shadow": 30}


# ----------------------------------------------------------------------- writing the folder


def test_an_existing_folder_is_never_overwritten(tmp_path: Path) -> None:
    p, y = overconfident(150)
    (tmp_path / "cal").mkdir()
    (tmp_path / "cal" / "mine.txt").write_text("keep")
    with DecisionLog(tmp_path / "log.sqlite3") as log:
        log_traffic(log, p, y)
        with pytest.raises(DataError, match="already exists"):
            calibrate(log, out=tmp_path / "cal")
        first = calibrate(log, out=tmp_path / "a")
        again = calibrate(log, out=tmp_path / "b")
    assert (tmp_path / "cal" / "mine.txt").read_text() == "keep"
    assert first.version == again.version  # the same content has the same version


def test_an_interrupted_calibrate_leaves_nothing_half_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import capgate.learn._artefact as artefact

    p, y = overconfident(150)
    calls = []

    def interrupted(path: Path) -> None:
        calls.append(path)
        if len(calls) == 2:  # after the first file is safely on disk
            raise KeyboardInterrupt

    monkeypatch.setattr(artefact, "_fsync_file", interrupted)
    with DecisionLog(tmp_path / "log.sqlite3") as log:
        log_traffic(log, p, y)
        with pytest.raises(KeyboardInterrupt):
            calibrate(log, out=tmp_path / "out" / "cal", risk=0.5)
    assert len(calls) == 2
    assert os.listdir(tmp_path / "out") == []  # neither the folder nor its temporary twin


def test_a_killed_calibrate_leaves_no_folder(tmp_path: Path) -> None:
    """Killed just before the rename (the last step): only a hidden temporary folder remains."""
    p, y = overconfident(150)
    with DecisionLog(tmp_path / "log.sqlite3") as log:
        log_traffic(log, p, y)
    script = f"""
import os
import capgate.learn._artefact as artefact
from capgate.learn import calibrate
artefact.os.rename = lambda *a: os._exit(9)
calibrate({str(tmp_path / "log.sqlite3")!r}, out={str(tmp_path / "cal")!r})
"""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, timeout=300, check=False
    )
    assert done.returncode == 9, done.stderr.decode()[-500:]
    assert not (tmp_path / "cal").exists()
    left = [n for n in os.listdir(tmp_path) if n.startswith(".cal.tmp-")]
    assert len(left) == 1
    with pytest.raises(DataError, match="not a calibration folder"):
        Calibration.load(tmp_path / "cal")


def test_decisions_without_a_usable_estimate_still_teach_the_probe(tmp_path: Path) -> None:
    """A verbalized estimator that mostly fails to parse (degraded decisions) still logs the
    reader's features and gets outcomes: the probe learns from every one of them, while the
    previous estimator and its maps are fitted and compared only where it had an estimate."""
    rng = np.random.default_rng(2)
    n = 400
    X = rng.normal(size=(n, 4))
    y = (rng.random(n) < 1 / (1 + np.exp(-2.5 * X[:, 0]))).astype(float)
    p = [None if rng.random() < 0.6 else 0.5 for _ in range(n)]
    with DecisionLog(tmp_path / "log.sqlite3") as log:
        log_traffic(log, p, y, features=X)
        result = calibrate(log, out=tmp_path / "cal")
    estimated = np.array([v is not None for v in p])
    held = estimated[n - 120 :]
    assert result.kind == "probe"
    assert all(r.n == int(held.sum()) for r in result.table)  # compared where the previous had one
    assert any("had no usable estimate" in note for note in result.notes)
    assert result.candidates["probe"].training_["n"] == n - 120  # learnt from all older outcomes
    assert result.candidates["isotonic"].y_thresholds_ is not None
    assert result.summary["n"] == n


def test_too_few_usable_estimates_to_compare_is_refused_naming_the_counts(tmp_path: Path) -> None:
    """Enough outcomes, but almost no estimate to judge a candidate against the previous one."""
    rng = np.random.default_rng(4)
    p = [0.5 if i % 20 == 0 else None for i in range(200)]  # 10 usable estimates in 200
    with DecisionLog(tmp_path / "log.sqlite3") as log:
        log_traffic(log, p, (rng.random(200) < 0.3).astype(float))
        refused = r"too few usable estimates .* \(7 older, 3 held out\)"
        with pytest.raises(CalibrationRefusedError, match=refused):
            calibrate(log, out=tmp_path / "cal")
    assert not (tmp_path / "cal").exists()
