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


@pytest.mark.parametrize("seed", range(6))
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
