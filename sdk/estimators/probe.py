"""Probe-based capability estimation: a linear probe on a model's hidden states.

:class:`LinearProbe` maps a feature vector to a predicted capability; :class:`ProbeEstimator`
pairs it with a :class:`Featurizer` (queries → hidden-state features) to make a
:class:`~capgate.CapabilityEstimator`. A saved probe records the feature spec it was trained on
(model id, weights fingerprint, layers, pooling, chat template, dimension), and
:meth:`ProbeEstimator.load` refuses a featurizer whose spec differs.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from capgate._util.validate import FloatArray
from capgate.core.backend import Prompt
from capgate.core.types import Cost, Estimate
from capgate.errors import NotFittedError, ProbeMismatchError
from capgate.estimators._common import spec_as_dict
from capgate.estimators._linear_probe import LinearProbe, spec_fingerprint
from capgate.estimators._probe_training import LR_GRID
from capgate.estimators.base import CapabilityEstimator

__all__ = ["LR_GRID", "Featurizer", "LinearProbe", "ProbeEstimator", "check_spec_match"]


@runtime_checkable
class Featurizer(Protocol):
    """Turns queries into feature vectors (for example pooled hidden states of a model).

    ``spec`` describes how: a pydantic model (such as ``capgate.local.hidden_states.FeatureSpec``) or a
    mapping, JSON-able, with at least ``model_id``, a weights fingerprint and ``dim``.
    """

    @property
    def spec(self) -> Any:
        """How the features are made (model id, weights fingerprint, layers, pooling, dim...)."""
        ...

    def transform(self, queries: Sequence[Prompt]) -> npt.NDArray[np.float32]:
        """Features of shape ``(len(queries), dim)``; row ``i`` belongs to ``queries[i]``."""
        ...


def _failed(error: Exception) -> str:
    return f"featurizer failed: {type(error).__name__}: {error}"


def _show(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def check_spec_match(
    probe_spec: Mapping[str, Any] | None, featurizer_spec: object, *, ignore: Collection[str] = ()
) -> None:
    """Raise :class:`ProbeMismatchError` unless a probe's feature spec matches a featurizer's.

    Every field (model id, weights fingerprint, layers, pooling, chat template, dim, source...) but
    those in ``ignore`` is compared; the message names each differing field and both values. Ignore
    a field only once checked that it does not change the features (say, ``source`` after
    comparing transformers and vLLM hidden states).

    Examples:
        >>> spec = {"model_id": "m", "weights_fingerprint": "abc", "dim": 4, "source": "vllm"}
        >>> check_spec_match(spec, {**spec, "source": "transformers"}, ignore=["source"])
        >>> check_spec_match(spec, {**spec, "weights_fingerprint": "def"})
        Traceback (most recent call last):
        ...
        capgate.errors.ProbeMismatchError: probe does not match the featurizer: weights_fingerprint: ...
    """
    theirs = spec_as_dict(featurizer_spec)
    if probe_spec is None:
        raise ProbeMismatchError(
            "the probe records no feature spec, so it cannot be checked against the featurizer "
            f"(model_id={theirs.get('model_id')!r}, fingerprint={spec_fingerprint(theirs)!r}); "
            "refit it with LinearProbe.fit(..., feature_spec=featurizer.spec)"
        )
    ours = spec_as_dict(probe_spec)
    keys = sorted((set(ours) | set(theirs)) - set(ignore))
    missing = object()
    diffs = [
        f"{key}: probe has {_show(ours.get(key))}, featurizer has {_show(theirs.get(key))}"
        if key in ours and key in theirs
        else f"{key}: only the {'probe' if key in ours else 'featurizer'} records it "
        f"({_show(ours.get(key, theirs.get(key)))})"
        for key in keys
        if ours.get(key, missing) != theirs.get(key, missing)
    ]
    if diffs:
        raise ProbeMismatchError(
            "probe does not match the featurizer: "
            + "; ".join(diffs)
            + f" (probe model {ours.get('model_id')!r}, featurizer model {theirs.get('model_id')!r})"
        )


class ProbeEstimator(CapabilityEstimator):
    """A capability estimator: a featurizer's hidden states fed to a linear probe.

    Cost per estimate: one forward pass (the query's prefill); ``latency_s`` is the batch's wall
    time shared evenly among its queries (the whole batch time is in ``details``). Fail-closed: if
    the featurizer raises for a batch, each query is retried alone; those that still fail, or yield
    non-finite features, come back :meth:`unavailable <capgate.Estimate.unavailable>` naming the
    error. Misuse (an unfitted probe, a featurizer whose spec or width does not match) raises.

    Args:
        featurizer: Makes the features (see :class:`Featurizer`).
        probe: The probe; fitted, or fitted later through :meth:`fit`.
        ignore_spec_fields: Feature-spec fields not compared with the probe's (see
            :func:`check_spec_match`); none by default.
        fast_path: How the reader pass's dtype was chosen, filled by :func:`capgate.load_estimator`
            (the dtype, ``chosen_by`` ``"setting"`` or ``"auto"``, and for ``"auto"`` on a CPU the
            measured bfloat16 speed-up and its threshold); copied into ``details["fast_path"]``.

    Examples:
        >>> import numpy as np
        >>> class Lengths:  # a toy featurizer: features from the query's length
        ...     spec = {"model_id": "toy", "weights_fingerprint": "0", "dim": 2}
        ...     def transform(self, queries):
        ...         return np.array([[len(q), len(q) % 7] for q in queries], dtype=np.float32)
        >>> qs = [f"q{'?' * i}" for i in range(60)]
        >>> mu = np.array([1.0 if len(q) < 30 else 0.0 for q in qs])
        >>> est = ProbeEstimator(Lengths(), LinearProbe(lr=0.05, validation_fraction=None, max_epochs=50))
        >>> est = est.fit(qs, mu)
        >>> short, long = est.estimate(["q", "q" + "?" * 58])
        >>> short.method, short.p > 0.8, long.p < 0.2
        ('probe', True, True)
    """

    method = "probe"
    _fitted_parts = ("probe",)  # fit fits only the probe; the featurizer (and its model) is shared by clones

    def __init__(
        self,
        featurizer: Featurizer,
        probe: LinearProbe,
        *,
        ignore_spec_fields: Collection[str] = (),
        fast_path: Mapping[str, Any] | None = None,
    ) -> None:
        self.featurizer = featurizer
        self.probe = probe
        self.ignore_spec_fields = ignore_spec_fields
        self.fast_path = fast_path

    @property
    def target_model(self) -> str | None:
        """The model the probe's labels were sampled from (its ``target_``), if recorded."""
        target = getattr(self.probe, "target_", None)
        return None if target is None else str(target.model)

    def fit(
        self,
        queries: Sequence[Prompt],
        y: npt.ArrayLike,
        *,
        queries_val: Sequence[Prompt] | None = None,
        y_val: npt.ArrayLike | None = None,
        source: str | None = None,
    ) -> ProbeEstimator:
        """Featurize ``queries`` and fit the probe on µ̂ = ``y``, recording the featurizer's spec.

        Returns:
            ``self``.
        """
        X = self._transform(queries)
        X_val = None if queries_val is None else self._transform(queries_val)
        self.probe.fit(X, y, X_val=X_val, y_val=y_val, feature_spec=self.featurizer.spec, source=source)
        return self

    def _transform(self, queries: Sequence[Prompt]) -> npt.NDArray[np.float32]:
        return self._checked(self.featurizer.transform(list(queries)), len(queries))

    def _transform_with_details(
        self, queries: Sequence[Prompt]
    ) -> tuple[npt.NDArray[np.float32], dict[str, Any]]:
        """Features and how the featurizer made them (its ``transform_with_details``, if any)."""
        detailed = getattr(self.featurizer, "transform_with_details", None)
        if not callable(detailed):
            return self._transform(queries), {}
        features, details = detailed(list(queries))
        return self._checked(features, len(queries)), dict(details)

    @staticmethod
    def _checked(returned: Any, n_queries: int) -> npt.NDArray[np.float32]:
        features: npt.NDArray[np.float32] = np.asarray(returned)
        if features.ndim != 2 or features.shape[0] != n_queries:
            raise ValueError(
                f"featurizer returned shape {features.shape} for {n_queries} queries; "
                "expected (n_queries, dim)"
            )
        return features

    def _check_ready(self) -> None:
        if getattr(self.probe, "coef_", None) is None:
            raise NotFittedError(self)
        check_spec_match(self.probe.feature_spec_, self.featurizer.spec, ignore=self.ignore_spec_fields)

    def predict(self, queries: Sequence[Prompt]) -> FloatArray:
        """Predicted capability per query (raises if the featurizer fails; see :meth:`estimate`)."""
        self._check_ready()
        return self.probe.predict(self._transform(queries))

    def estimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
        """One :class:`~capgate.Estimate` per query, ``method="probe"`` (fail-closed per query), each
        usable one carrying the query's features and the featurizer's spec in memory
        (:meth:`Estimate.features <capgate.Estimate.features>`), so logging features needs no second pass.
        """
        self._check_ready()
        queries = list(queries)
        if not queries:
            return []
        start = time.perf_counter()
        made: dict[str, Any] = {}  # how the features were made (say, the pass's dtype)
        try:
            features, made = self._transform_with_details(queries)
            rows: list[npt.NDArray[np.float32] | str] = list(features)
        except Exception as batch_error:
            alone = len(queries) > 1  # retry each query alone; a single query has failed already
            rows = [self._featurize_alone(q) for q in queries] if alone else [_failed(batch_error)]
        elapsed = time.perf_counter() - start
        dim = self.probe.n_features_in_
        spec = spec_as_dict(self.featurizer.spec)  # carried with each estimate's features
        cost = Cost(forward_passes=1, calls=1, latency_s=elapsed / len(queries))
        details = {"batch_size": len(queries), "batch_latency_s": elapsed, **made}
        if self.fast_path is not None:  # how the reader pass's dtype was chosen (load_estimator)
            details["fast_path"] = dict(self.fast_path)
        estimates: list[Estimate] = []
        for row in rows:
            if isinstance(row, str):
                reason = row
            elif row.shape != (dim,):
                raise ProbeMismatchError(
                    f"featurizer returned {row.shape[-1]} features; the probe expects {dim}"
                )
            elif not np.all(np.isfinite(row)):
                reason = "featurizer returned non-finite features"
            else:
                p = float(self.probe.predict(row[None, :])[0])
                estimate = Estimate(p=p, method=self.method, cost=cost, details=details)
                estimates.append(estimate.with_features(row, spec))
                continue
            estimates.append(Estimate.unavailable(self.method, reason, cost=cost, **details))
        return estimates

    def _featurize_alone(self, query: Prompt) -> npt.NDArray[np.float32] | str:
        try:
            row: npt.NDArray[np.float32] = self._transform([query])[0]
        except Exception as error:
            return _failed(error)
        return row

    def save(self, path: str | os.PathLike[str]) -> None:
        """Save the probe (see :meth:`LinearProbe.save`); the featurizer is not saved."""
        self.probe.save(path)

    @classmethod
    def load(
        cls, path: str | os.PathLike[str], featurizer: Featurizer, *, ignore_spec_fields: Collection[str] = ()
    ) -> ProbeEstimator:
        """Load a saved probe for ``featurizer``, refusing one trained on other features.

        Raises:
            ProbeMismatchError: The probe's feature spec differs from ``featurizer.spec`` in a
                field not in ``ignore_spec_fields`` (see :func:`check_spec_match`), or it has none.
            DataError: The saved files are missing or corrupt.
        """
        probe = LinearProbe.load(path)
        check_spec_match(probe.feature_spec_, featurizer.spec, ignore=ignore_spec_fields)
        return cls(featurizer, probe, ignore_spec_fields=ignore_spec_fields)
