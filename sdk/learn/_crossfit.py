"""Time-ordered splits and cross-fitting: every prediction scored on an outcome comes from a
map fitted without that outcome.

The held-out part is the latest share of the traffic, never a random draw. In the older part,
:func:`cross_fit` predicts each contiguous block of time with a map fitted on the other blocks,
so threshold tests can use the whole window. Given ``groups`` (each decision's query), every
outcome of a query stays on one side (held out: the most recently seen queries, whole; a fold:
a run of queries in the order first seen, every fold some); otherwise a fit that memorizes queries
(a probe) would be scored on queries it was fitted on, and look better than it is on new ones.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from capgate._util.validate import FloatArray, IntArray
from capgate.estimators.recalibration import IsotonicCalibrator, PlattCalibrator

Fitter = Callable[[IntArray, IntArray], FloatArray]
"""``fit_predict(train_rows, test_rows)``: fit on the train rows only, predict the test rows."""

PLATT_L2 = 1e-3
"""Ridge on the Platt slope: keeps the fit finite on separable or constant confidences."""


@dataclass(frozen=True)
class Split:
    """A time-ordered split: ``train`` the older rows, ``holdout`` the latest ones (indices)."""

    train: IntArray
    holdout: IntArray


def time_split(n: int, holdout: float, groups: npt.ArrayLike | None = None) -> Split:
    """Hold out the latest ``holdout`` share of ``n`` time-ordered rows (at least one each side);
    with ``groups`` (one label per row: its query), whole groups, most recently seen first.

    Examples:
        >>> s = time_split(10, 0.3)
        >>> s.train.tolist(), s.holdout.tolist()
        ([0, 1, 2, 3, 4, 5, 6], [7, 8, 9])
        >>> s = time_split(6, 0.3, groups=["a", "b", "a", "c", "b", "c"])
        >>> s.train.tolist(), s.holdout.tolist()
        ([0, 1, 2, 4], [3, 5])
    """
    if not 0.0 < holdout < 1.0:
        raise ValueError(f"`holdout` must be in (0, 1); got {holdout!r}")
    if n < 2:
        raise ValueError(f"a time split needs at least 2 rows; got {n}")
    n_hold = min(n - 1, max(1, round(holdout * n)))
    rows = np.arange(n, dtype=np.int64)
    if groups is None:
        return Split(train=rows[: n - n_hold], holdout=rows[n - n_hold :])
    labels = _labels(groups, n)
    last_seen = {g: i for i, g in enumerate(labels.tolist())}
    held: set[Any] = set()
    count = 0
    by_recency = sorted(last_seen, key=last_seen.__getitem__, reverse=True)
    sizes = dict(zip(*np.unique(labels, return_counts=True), strict=True))
    for group in by_recency[:-1]:  # at least one group stays on the older side
        if count >= n_hold:
            break
        held.add(group)
        count += int(sizes[group])
    in_holdout = np.array([g in held for g in labels.tolist()], dtype=bool)
    return Split(train=rows[~in_holdout], holdout=rows[in_holdout])


def fold_blocks(
    n: int, n_splits: int, groups: npt.ArrayLike | None = None
) -> list[tuple[IntArray, IntArray]]:
    """``n_splits`` contiguous blocks of ``range(n)``: for each, (the other rows, the block); with
    ``groups``, the groups in the order first seen are cut into ``n_splits`` runs (fewer with
    fewer groups) and a row goes to its group's block. A lone group makes no block.

    Examples:
        >>> [(a.tolist(), b.tolist()) for a, b in fold_blocks(5, 2)]
        [([3, 4], [0, 1, 2]), ([0, 1, 2], [3, 4])]
        >>> [(a.tolist(), b.tolist()) for a, b in fold_blocks(5, 2, groups=["a", "b", "c", "a", "d"])]
        [([2, 4], [0, 1, 3]), ([0, 1, 3], [2, 4])]
    """
    rows = np.arange(n, dtype=np.int64)
    block_of = np.empty(n, dtype=np.int64)
    if groups is None:
        k = max(2, min(n_splits, n))
        for b, block in enumerate(np.array_split(rows, k)):
            block_of[block] = b
    else:
        labels = _labels(groups, n).tolist()
        first_seen = list(dict.fromkeys(labels))
        k = max(2, min(n_splits, len(first_seen)))
        block_of_group: dict[Any, int] = {}
        for b, run in enumerate(np.array_split(np.arange(len(first_seen)), k)):
            block_of_group.update((first_seen[j], b) for j in run.tolist())
        block_of[:] = [block_of_group[g] for g in labels]
    out = []
    for b in range(k):
        block = rows[block_of == b]
        if len(block) and len(block) < n:
            out.append((rows[block_of != b], block))
    return out


def _labels(groups: npt.ArrayLike, n: int) -> npt.NDArray[Any]:
    labels = np.asarray(groups)
    if labels.shape != (n,):
        raise ValueError(f"`groups` must have one label per row ({n}); got shape {labels.shape}")
    return labels


@dataclass(frozen=True)
class CrossFit:
    """Out-of-fold predictions and the folds that made them.

    Attributes:
        predictions: One per row, each from the fit that did not see the row.
        folds: ``(fitted_on, predicted)`` row indices, one pair per fit.
    """

    predictions: FloatArray
    folds: tuple[tuple[IntArray, IntArray], ...]


def cross_fit(
    fit_predict: Fitter, n: int, *, n_splits: int = 5, groups: npt.ArrayLike | None = None
) -> CrossFit:
    """Predict each of ``n`` rows with a fit that never saw it (contiguous blocks in time).

    Args:
        fit_predict: Fits on the rows it is given first and predicts the rows it is given second.
        n: Rows.
        n_splits: Blocks (fewer when there are fewer rows).
        groups: One label per row (its query): a group's rows share a fold (see :func:`fold_blocks`).

    Examples:
        >>> y = np.array([0.0, 1.0, 0.0, 1.0])
        >>> cf = cross_fit(lambda tr, te: np.full(len(te), y[tr].mean()), 4, n_splits=2)
        >>> cf.predictions.tolist()
        [0.5, 0.5, 0.5, 0.5]
    """
    predictions = np.full(n, np.nan)
    folds = []
    for train, test in fold_blocks(n, n_splits, groups):
        predictions[test] = fit_predict(train, test)
        folds.append((train, test))
    return CrossFit(predictions=predictions, folds=tuple(folds))


def fit_map(kind: str, p: FloatArray, y: FloatArray) -> IsotonicCalibrator | PlattCalibrator:
    """A ``kind`` (``"isotonic"`` or ``"platt"``) map fitted on confidences ``p`` and outcomes ``y``
    (Platt's convergence warning on degenerate confidences is silenced: the ridge keeps it finite)."""
    if kind not in ("isotonic", "platt"):
        raise ValueError(f"`kind` must be 'isotonic' or 'platt'; got {kind!r}")
    calibrator = IsotonicCalibrator() if kind == "isotonic" else PlattCalibrator(l2=PLATT_L2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        calibrator.fit(p, y)
    return calibrator


def map_fitter(kind: str, p: FloatArray, y: FloatArray) -> Fitter:
    """A :data:`Fitter` for a ``kind`` map of confidences ``p`` on outcomes ``y``."""

    def fit_predict(train: IntArray, test: IntArray) -> FloatArray:
        return fit_map(kind, p[train], y[train]).predict(p[test])

    return fit_predict
