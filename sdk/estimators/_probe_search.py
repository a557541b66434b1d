""":class:`capgate.estimators.ProbeSearch`: a probe trainer that chooses layers, solver and
regularization by inner CV."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeAlias

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

from capgate._util.saved import read_saved
from capgate._util.validate import (
    FloatArray,
    check_choice,
    check_int_at_least,
    check_positive_int,
    check_positive_number,
)
from capgate.errors import DataError
from capgate.estimators import _common
from capgate.estimators._convex import fit_link, kfold, layer_candidates, pool_layers, ridge_loo, zscore
from capgate.estimators._linear_probe import LinearProbe
from capgate.estimators._probe_training import fit_weights
from capgate.estimators._target import ProbeTarget
from capgate.estimators.base import Params

Solver: TypeAlias = Literal["ridge", "logistic", "sgd"]
"""``"ridge"``: ridge regression of µ̂ (closed form) and a logistic link; ``"logistic"``: L2
logistic regression on the soft targets (L-BFGS); ``"sgd"``: :class:`LinearProbe`'s paper recipe."""

DEFAULT_ALPHAS: tuple[float, ...] = tuple(float(a) for a in np.logspace(-4, 3, 15))
"""L2 strengths tried by default: 1e-4 to 1e3 in half decades (per-query mean loss + (α/2)||w||²)."""

SEARCH_FORMAT = "capgate.probe_search"
SEARCH_FILE = "search.json"
_SOLVERS = ("ridge", "logistic", "sgd")
_CONVEX_LR = 0.0  # what a convex fit records as LinearProbe.lr_: no SGD learning rate was used

Config: TypeAlias = tuple[tuple[int, ...] | None, str, float | None, bool]


