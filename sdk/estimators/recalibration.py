"""Recalibration: map an estimator's confidences onto measured capability µ̂.

A calibrator is fitted on ``(confidence, µ̂)`` pairs from held-out labelled queries and then
applied to new confidences. :class:`IsotonicCalibrator` learns any non-decreasing map
(pool-adjacent-violators); :class:`PlattCalibrator` learns ``sigmoid(a · logit(c) + b)``.
:class:`Recalibrated` wraps any :class:`~capgate.CapabilityEstimator` with one. numpy only.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from capgate._util.saved import read_saved
from capgate._util.validate import (
    FloatArray,
    check_choice,
    check_non_negative_number,
    check_positive_int,
    check_positive_number,
)
from capgate.core.backend import Prompt
from capgate.core.types import Estimate
from capgate.errors import DataError
from capgate.estimators._common import (
    as_vector,
    check_fitted,
    check_weights,
    fit_logistic_link,
    read_json,
    sigmoid,
    write_json,
)
from capgate.estimators._recalibration_formats import SavedIsotonic, SavedPlatt, SavedRecalibrated
from capgate.estimators.base import CapabilityEstimator, Params

__all__ = ["Calibrator", "IsotonicCalibrator", "PlattCalibrator", "Recalibrated", "load_calibrator"]

_ISOTONIC_FORMAT = "capgate.isotonic_calibrator"
_PLATT_FORMAT = "capgate.platt_calibrator"
_RECALIBRATED_FORMAT = "capgate.recalibrated"


@runtime_checkable
class Calibrator(Protocol):
    """Maps confidences in [0, 1] to calibrated capabilities in [0, 1]."""

    name: str

    def fit(
        self, confidence: npt.ArrayLike, mu: npt.ArrayLike, *, sample_weight: npt.ArrayLike | None = None
    ) -> Any:
        """Learn the map from ``(confidence, µ̂)`` pairs; returns the calibrator."""
        ...

    def predict(self, confidence: npt.ArrayLike) -> FloatArray:
        """Calibrated capability for each confidence."""
        ...

    def to_json(self) -> dict[str, Any]:
        """The fitted calibrator as a JSON-able dict (with a ``format`` key)."""
        ...


def pool_adjacent_violators(y: FloatArray, w: FloatArray) -> FloatArray:
    """Weighted least-squares non-decreasing fit of the sequence ``y`` (weights ``w > 0``).

    Returns the fitted values, one per entry: the weighted means of maximal pooled blocks.

    Examples:
        >>> pool_adjacent_violators(np.array([1.0, 3.0, 2.0, 4.0]), np.ones(4)).tolist()
        [1.0, 2.5, 2.5, 4.0]
    """
    means: list[float] = []
    weights: list[float] = []
    sizes: list[int] = []
    for value, weight in zip(y.tolist(), w.tolist(), strict=True):
        means.append(value)
        weights.append(weight)
        sizes.append(1)
        while len(means) > 1 and means[-2] > means[-1]:
            total = weights[-2] + weights[-1]
            means[-2] = (weights[-2] * means[-2] + weights[-1] * means[-1]) / total
            weights[-2] = total
            sizes[-2] += sizes[-1]
            del means[-1], weights[-1], sizes[-1]
    return np.repeat(np.asarray(means, dtype=np.float64), sizes)


class IsotonicCalibrator(Params):
    """Non-decreasing recalibration by weighted isotonic regression (pool-adjacent-violators).

    Equal confidences are pooled first (their µ̂ averaged, weighted), so they map to one value.
    Between fitted confidences the map interpolates linearly; outside their range it is constant
    at the end values (``out_of_bounds="clip"``) or raises (``"raise"``).

    Args:
        out_of_bounds: What to do with confidences outside the fitted range.

    Attributes:
        X_thresholds_: Fitted confidences where the map changes slope (increasing).
        y_thresholds_: Calibrated values there (non-decreasing, in [0, 1]).
        X_min_: Smallest fitted confidence.
        X_max_: Largest fitted confidence.

    Examples:
        >>> iso = IsotonicCalibrator().fit([0.2, 0.4, 0.6, 0.8], [0.0, 0.5, 0.3, 1.0])
        >>> iso.predict([0.1, 0.5, 0.9]).tolist()
        [0.0, 0.4, 1.0]
    """

    name = "isotonic"

    X_thresholds_: FloatArray | None
    y_thresholds_: FloatArray | None

    def __init__(self, *, out_of_bounds: Literal["clip", "raise"] = "clip") -> None:
        self.out_of_bounds = out_of_bounds
        self.X_thresholds_ = None
        self.y_thresholds_ = None

    def fit(
        self, confidence: npt.ArrayLike, mu: npt.ArrayLike, *, sample_weight: npt.ArrayLike | None = None
    ) -> IsotonicCalibrator:
        """Fit on confidences and measured capabilities µ̂ (both in [0, 1]). Returns ``self``."""
        check_choice("out_of_bounds", self.out_of_bounds, ("clip", "raise"))
        x = as_vector(confidence, name="confidence", unit=True)
        y = as_vector(mu, name="mu", n=x.shape[0], unit=True)
        w = check_weights(sample_weight, x.shape[0])
        keep = w > 0
        x, y, w = x[keep], y[keep], w[keep]
        order = np.lexsort((y, x))
        x, y, w = x[order], y[order], w[order]
        # Pool ties in x: one point per distinct confidence, at its weighted mean µ̂.
        unique_x, start = np.unique(x, return_index=True)
        w_sum = np.add.reduceat(w, start)
        y_mean = np.add.reduceat(w * y, start) / w_sum
        fitted = np.clip(pool_adjacent_violators(y_mean, w_sum), 0.0, 1.0)
        # Keep only the points where the piecewise-linear map changes: the ends of each flat run.
        keep_point = np.ones(fitted.shape[0], dtype=bool)
        if fitted.shape[0] > 2:
            same_prev = fitted[1:-1] == fitted[:-2]
            same_next = fitted[1:-1] == fitted[2:]
            keep_point[1:-1] = ~(same_prev & same_next)
        self.X_thresholds_ = unique_x[keep_point]
        self.y_thresholds_ = fitted[keep_point]
        self.X_min_ = float(unique_x[0])
        self.X_max_ = float(unique_x[-1])
        return self

    def predict(self, confidence: npt.ArrayLike) -> FloatArray:
        """Calibrated capability for each confidence (in [0, 1])."""
        check_fitted(self, "X_thresholds_")
        assert self.X_thresholds_ is not None
        assert self.y_thresholds_ is not None
        x = as_vector(confidence, name="confidence", unit=True)
        if self.out_of_bounds == "raise":
            outside = (x < self.X_min_) | (x > self.X_max_)
            if np.any(outside):
                i = int(np.flatnonzero(outside)[0])
                raise ValueError(
                    f"confidence[{i}] = {float(x[i])!r} is outside the fitted range "
                    f"[{self.X_min_}, {self.X_max_}]"
                )
        out: FloatArray = np.interp(x, self.X_thresholds_, self.y_thresholds_)
        return out

    def to_json(self) -> dict[str, Any]:
        """The fitted map as a JSON-able dict (floats round-trip exactly)."""
        check_fitted(self, "X_thresholds_")
        assert self.X_thresholds_ is not None
        assert self.y_thresholds_ is not None
        return {
            "format": _ISOTONIC_FORMAT,
            "out_of_bounds": self.out_of_bounds,
            "X_thresholds": self.X_thresholds_.tolist(),
            "y_thresholds": self.y_thresholds_.tolist(),
            "X_min": self.X_min_,
            "X_max": self.X_max_,
        }

    @classmethod
    def from_json(cls, payload: dict[str, Any], *, path: Path | None = None) -> IsotonicCalibrator:
        """Rebuild a calibrator from :meth:`to_json` output."""
        where = path or Path("<json>")
        if payload.get("format") != _ISOTONIC_FORMAT:
            raise DataError(
                f"expected {_ISOTONIC_FORMAT!r}; got {payload.get('format')!r}", path=where, field="format"
            )
        saved = read_saved(SavedIsotonic, payload, where)
        xs = _unit_list(saved.X_thresholds, "X_thresholds", where)
        ys = _unit_list(saved.y_thresholds, "y_thresholds", where)
        if xs.shape != ys.shape or xs.shape[0] == 0 or np.any(np.diff(xs) <= 0) or np.any(np.diff(ys) < 0):
            raise DataError(
                "X_thresholds must increase and y_thresholds not decrease, with equal non-zero lengths",
                path=where,
                field="X_thresholds",
            )
        calibrator = cls(out_of_bounds=saved.out_of_bounds)
        calibrator.X_thresholds_, calibrator.y_thresholds_ = xs, ys
        calibrator.X_min_, calibrator.X_max_ = saved.X_min, saved.X_max
        return calibrator

    def save(self, path: str | os.PathLike[str]) -> None:
        """Save as JSON."""
        write_json(Path(path), self.to_json())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> IsotonicCalibrator:
        """Load what :meth:`save` wrote."""
        file = Path(path)
        return cls.from_json(read_json(file, kind=_ISOTONIC_FORMAT), path=file)


def _unit_list(values: list[float], key: str, path: Path) -> FloatArray:
    try:
        return as_vector(values, name=key, unit=True)
    except ValueError as exc:
        raise DataError(str(exc), path=path, field=key) from None


def _logit(c: FloatArray, eps: float) -> FloatArray:
    q = np.clip(c, eps, 1.0 - eps)
    out: FloatArray = np.log(q) - np.log1p(-q)
    return out


class PlattCalibrator(Params):
    """Platt scaling: ``p = sigmoid(a · logit(c) + b)``, fitted by Newton's method on soft targets.

    The fit minimizes the (weighted) cross-entropy between ``p`` and µ̂ plus ``l2 / 2 · a²``, from
    the identity map (a = 1, b = 0) with backtracking line search.

    Args:
        eps: Confidences are clipped to ``[eps, 1 - eps]`` before the logit.
        l2: Ridge penalty on the slope ``a`` (0 = plain maximum likelihood; raise it when the
            data are separable, where the unpenalized slope grows without bound).
        max_iter: Most Newton steps.
        tol: Stop when the largest gradient entry, per unit of total weight, is below this.

    Attributes:
        coef_: The slope ``a``.
        intercept_: The intercept ``b``.
        n_iter_: Newton steps taken.
        converged_: Whether the gradient reached ``tol``.

    Examples:
        >>> import numpy as np
        >>> c = np.linspace(0.05, 0.95, 50)
        >>> mu = 1 / (1 + np.exp(-(0.5 * np.log(c / (1 - c)) - 1.0)))
        >>> platt = PlattCalibrator().fit(c, mu)
        >>> round(platt.coef_, 6), round(platt.intercept_, 6)
        (0.5, -1.0)
    """

    name = "platt"

    coef_: float | None
    intercept_: float | None

    def __init__(
        self, *, eps: float = 1e-6, l2: float = 0.0, max_iter: int = 100, tol: float = 1e-10
    ) -> None:
        self.eps = eps
        self.l2 = l2
        self.max_iter = max_iter
        self.tol = tol
        self.coef_ = None
        self.intercept_ = None

    def _check_settings(self) -> None:
        if not (isinstance(self.eps, float) and 0.0 < self.eps < 0.5):
            raise ValueError(f"`eps` must be a float in (0, 0.5); got {self.eps!r}")
        check_non_negative_number("l2", self.l2)
        check_positive_int("max_iter", self.max_iter)
        check_positive_number("tol", self.tol)

    def fit(
        self, confidence: npt.ArrayLike, mu: npt.ArrayLike, *, sample_weight: npt.ArrayLike | None = None
    ) -> PlattCalibrator:
        """Fit ``a`` and ``b`` on confidences and measured capabilities µ̂. Returns ``self``."""
        self._check_settings()
        c = as_vector(confidence, name="confidence", unit=True)
        y = as_vector(mu, name="mu", n=c.shape[0], unit=True)
        w = check_weights(sample_weight, c.shape[0])
        z = _logit(c, self.eps)
        theta, n_iter, converged = fit_logistic_link(
            z, y, w, l2=self.l2, max_iter=self.max_iter, tol=self.tol
        )
        if not converged:
            warnings.warn(
                f"PlattCalibrator did not converge in {self.max_iter} Newton steps (separable data?); "
                "consider l2 > 0",
                RuntimeWarning,
                stacklevel=2,
            )
        self.coef_, self.intercept_ = float(theta[0]), float(theta[1])
        self.n_iter_, self.converged_ = n_iter, converged
        return self

    def predict(self, confidence: npt.ArrayLike) -> FloatArray:
        """Calibrated capability for each confidence (in [0, 1])."""
        check_fitted(self, "coef_")
        assert self.coef_ is not None
        assert self.intercept_ is not None
        c = as_vector(confidence, name="confidence", unit=True)
        return sigmoid(self.coef_ * _logit(c, self.eps) + self.intercept_)

    def to_json(self) -> dict[str, Any]:
        """The fitted map as a JSON-able dict (floats round-trip exactly)."""
        check_fitted(self, "coef_")
        return {
            "format": _PLATT_FORMAT,
            "settings": self.get_params(deep=False),
            "coef": self.coef_,
            "intercept": self.intercept_,
            "n_iter": self.n_iter_,
            "converged": self.converged_,
        }

    @classmethod
    def from_json(cls, payload: dict[str, Any], *, path: Path | None = None) -> PlattCalibrator:
        """Rebuild a calibrator from :meth:`to_json` output."""
        where = path or Path("<json>")
        if payload.get("format") != _PLATT_FORMAT:
            raise DataError(
                f"expected {_PLATT_FORMAT!r}; got {payload.get('format')!r}", path=where, field="format"
            )
        saved = read_saved(SavedPlatt, payload, where)
        try:
            calibrator = cls(**saved.settings)
            calibrator._check_settings()
        except (TypeError, ValueError) as exc:
            raise DataError(str(exc), path=where, field="settings") from None
        calibrator.coef_, calibrator.intercept_ = saved.coef, saved.intercept
        calibrator.n_iter_, calibrator.converged_ = saved.n_iter, saved.converged
        return calibrator

    def save(self, path: str | os.PathLike[str]) -> None:
        """Save as JSON."""
        write_json(Path(path), self.to_json())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> PlattCalibrator:
        """Load what :meth:`save` wrote."""
        file = Path(path)
        return cls.from_json(read_json(file, kind=_PLATT_FORMAT), path=file)


def load_calibrator(
    payload: dict[str, Any], *, path: Path | None = None
) -> IsotonicCalibrator | PlattCalibrator:
    """Rebuild whichever calibrator ``payload`` (a ``to_json`` dict) describes."""
    kind = payload.get("format")
    if kind == _ISOTONIC_FORMAT:
        return IsotonicCalibrator.from_json(payload, path=path)
    if kind == _PLATT_FORMAT:
        return PlattCalibrator.from_json(payload, path=path)
    raise DataError(f"not a saved calibrator (format {kind!r})", path=path, field="format")


class Recalibrated(CapabilityEstimator):
    """Any capability estimator followed by a calibrator (method name ``"<base>+<calibrator>"``).

    Usable, non-degraded estimates have their ``p`` mapped through the calibrator (cost and
    details kept, the raw value in ``details["raw_p"]``). Degraded estimates pass through
    untouched: still degraded, under the base method's name, no value invented.

    Args:
        estimator: The base estimator (already fitted, if it needs fitting).
        calibrator: An :class:`IsotonicCalibrator` or :class:`PlattCalibrator`, fitted or fitted
            later through :meth:`fit`.

    Examples:
        >>> from capgate.estimators.baselines import UniformRandom
        >>> qs = [f"question {i}" for i in range(200)]
        >>> raw = UniformRandom(random_state=1)
        >>> mu = raw.predict(qs) ** 2  # the base is overconfident: true capability is p²
        >>> cal = Recalibrated(raw, IsotonicCalibrator()).fit(qs, mu)
        >>> e = cal.estimate_one("question 7")
        >>> e.method, round(e.p, 6) == round(e.details["raw_p"] ** 2, 6)
        ('uniform-random+isotonic', True)
    """

    _fitted_parts = ("calibrator",)  # fit fits only the calibrator; the base is shared by clones

    def __init__(
        self, estimator: CapabilityEstimator, calibrator: IsotonicCalibrator | PlattCalibrator
    ) -> None:
        self.estimator = estimator
        self.calibrator = calibrator
        self.method = f"{estimator.method}+{calibrator.name}"

    def fit(
        self, queries: Sequence[Prompt], y: npt.ArrayLike, *, sample_weight: npt.ArrayLike | None = None
    ) -> Recalibrated:
        """Fit the calibrator on the base estimator's confidences for ``queries`` and µ̂ = ``y``.

        Queries whose base estimate is degraded are left out of the fit (they are passed through
        at prediction time too). Returns ``self``.

        Raises:
            ValueError: No query got a usable, non-degraded estimate.
        """
        queries = list(queries)
        target = as_vector(y, name="y", n=len(queries), unit=True)
        weights = check_weights(sample_weight, len(queries))
        estimates = self.estimator.estimate(queries)
        usable = np.array([e.p is not None and not e.degraded for e in estimates], dtype=bool)
        if not usable.any():
            raise ValueError(f"no usable estimate from {self.estimator.method!r} to fit the calibrator on")
        p = np.array([e.p for e in estimates if e.p is not None and not e.degraded], dtype=np.float64)
        self.calibrator.fit(p, target[usable], sample_weight=weights[usable])
        return self

    def estimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
        """The base estimates, recalibrated where usable; degraded ones untouched."""
        estimates = self.estimator.estimate(list(queries))
        index = [i for i, e in enumerate(estimates) if e.p is not None and not e.degraded]
        out = list(estimates)
        if index:
            raw = np.array([estimates[i].p for i in index], dtype=np.float64)
            calibrated = self.calibrator.predict(raw)
            for i, p in zip(index, calibrated.tolist(), strict=True):
                e = estimates[i]
                out[i] = e.model_copy(
                    update={"p": p, "method": self.method, "details": {**e.details, "raw_p": e.p}}
                )
        return out

    def predict(self, queries: Sequence[Prompt]) -> FloatArray:
        """``p`` of :meth:`estimate` per query, NaN where the base estimate has no value."""
        return np.array([np.nan if e.p is None else e.p for e in self.estimate(queries)], dtype=np.float64)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Save the calibrator (and the base method's name) as JSON; save the base separately."""
        self.save_map(path, self.calibrator, base_method=self.estimator.method)

    @staticmethod
    def save_map(path: str | os.PathLike[str], calibrator: Calibrator, *, base_method: str) -> None:
        """Save what :meth:`save` saves, for a fitted ``calibrator`` of ``base_method``'s
        confidences, without the base estimator at hand (:meth:`load` puts it on one)."""
        write_json(
            Path(path),
            {"format": _RECALIBRATED_FORMAT, "base_method": base_method, "calibrator": calibrator.to_json()},
        )

    @classmethod
    def load(cls, path: str | os.PathLike[str], estimator: CapabilityEstimator) -> Recalibrated:
        """Load a saved calibrator onto ``estimator`` (whose method must match the saved one).

        Raises:
            DataError: The file is missing or corrupt, or was fitted on another method's confidences.
        """
        file = Path(path)
        saved = read_saved(SavedRecalibrated, read_json(file, kind=_RECALIBRATED_FORMAT), file)
        base = saved.base_method
        if base != estimator.method:
            raise DataError(
                f"calibrator was fitted on {base!r} confidences; "
                f"refusing to apply it to {estimator.method!r}",
                path=file,
                field="base_method",
            )
        return cls(estimator, load_calibrator(saved.calibrator, path=file))
