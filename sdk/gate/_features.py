"""Features kept for learning (``log_features``): each logged decision's reader features, beside the call.

A probe's estimate carries its features (:meth:`capgate.Estimate.features`); otherwise the reader
computes them in a shadow thread. The write follows the decision's (the features row refers to
it); a failure is counted and warned, naming the decision and the error's type, never the query or
the features.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from capgate.core.backend import Prompt
from capgate.errors import SettingsError
from capgate.estimators.base import CapabilityEstimator
from capgate.estimators.feature_store import spec_as_dict
from capgate.estimators.probe import Featurizer, ProbeEstimator
from capgate.gate._effects import FlowGate
from capgate.gate._results import Verdict
from capgate.gate._shadow import Shadows

if TYPE_CHECKING:
    from capgate.decision.store.log import DecisionLog


_WRAPPED = 4  # how deep own_featurizer looks through wrapping estimators (calibrated, guarded)
_DEFAULT: list[Featurizer | BaseException] = []
_DEFAULT_LOCK = threading.Lock()


class FeaturesNotLoggedError(Exception):
    """Why a decision's features were not logged (the message holds no text or feature values)."""


def default_reader() -> Featurizer:
    """The embedded model's featurizer, with the default probe's spec (loaded once per process; a
    failure is kept, not retried, and raised as :class:`FeaturesNotLoggedError`)."""
    with _DEFAULT_LOCK:
        if not _DEFAULT:
            from capgate.loading import load_estimator

            try:
                _DEFAULT.append(load_estimator("default").featurizer)
            except Exception as exc:  # kept, so every decision does not reload a broken model
                _DEFAULT.append(exc)
        found = _DEFAULT[0]
    if isinstance(found, BaseException):
        raise FeaturesNotLoggedError(
            f"the default feature reader (the embedded model) could not be loaded: {type(found).__name__}"
        ) from found
    return found


def own_featurizer(estimator: CapabilityEstimator) -> Featurizer | None:
    """A probe's featurizer, also through wrapping estimators (a recalibrated or guarded probe's
    ``estimator``); ``None`` for an estimator that reads no features."""
    for _ in range(_WRAPPED):
        if isinstance(estimator, ProbeEstimator):
            return estimator.featurizer
        inner = getattr(estimator, "estimator", None)
        if not isinstance(inner, CapabilityEstimator):
            return None
        estimator = inner
    return None


def reader_for(gate: FlowGate) -> Featurizer:
    """The featurizer whose features ``gate`` logs: its ``feature_reader``, else its probe's own,
    else the embedded model's (:func:`default_reader`)."""
    chosen = gate.settings.feature_reader
    if chosen is not None:
        return chosen
    try:
        own = own_featurizer(gate.resolve_estimator())
    except SettingsError:
        own = None
    return own if own is not None else default_reader()


def _read(reader: Featurizer, query: Prompt) -> tuple[npt.NDArray[np.float32], dict[str, Any]]:
    features = np.asarray(reader.transform([query]), dtype=np.float32)
    if features.ndim != 2 or features.shape[0] != 1:
        raise FeaturesNotLoggedError(f"the feature reader returned shape {features.shape} for one query")
    if not np.all(np.isfinite(features)):
        raise FeaturesNotLoggedError("the feature reader returned non-finite features")
    return features[0], spec_as_dict(reader.spec)


def keep_features(gate: FlowGate, verdict: Verdict, log: DecisionLog, shadows: Shadows) -> None:
    """Write the reader features of a decision just logged, beside the call (``log_features``):
    the estimate's own unless another ``feature_reader`` was asked for. A candidate's decision
    (made ``beside`` another) adds none: its query's features are its enforced decision's."""
    decision = verdict.decision
    if not gate.settings.log_features or decision.beside is not None:
        return
    carried = decision.estimate.features()

    def job() -> bool:
        chosen = gate.settings.feature_reader
        if carried is not None and (chosen is None or spec_as_dict(chosen.spec) == carried.spec):
            vector, spec = carried.vector, carried.spec
        else:
            vector, spec = _read(reader_for(gate), verdict.query)
        if log.record_features([(decision.id, vector)], spec) != 1:
            raise FeaturesNotLoggedError(
                "the log kept none (no decision with this id, or it has features already)"
            )
        return True

    def described(exc: Exception) -> str:
        detail = str(exc) if isinstance(exc, FeaturesNotLoggedError) else type(exc).__name__
        return f"features of decision {decision.id}: {detail}"

    shadows.beside(gate.stats, "features", job, described)
