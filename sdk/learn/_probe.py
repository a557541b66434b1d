"""The probe candidate: a :class:`~capgate.estimators.LinearProbe` fitted on the reader features
logged beside the decisions (``log_features``), with the outcomes as its targets.

The trainer is ``capgate probe fit``'s: :class:`LinearProbe` with its learning-rate sweep and
early stopping chosen on a validation share *inside* the data it is given (nested: the held-out
outcomes never choose its learning rate or its epoch), saved as the same safetensors + JSON
artefact with the reader's spec and the target recorded.
"""

from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from capgate.learn._traffic import CalibrationRefusedError, Traffic

if TYPE_CHECKING:
    from capgate.decision.log import DecisionLog
    from capgate.estimators.probe import LinearProbe

__all__ = ["LoggedFeatureSet", "fit_probe", "logged_features"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


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
) -> LinearProbe:
    """``capgate probe fit``'s trainer on logged features and outcomes (lr swept, early stopping
    on a seeded 10% share of what it is given), recording the reader spec and the target."""
    from capgate.estimators import ProbeTarget
    from capgate.estimators.probe import LinearProbe

    probe = LinearProbe(lr="sweep", validation_fraction=0.1, random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        probe.fit(
            X,
            y,
            feature_spec=spec,
            source=source,
            target=None if target is None else ProbeTarget(model=target),
        )
    return probe