class ProbeSearch(Params):
    """Fit a linear capability probe, choosing its recipe by K-fold CV inside the training data.

    Each recipe is scored on out-of-fold predictions of ``n_splits`` inner folds of the data
    given to :meth:`fit` (nothing else); the best is refit on all of it:

    - **layers** (per-layer features ``(n, n_layers, dim)`` only): each single layer, contiguous
      ranges and the mean of all layers (:func:`layer_candidates`), or the sets you give; a set's
      features are the mean of its layers, which is what a
      :class:`~capgate.local.hidden_states.HiddenStateFeaturizer` with ``layers=set`` computes;
    - **solver**: ridge on µ̂ (closed form), logistic regression on soft labels (L-BFGS), the
      paper's SGD recipe (:class:`LinearProbe`); each solver's linear score is mapped to a
      probability by a logistic link ``sigmoid(a * score + c)`` fitted on the out-of-fold scores;
    - **regularization** ``alpha`` and **standardization**.

    Layer sets are screened first by ridge's exact leave-one-out error (one eigendecomposition per
    set for all strengths); every solver is then scored by K-fold CV on the ``screen`` best sets
    (stage 2). The result, ``best_estimator_``, is an ordinary :class:`LinearProbe` (saving,
    loading, :class:`ProbeEstimator` and :func:`capgate.load_estimator` work unchanged) whose
    feature spec names the chosen layers.

    Args:
        solvers: Solvers to try (see :data:`Solver`).
        alphas: L2 strengths to try for ridge and logistic.
        layers: ``"auto"`` or a list of layer sets (positions along axis 1 of ``X``).
        standardize: Whether to z-score the features; both values may be tried.
        n_splits: Inner folds.
        screen: Layer sets kept after the ridge screen for the other solvers.
        ensemble: Instead of refitting the chosen recipe on all data, average (in logit space)
            the ``n_splits`` inner-fold probes: still one linear probe.
        scoring: What the inner CV minimizes: ``"brier"`` (capability Brier) or ``"bce"``.
        random_state: Seed of the inner folds (and of the SGD solver).

    Attributes:
        best_estimator_: The chosen probe, a fitted :class:`LinearProbe`.
        best_params_: ``layers`` (positions, or ``None`` for 2-D ``X``), ``solver``, ``alpha``,
            ``standardize``.
        best_score_: Its inner-CV score (lower is better).
        cv_results_: One entry per recipe tried: ``layers``, ``solver``, ``alpha``,
            ``standardize``, ``brier``, ``bce``, ``stage`` (1: ridge leave-one-out screen of the
            layer sets, 2: K-fold CV of every solver on the kept sets).
        layers_: Hidden-state indices of the chosen layers (from the feature spec), or ``None``.
        n_layers_in_: Layers in ``X`` (``None`` for 2-D ``X``).
        n_features_in_: Feature width.

    Examples:
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(size=(120, 3, 4))  # 120 queries, 3 layers, 4 features
        >>> mu = 1 / (1 + np.exp(-2 * X[:, 1, 0]))  # only layer 1 carries the signal
        >>> search = ProbeSearch(solvers=["ridge"], alphas=[1e-3, 1e-1]).fit(X, mu)
        >>> search.best_params_["layers"], search.best_params_["solver"]
        ([1], 'ridge')
    """

    best_estimator_: LinearProbe | None

    def __init__(
        self,
        *,
        solvers: Sequence[Solver] = ("ridge", "logistic"),
        alphas: Sequence[float] = DEFAULT_ALPHAS,
        layers: Literal["auto"] | Sequence[Sequence[int]] = "auto",
        standardize: Sequence[bool] = (True,),
        n_splits: int = 5,
        screen: int = 3,
        ensemble: bool = False,
        scoring: Literal["brier", "bce"] = "brier",
        random_state: int = 0,
    ) -> None:
        self.solvers = solvers
        self.alphas = alphas
        self.layers = layers
        self.standardize = standardize
        self.n_splits = n_splits
        self.screen = screen
        self.ensemble = ensemble
        self.scoring = scoring
        self.random_state = random_state
        self.best_estimator_ = None

    def _check_settings(self) -> None:
        if isinstance(self.solvers, str) or not self.solvers or any(s not in _SOLVERS for s in self.solvers):
            raise ValueError(f"`solvers` must be a non-empty list of {list(_SOLVERS)}; got {self.solvers!r}")
        try:
            if isinstance(self.alphas, str) or len(self.alphas) == 0:
                raise ValueError
            for alpha in self.alphas:
                check_positive_number("alphas", alpha)
        except (TypeError, ValueError):
            msg = f"`alphas` must be a non-empty list of positive numbers; got {self.alphas!r}"
            raise ValueError(msg) from None
        if isinstance(self.standardize, bool | str) or not self.standardize:
            raise ValueError(f"`standardize` must be a non-empty list of booleans; got {self.standardize!r}")
        check_int_at_least("n_splits", self.n_splits, 2)
        check_positive_int("screen", self.screen)
        check_choice("scoring", self.scoring, ("brier", "bce"))
        check_int_at_least("random_state", self.random_state, 0)

    def _candidates(self, n_layers: int | None) -> list[tuple[int, ...] | None]:
        if n_layers is None:
            if self.layers != "auto":
                raise ValueError("`layers` sets need per-layer features X of shape (n, n_layers, dim)")
            return [None]
        if isinstance(self.layers, str):
            if self.layers != "auto":
                raise ValueError(f"`layers` must be 'auto' or a list of layer sets; got {self.layers!r}")
            return list(layer_candidates(n_layers))
        sets: list[tuple[int, ...] | None] = []
        for chosen in self.layers:
            picked = tuple(sorted({int(i) for i in chosen}))
            if not picked or picked[0] < 0 or picked[-1] >= n_layers:
                raise ValueError(f"layer set {list(chosen)} is empty or outside X's {n_layers} layers")
            sets.append(picked)
        if not sets:
            raise ValueError("`layers` must hold at least one layer set")
        return sets

    def fit(
        self,
        X: npt.ArrayLike,
        y: npt.ArrayLike,
        *,
        feature_spec: object | None = None,
        source: str | None = None,
        target: ProbeTarget | Mapping[str, Any] | None = None,
    ) -> ProbeSearch:
        """Choose the probe's recipe by inner CV on ``(X, y)`` and refit it on all of them.

        Args:
            X: Features ``(n_queries, dim)``, or per-layer features ``(n_queries, n_layers, dim)``
                (:meth:`~capgate.local.hidden_states.HiddenStateFeaturizer.transform_layers`).
            y: Empirical capabilities µ̂ in [0, 1], one per query.
            feature_spec: The spec of the featurizer that made ``X`` (for per-layer features,
                its ``layers`` name the hidden state of each position along axis 1); the chosen
                probe records it with ``layers`` narrowed to the chosen ones.
            source: Where the labels came from, for the saved training summary.
            target: The model the labels measure (:class:`~capgate.estimators.ProbeTarget`),
                recorded as the chosen probe's ``target_``.

        Returns:
            ``self``.

        Raises:
            ValueError: Bad settings or data: ``X`` not 2-D/3-D or non-finite (rows named), ``y``
                of another length or outside [0, 1] (entry named), a spec that disagrees with ``X``.
        """
        self._check_settings()
        features = _common.as_matrix(X, layered=True)
        mu = _common.as_vector(y, name="y", n=features.shape[0], unit=True)
        n_layers = features.shape[1] if features.ndim == 3 else None
        spec = None if feature_spec is None else _common.spec_as_dict(feature_spec)
        hidden = self._hidden_indices(spec, features)
        if features.shape[0] < 2 * self.n_splits:
            raise ValueError(
                f"{self.n_splits}-fold CV needs at least {2 * self.n_splits} queries; got {features.shape[0]}"
            )
        folds = kfold(features.shape[0], self.n_splits, self.random_state)
        rows: list[dict[str, Any]] = []
        links: dict[Config, tuple[float, float]] = {}

        candidates = self._candidates(n_layers)
        if len(candidates) > 1:
            for layers in candidates:
                for std in self.standardize:
                    self._screen(features, mu, layers, bool(std), rows)
        best_by_set: dict[Any, float] = {}
        for row in rows:
            key = None if row["layers"] is None else tuple(row["layers"])
            best_by_set[key] = min(best_by_set.get(key, math.inf), row[self.scoring])
        kept = sorted(best_by_set, key=lambda k: best_by_set[k])[: self.screen] if rows else candidates
        for layers in kept:
            for solver in self.solvers:
                for std in self.standardize:
                    self._score_group(features, mu, folds, layers, solver, bool(std), rows, links)
        final = [i for i, row in enumerate(rows) if row["stage"] == 2]
        best = min(final, key=lambda i: (rows[i][self.scoring], i))
        chosen = rows[best]
        config: Config = (
            None if chosen["layers"] is None else tuple(chosen["layers"]),
            chosen["solver"],
            chosen["alpha"],
            chosen["standardize"],
        )
        self.cv_results_ = {key: [row[key] for row in rows] for key in rows[0]}
        self.best_params_ = {k: chosen[k] for k in ("layers", "solver", "alpha", "standardize")}
        self.best_score_ = float(chosen[self.scoring])
        self.n_layers_in_ = n_layers
        self.n_features_in_ = int(features.shape[-1])
        self.layers_ = None if config[0] is None or hidden is None else [hidden[i] for i in config[0]]
        self.best_estimator_ = self._final_probe(
            features, mu, folds, config, links[config], spec, source, target, chosen
        )
        return self

    def _hidden_indices(self, spec: dict[str, Any] | None, features: np.ndarray) -> list[int] | None:
        if spec is None:
            return None
        dim = spec.get("dim")
        if isinstance(dim, int) and dim != features.shape[-1]:
            raise ValueError(f"feature_spec says dim={dim} but X has {features.shape[-1]} features")
        if features.ndim == 2:
            return None
        layers = spec.get("layers", "all")
        if layers == "all":
            return list(range(features.shape[1]))
        if not isinstance(layers, list) or len(layers) != features.shape[1]:
            raise ValueError(
                f"feature_spec lists layers {layers!r} but X has {features.shape[1]} layers along axis 1"
            )
        return [int(i) for i in layers]

    def _fit(self, z_tr: FloatArray, y_tr: FloatArray, solver: str) -> list[tuple[FloatArray, float]]:
        """``(w, b)`` per alpha (one pair for sgd) fitted by the probe trainer (LinearProbe's for sgd)."""
        sgd = LinearProbe(standardize=False, random_state=self.random_state)
        return fit_weights(solver, z_tr, y_tr, [float(a) for a in self.alphas], sgd)

    def _split(
        self, X: FloatArray, train: np.ndarray, test: np.ndarray, std: bool
    ) -> tuple[FloatArray, FloatArray, FloatArray | None, FloatArray | None]:
        if not std:
            return X[train], X[test], None, None
        mean, scale = zscore(X[train])
        return (X[train] - mean) / scale, (X[test] - mean) / scale, mean, scale

    def _screen(
        self,
        features: np.ndarray,
        mu: FloatArray,
        layers: tuple[int, ...] | None,
        std: bool,
        rows: list[dict[str, Any]],
    ) -> None:
        """Stage 1: ridge's exact leave-one-out scores of one layer set, every alpha (one fit)."""
        pooled = pool_layers(features, layers)
        if std:
            mean, scale = zscore(pooled)
            pooled = (pooled - mean) / scale
        for alpha, loo in zip(self.alphas, ridge_loo(pooled, mu, self.alphas), strict=True):
            _add_row(rows, (layers, "ridge", float(alpha), std), loo, mu, 1)

    def _score_group(
        self,
        features: np.ndarray,
        mu: FloatArray,
        folds: list[tuple[np.ndarray, np.ndarray]],
        layers: tuple[int, ...] | None,
        solver: str,
        std: bool,
        rows: list[dict[str, Any]],
        links: dict[Config, tuple[float, float]],
    ) -> None:
        pooled = pool_layers(features, layers)
        alphas: list[float | None] = [None] if solver == "sgd" else [float(a) for a in self.alphas]
        oof = np.zeros((len(alphas), len(mu)))
        for train, test in folds:
            z_tr, z_te, _, _ = self._split(pooled, train, test, std)
            for i, (w, b) in enumerate(self._fit(z_tr, mu[train], solver)):
                oof[i, test] = z_te @ w + b
        for i, alpha in enumerate(alphas):
            config: Config = (layers, solver, alpha, std)
            links[config] = _add_row(rows, config, oof[i], mu, 2)

    def _final_probe(
        self,
        features: np.ndarray,
        mu: FloatArray,
        folds: list[tuple[np.ndarray, np.ndarray]],
        config: Config,
        link: tuple[float, float],
        spec: dict[str, Any] | None,
        source: str | None,
        target: object,
        chosen: Mapping[str, Any],
    ) -> LinearProbe:
        layers, solver, alpha, std = config
        pooled = pool_layers(features, layers)
        alpha_index = 0 if alpha is None else [float(a) for a in self.alphas].index(alpha)
        a, c = link
        everything = np.arange(len(mu))
        parts = folds if self.ensemble else [(everything, everything)]
        mean, scale = zscore(pooled) if std else (None, None)
        # Each part's probe as raw-feature weights; their mean (in logit space) is the probe.
        raw_w, raw_b = np.zeros(pooled.shape[1]), 0.0
        for train, _ in parts:
            z_tr, _, m, s = self._split(pooled, train, train[:1], std)
            w, b = self._fit(z_tr, mu[train], solver)[alpha_index]
            w, b0 = a * w, a * float(b) + c
            if m is not None and s is not None:  # fold this part's z-scoring into its weights
                w, b0 = w / s, b0 - float(np.sum(w * m / s))
            raw_w += w
            raw_b += b0
        raw_w /= len(parts)
        raw_b /= len(parts)
        probe = LinearProbe(standardize=std, random_state=self.random_state)
        if mean is not None and scale is not None:
            raw_w, raw_b = raw_w * scale, raw_b + float(np.sum(raw_w * mean))
        probe._set_state(
            weight=raw_w.astype(np.float32),
            bias=float(raw_b),
            mean=mean,
            scale=scale,
            lr=_CONVEX_LR,
            lr_sweep={},
            best_epoch=0,
            n_epochs=0,
            feature_spec=self._chosen_spec(spec),
            target=target,
            training={
                "n": len(mu),
                "mean_mu_hat": float(mu.mean()),
                "source": source,
                "trainer": {
                    "name": "ProbeSearch",
                    **{k: chosen[k] for k in ("layers", "solver", "alpha", "standardize")},
                    "hidden_states": self.layers_,
                    "link": [a, c],
                    "ensemble": self.ensemble,
                    "inner_cv": {k: getattr(self, k) for k in ("n_splits", "scoring", "random_state")},
                },
            },
            validation={"n": len(mu), "brier": float(chosen["brier"]), "bce": float(chosen["bce"])},
        )
        return probe

    def _chosen_spec(self, spec: dict[str, Any] | None) -> dict[str, Any] | None:
        if spec is None or self.layers_ is None:
            return spec
        everything = self.n_layers_in_ is not None and len(self.layers_) == self.n_layers_in_
        layers: Any = "all" if everything and spec.get("layers", "all") == "all" else list(self.layers_)
        return _common.spec_as_dict({**spec, "layers": layers})

    def _pooled(self, X: npt.ArrayLike) -> FloatArray:
        _common.check_fitted(self, "best_estimator_")
        features = _common.as_matrix(X, layered=True)
        expected = (
            (self.n_features_in_,) if self.n_layers_in_ is None else (self.n_layers_in_, self.n_features_in_)
        )
        if features.shape[1:] != expected:
            raise ValueError(
                f"X has rows of shape {features.shape[1:]} but the probe search was fitted on {expected}"
            )
        layers = self.best_params_["layers"]
        return pool_layers(features, None if layers is None else tuple(layers))

    def predict(self, X: npt.ArrayLike) -> FloatArray:
        """Predicted capability in [0, 1], one per row of ``X`` (same layout as in :meth:`fit`).

        Raises:
            NotFittedError: Not fitted or loaded yet.
            ValueError: ``X`` is non-finite or its rows have another shape than in ``fit``.
        """
        pooled = self._pooled(X)
        assert self.best_estimator_ is not None
        return self.best_estimator_.predict(pooled)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Save the chosen probe (loadable by :meth:`LinearProbe.load`) and ``search.json`` beside it."""
        _common.check_fitted(self, "best_estimator_")
        assert self.best_estimator_ is not None
        folder = self.best_estimator_.save(path)
        _common.write_json(
            folder / SEARCH_FILE,
            {
                "format": SEARCH_FORMAT,
                "settings": _common.json_settings(self.get_params(deep=False)),
                "best_params": self.best_params_,
                "best_score": self.best_score_,
                "cv_results": self.cv_results_,
                "layers": self.layers_,
                "n_layers_in": self.n_layers_in_,
                "n_features_in": self.n_features_in_,
            },
        )
        return folder

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ProbeSearch:
        """Load a search saved by :meth:`save`.

        Raises:
            DataError: Missing or corrupt files.
        """
        folder = Path(path)
        meta_path = folder / SEARCH_FILE
        meta = read_saved(_SavedSearch, _common.read_json(meta_path, kind=SEARCH_FORMAT), meta_path)
        try:
            search = cls(**meta.settings)
        except TypeError as exc:
            raise DataError(f"unknown settings: {exc}", path=meta_path, field="settings") from None
        search.best_estimator_ = LinearProbe.load(folder)
        search.best_params_, search.best_score_ = dict(meta.best_params), meta.best_score
        search.cv_results_, search.layers_ = dict(meta.cv_results), meta.layers
        search.n_layers_in_, search.n_features_in_ = meta.n_layers_in, meta.n_features_in
        return search


def _add_row(
    rows: list[dict[str, Any]], config: Config, score: FloatArray, mu: FloatArray, stage: int
) -> tuple[float, float]:
    """Append the ``cv_results_`` row of ``config``'s out-of-sample scores; returns their link ``(a, c)``."""
    layers, solver, alpha, std = config
    a, c = fit_link(score, mu)
    recipe = {
        "layers": None if layers is None else list(layers),
        "solver": solver,
        "alpha": alpha,
        "standardize": std,
    }
    rows.append({**recipe, **_common.brier_and_bce(_common.sigmoid(a * score + c), mu), "stage": stage})
    return a, c


class _SavedSearch(BaseModel):
    """The search's own file beside its best probe (:meth:`ProbeSearch.save`)."""

    model_config = ConfigDict(strict=True)

    settings: dict[str, Any]
    best_params: dict[str, Any]
    best_score: float = Field(allow_inf_nan=False)
    cv_results: dict[str, Any]
    layers: list[int] | None = None
    n_layers_in: int | None = None
    n_features_in: int
