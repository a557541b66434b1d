"""Nested cross-validation (:func:`capgate.estimators.nested_cross_val_predict`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from capgate._util.validate import FloatArray
from capgate.estimators._common import as_vector, n_rows
from capgate.estimators._convex import kfold
from capgate.estimators.base import clone


@dataclass(frozen=True)
class NestedCV:
    """What :func:`nested_cross_val_predict` returns.

    Attributes:
        predictions: Out-of-fold prediction for every query (from the fold that held it out).
        fold: The outer fold of each query.
        prior: The outer training folds' mean µ̂, for each query (the constant-prior baseline).
        estimators: The estimator fitted on each outer training fold.
    """

    predictions: FloatArray
    fold: npt.NDArray[np.int64]
    prior: FloatArray
    estimators: list[Any]


def nested_cross_val_predict(
    estimator: Any, X: Any, y: npt.ArrayLike, *, n_splits: int = 5, random_state: int = 0
) -> NestedCV:
    """Outer K-fold predictions of ``estimator``, each fold fitted on the other folds only.

    For each outer fold a fresh, unfitted copy (:func:`~capgate.estimators.base.clone`: the parts
    ``fit`` learns, such as a :class:`Recalibrated`'s calibrator or a :class:`ProbeEstimator`'s probe,
    copied; a fitted base estimator or a featurizer shared) is fitted on the training rows alone, so
    whatever it selects inside ``fit`` (a :class:`ProbeSearch`'s inner CV) never sees the rows it
    predicts: honest held-out estimates of the whole recipe. ``estimator`` itself is left as it was.

    Args:
        estimator: Has ``get_params``, ``fit(X, y)`` and ``predict(X)``; it is not fitted itself.
        X: Features (an array with one row per query, or a sequence of queries).
        y: µ̂ per query, in [0, 1].
        n_splits: Outer folds.
        random_state: Seed of the outer folds.

    Examples:
        >>> from capgate.estimators import ProbeSearch
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(size=(100, 3))
        >>> mu = 1 / (1 + np.exp(-X[:, 0]))
        >>> cv = nested_cross_val_predict(ProbeSearch(solvers=["ridge"]), X, mu)
        >>> cv.predictions.shape, len(cv.estimators)
        ((100,), 5)
    """
    n = n_rows(X)
    mu = as_vector(y, name="y", n=n, unit=True)
    predictions = np.full(n, np.nan)
    fold = np.full(n, -1, dtype=np.int64)
    prior = np.full(n, np.nan)
    fitted: list[Any] = []
    for k, (train, test) in enumerate(kfold(n, n_splits, random_state)):
        model = clone(estimator).fit(_take(X, train), mu[train])
        predictions[test] = np.asarray(model.predict(_take(X, test)), dtype=np.float64)
        fold[test] = k
        prior[test] = float(mu[train].mean())
        fitted.append(model)
    return NestedCV(predictions, fold, prior, fitted)


def _take(X: Any, rows: np.ndarray) -> Any:
    if isinstance(X, np.ndarray):
        return X[rows]
    return [X[int(i)] for i in rows]
