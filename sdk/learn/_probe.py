"""The probe candidate: a :class:`~capgate.estimators.LinearProbe` fitted on the reader features
logged beside the decisions (``log_features``), with the outcomes as its targets.

The trainer is the shipped default probe's: :class:`~capgate.estimators.ProbeSearch` with the
ridge solver, its L2 strength chosen by exact leave-one-out error *inside* the data it is given
(the held-out outcomes never choose it), a logistic link on its out-of-fold scores, saved as the
same safetensors + JSON artefact with the reader's spec and target. On a few hundred queries it
beats ``capgate probe fit``'s SGD recipe (early stopping on a dozen queries) on the next traffic's
Brier and AUROC, in a fraction of the time (``bench/RESULTS.md``, "Learning from traffic", run 4).

When queries recur, it is fitted on one row per query (its mean outcome), as probes are on
harvested µ̂: on raw outcomes its inner validation would hold outcomes of queries it trains on,
and choose too weak a penalty.
"""

from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import numpy.typing as npt

from capgate._util.validate import FloatArray
from capgate.learn._traffic import CalibrationRefusedError, Traffic

if TYPE_CHECKING:
    from capgate.decision.store.log import DecisionLog
    from capgate.estimators.probe import LinearProbe

_Rows = TypeVar("_Rows", npt.NDArray[np.float32], npt.NDArray[np.float64])


@dataclass(frozen=True)
class LoggedFeatureSet:
    """Features logged for the traffic's decisions, all from one reader spec.

    Attributes:
        X: One row per decision of the traffic (NaN rows where none was logged).
        has: Which decisions have features.
        spec: The reader's feature spec.
        spec_sha256: Its hash as the log keys it.
    """

    X: npt.NDArray[np.float32]
    has: npt.NDArray[np.bool_]
    spec: dict[str, Any]
    spec_sha256: str


def logged_features(
    log: DecisionLog, traffic: Traffic, *, reader_spec_sha256: str | None = None
) -> LoggedFeatureSet | None:
    """The features logged for ``traffic``'s decisions (``None`` when none were logged).

    Raises:
        CalibrationRefusedError: They come from more than one reader spec, or from another one
            than ``reader_spec_sha256``: features of different readers are different inputs.
    """
    found = log.features(list(traffic.ids))
    if not found:
        return None
    specs = Counter(f.spec_sha256 for f in found.values())
    if len(specs) > 1:
        listed = ", ".join(f"{sha[:12]}: {n}" for sha, n in specs.most_common())
        raise CalibrationRefusedError(
            f"the window's features come from {len(specs)} reader specs ({listed} decisions); "
            "a probe is fitted on one reader's features: narrow the window to one reader",
            path=log.location,
        )
    sha = next(iter(specs))
    if reader_spec_sha256 is not None and sha != reader_spec_sha256:
        raise CalibrationRefusedError(
            f"the window's features come from reader spec {sha[:12]}, not the expected "
            f"{reader_spec_sha256[:12]}: features from another reader cannot train this probe",
            path=log.location,
        )
    first = next(iter(found.values()))
    dim = int(first.vector.shape[-1])
    X = np.full((len(traffic), dim), np.nan, dtype=np.float32)
    has = np.zeros(len(traffic), dtype=bool)
    for i, decision_id in enumerate(traffic.ids):
        feature = found.get(decision_id)
        if feature is not None:
            X[i] = feature.vector
            has[i] = True
    return LoggedFeatureSet(X=X, has=has, spec=dict(first.spec), spec_sha256=sha)


def fit_probe(
    X: npt.NDArray[np.float32],
    y: FloatArray,
    *,
    spec: dict[str, Any],
    target: str | None,
    source: str,
    seed: int,
    groups: npt.ArrayLike | None = None,
) -> LinearProbe:
    """A ridge probe on logged features and outcomes (:class:`~capgate.estimators.ProbeSearch`),
    recording the reader spec and target; with ``groups`` (one label per outcome: its query),
    fitted on one row per query (its mean outcome and mean features)."""
    from capgate.estimators import ProbeSearch, ProbeTarget

    if groups is not None:
        X, y = by_query(X, y, groups)
        source = f"{source} ({len(y)} queries)"

    search = ProbeSearch(solvers=("ridge",), random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        search.fit(
            X,
            y,
            feature_spec=spec,
            source=source,
            target=None if target is None else ProbeTarget(model=target),
        )
    assert search.best_estimator_ is not None
    return search.best_estimator_


def by_query(X: _Rows, y: FloatArray, groups: npt.ArrayLike) -> tuple[_Rows, FloatArray]:
    """One row per group (in order of first appearance): the mean of its feature rows (in ``X``'s
    dtype) and of its outcomes.

    Examples:
        >>> X = np.array([[1.0], [2.0], [1.0]], dtype=np.float32)
        >>> Xq, yq = by_query(X, np.array([1.0, 0.0, 0.0]), ["a", "b", "a"])
        >>> Xq.ravel().tolist(), yq.tolist()
        ([1.0, 2.0], [0.5, 0.0])
    """
    labels = np.asarray(groups)
    if labels.shape != (len(y),):
        raise ValueError(f"`groups` must have one label per outcome ({len(y)}); got shape {labels.shape}")
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")  # unique() sorts labels; keep first-seen order
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    row = rank[inverse]
    counts = np.bincount(row, minlength=order.size).astype(np.float64)
    y_q = np.bincount(row, weights=np.asarray(y, dtype=np.float64), minlength=order.size) / counts
    X_q = np.zeros((order.size, X.shape[1]), dtype=np.float64)
    np.add.at(X_q, row, X.astype(np.float64))
    return (X_q / counts[:, None]).astype(X.dtype), y_q
