"""nested_cross_val_predict on estimators with nested parts: each fold fits its own copy."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np
import numpy.typing as npt
import pytest

from capgate.estimators import (
    IsotonicCalibrator,
    LinearProbe,
    NestedCV,
    PlattCalibrator,
    ProbeEstimator,
    Recalibrated,
    UniformRandom,
    nested_cross_val_predict,
)

QUERIES = [f"question {'?' * i}" for i in range(60)]


class Lengths:
    """A toy featurizer (standing in for one that holds a model): features from the query's length."""

    spec: ClassVar[dict[str, object]] = {"model_id": "toy", "weights_fingerprint": "0", "dim": 2}

    def transform(self, queries: Sequence[str]) -> npt.NDArray[np.float32]:
        return np.array([[len(q) / 60, len(q) % 7] for q in queries], dtype=np.float32)


def _reproduces_out_of_fold(cv: NestedCV, queries: list[str]) -> None:
    for k, model in enumerate(cv.estimators):
        held_out = [q for q, f in zip(queries, cv.fold, strict=True) if f == k]
        np.testing.assert_array_equal(model.predict(held_out), cv.predictions[cv.fold == k])


@pytest.mark.parametrize(
    ("make", "learned"), [(IsotonicCalibrator, "X_thresholds_"), (PlattCalibrator, "coef_")]
)
def test_each_fold_fits_its_own_calibrator_and_shares_the_base(make: type, learned: str) -> None:
    base = UniformRandom(random_state=1)
    mu = base.predict(QUERIES) ** 2
    estimator = Recalibrated(base, make())
    cv = nested_cross_val_predict(estimator, QUERIES, mu, n_splits=5)
    calibrators = [model.calibrator for model in cv.estimators]
    assert len({id(c) for c in [*calibrators, estimator.calibrator]}) == 6  # was 1: all the caller's
    assert all(model.estimator is base for model in cv.estimators)  # the fitted base is not copied
    assert getattr(estimator.calibrator, learned) is None  # the caller's estimator is left unfitted
    _reproduces_out_of_fold(cv, QUERIES)  # fold 0's model used to carry fold 4's fit


def test_each_fold_fits_its_own_probe_and_shares_the_featurizer() -> None:
    featurizer = Lengths()
    mu = np.array([1.0 if len(q) < 40 else 0.0 for q in QUERIES])
    estimator = ProbeEstimator(featurizer, LinearProbe(lr=0.05, validation_fraction=None, max_epochs=5))
    cv = nested_cross_val_predict(estimator, QUERIES, mu, n_splits=3)
    probes = [model.probe for model in cv.estimators]
    assert len({id(p) for p in [*probes, estimator.probe]}) == 4
    assert all(model.featurizer is featurizer for model in cv.estimators)
    assert estimator.probe.coef_ is None
    _reproduces_out_of_fold(cv, QUERIES)
