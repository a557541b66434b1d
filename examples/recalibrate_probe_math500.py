"""Recalibrate a real probe's confidences, honestly: cross-fitted isotonic and Platt maps.

Data: the paper's Probe-MATH confidences for gpt-oss-20b on MATH-500 with 100 graded samples
per question (sdk/assets/math500_gpt-oss-20b_probe-math.jsonl; see its README). Each
calibrator is fitted on four fifths of the questions and applied to the held-out fifth, five
times, so every reported number is out-of-sample.

Run: .venv/bin/python examples/recalibrate_probe_math500.py
"""

from __future__ import annotations

import numpy as np
from rich.console import Console

from capgate.assets import MATH500_GPT_OSS_20B
from capgate.estimators import IsotonicCalibrator, PlattCalibrator
from capgate.labels import read_labelled
from capgate.metrics.table import calibration_row, format_table

DATA = MATH500_GPT_OSS_20B


def cross_fitted(
    make: type[IsotonicCalibrator] | type[PlattCalibrator], p: np.ndarray, mu: np.ndarray
) -> np.ndarray:
    """Out-of-fold recalibrated confidences (5 folds, seeded)."""
    folds = np.array_split(np.random.default_rng(0).permutation(len(p)), 5)
    out = np.empty_like(p)
    for fold in folds:
        train = np.setdiff1d(np.arange(len(p)), fold)
        out[fold] = make().fit(p[train], mu[train]).predict(p[fold])
    return out


def main() -> None:
    labelled = read_labelled(DATA, confidence=["probe_conf_raw"])
    raw = labelled.confidences["probe_conf_raw"]
    sources = {
        "Probe-MATH (raw)": raw,
        "+ isotonic (5-fold)": cross_fitted(IsotonicCalibrator, raw, labelled.mu_hat),
        "+ Platt (5-fold)": cross_fitted(PlattCalibrator, raw, labelled.mu_hat),
    }
    rows = [calibration_row(name, p, labelled.correct, labelled.k) for name, p in sources.items()]
    Console(width=200).print(format_table(rows, title=f"{DATA.name}: {len(labelled)} questions"))


if __name__ == "__main__":
    main()
