"""Time-ordered splits and cross-fitting: every prediction scored on an outcome comes from a
map that was fitted without that outcome.

The held-out part is the latest share of the traffic (what the next days look like), never a
random draw. Inside the older part, :func:`cross_fit` predicts each contiguous block of time
with a map fitted on the other blocks only, so that threshold tests can use the whole window
without scoring a map on the outcomes it learnt.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from capgate.estimators.recalibration import IsotonicCalibrator, PlattCalibrator

__all__ = ["CrossFit", "Split", "cross_fit", "fit_map", "fold_blocks", "make_map", "map_fitter", "time_split"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
Fitter = Callable[[IntArray, IntArray], FloatArray]
"""``fit_predict(train_rows, test_rows)``: fit on the train rows only, predict the test rows."""

PLATT_L2 = 1e-3
"""Ridge on the Platt slope: keeps the fit finite on separable or constant confidences."""


@dataclass(frozen=True)
class Split:
    """A time-ordered split: ``train`` the older rows, ``holdout`` the latest ones (indices)."""

    train: IntArray
    holdout: IntArray


def time_split(n: int, holdout: float) -> Split:
    """Hold out the latest ``holdout`` share of ``n`` time-ordered rows (at least one each side).

    Example:
        >>> s = time_split(10, 0.3)
        >>> s.train.tolist(), s.holdout.tolist()
        ([0, 1, 2, 3, 4, 5, 6], [7, 8, 9])
    """
    if not 0.0 < holdout < 1.0:
        raise ValueError(f"`holdout` must be in (0, 1); got {holdout!r}")
    if n < 2:
        raise ValueError(f"a time split needs at least 2 rows; got {n}")
    n_hold = min(n - 1, max(1, round(holdout * n)))
    rows = np.arange(n, dtype=np.int64)
    return Split(train=rows[: n - n_hold], holdout=rows[n - n_hold :])


def fold_blocks(n: int, n_splits: int) -> list[tuple[IntArray, IntArray]]:
    """``n_splits`` contiguous blocks of ``range(n)``: for each, (the other rows, the block).

    Example:
        >>> [(a.tolist(), b.tolist()) for a, b in fold_blocks(5, 2)]
        [([3, 4], [0, 1, 2]), ([0, 1, 2], [3, 4])]
    """
    k = max(2, min(n_splits, n))
    rows = np.arange(n, dtype=np.int64)
    out = []
    for block in np.array_split(rows, k):
        out.append((np.setdiff1d(rows, block), block))
    return out


@dataclass(frozen=True)
class CrossFit:
    """Out-of-fold predictions and the folds that made them.

    Attributes:
        predictions: One per row, each from the fit that did not see the row.
        folds: ``(fitted_on, predicted)`` row indices, one pair per fit.
    """

    predictions: FloatArray
    folds: tuple[tuple[IntArray, IntArray], ...]


def cross_fit(fit_predict: Fitter, n: int, *, n_splits: int = 5) -> CrossFit:
    """Predict each of ``n`` rows with a fit that never saw it (contiguous blocks in time).

    Args:
        fit_predict: Fits on the rows it is given first and predicts the rows it is given second.
        n: Rows.
        n_splits: Blocks (fewer when there are fewer rows).

    Example:
        >>> y = np.array([0.0, 1.0, 0.0, 1.0])
        >>> cf = cross_fit(lambda tr, te: np.full(len(te), y[tr].mean()), 4, n_splits=2)
        >>> cf.predictions.tolist()
        [0.5, 0.5, 0.5, 0.5]
    """
    predictions = np.full(n, np.nan)
    folds = []
    for train, test in fold_blocks(n, n_splits):
        predictions[test] = fit_predict(train, test)
        folds.append((train, test))
    return CrossFit(predictions=predictions, folds=tuple(folds))


def make_map(kind: str) -> IsotonicCalibrator | PlattCalibrator:
    """A fresh, unfitted recalibration map of ``kind`` (``"isotonic"`` or ``"platt"``)."""
    if kind == "isotonic":
        return IsotonicCalibrator()
    if kind == "platt":
        return PlattCalibrator(l2=PLATT_L2)
    raise ValueError(f"`kind` must be 'isotonic' or 'platt'; got {kind!r}")


def fit_map(kind: str, p: FloatArray, y: FloatArray) -> IsotonicCalibrator | PlattCalibrator:
    """A ``kind`` map fitted on confidences ``p`` and outcomes ``y`` (Platt's convergence warning
    on degenerate confidences is expected and silenced: the ridge keeps it finite)."""
    calibrator = make_map(kind)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        calibrator.fit(p, y)
    return calibrator


def map_fitter(kind: str, p: FloatArray, y: FloatArray) -> Fitter:
    """A :data:`Fitter` for a ``kind`` map of confidences ``p`` on outcomes ``y``."""

    def fit_predict(train: IntArray, test: IntArray) -> FloatArray:
        return fit_map(kind, p[train], y[train]).predict(p[test])

    return fit_predict
