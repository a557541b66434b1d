"""Checks and file helpers shared by the fitted estimators (probe, baselines, calibrators)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from capgate._util.atomic import atomic_write_json
from capgate._util.validate import FloatArray
from capgate.errors import DataError, NotFittedError


def check_fitted(estimator: object, *attributes: str) -> None:
    """Raise :class:`NotFittedError` unless every attribute is set on ``estimator``."""
    for attribute in attributes:
        if getattr(estimator, attribute, None) is None:
            raise NotFittedError(estimator)


def as_matrix(X: object, *, name: str = "X", layered: bool = False) -> FloatArray:
    """``X`` as a finite float64 2-D array (one row per query); with ``layered``, per-layer features
    ``(n_queries, n_layers, n_features)`` too, and float32 stays float32 (half the memory)."""
    try:
        array = np.asarray(X)
        if not (layered and array.dtype.kind == "f"):
            array = array.astype(np.float64, copy=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"`{name}` must be an array of numbers; got {type(X).__name__}: {exc}") from None
    if array.ndim not in ((2, 3) if layered else (2,)) or array.shape[0] == 0:
        what = "an array of shape" if layered else "a 2-D array"
        shapes = "(n_queries, n_features)" + (" or (n_queries, n_layers, n_features)" if layered else "")
        raise ValueError(f"`{name}` must be {what} {shapes} with at least one row; got shape {array.shape}")
    finite = np.isfinite(array.reshape(array.shape[0], -1)).all(axis=1)
    if not finite.all():
        raise ValueError(f"`{name}` has non-finite values in rows {np.flatnonzero(~finite)[:10].tolist()}")
    return array


def as_vector(values: object, *, name: str, n: int | None = None, unit: bool = False) -> FloatArray:
    """``values`` as a finite 1-D float64 array, of length ``n`` and inside [0, 1] if asked."""
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"`{name}` must be a 1-D array of numbers; got {type(values).__name__}: {exc}"
        ) from None
    if array.ndim != 1:
        raise ValueError(f"`{name}` must be 1-D; got shape {array.shape}")
    if n is not None and array.shape[0] != n:
        raise ValueError(f"`{name}` must have {n} entries (one per query); got {array.shape[0]}")
    if array.shape[0] == 0:
        raise ValueError(f"`{name}` must not be empty")
    bad = ~np.isfinite(array)
    if unit:
        bad |= (array < 0.0) | (array > 1.0)
    if np.any(bad):
        i = int(np.flatnonzero(bad)[0])
        expected = "a finite number in [0, 1]" if unit else "a finite number"
        raise ValueError(f"`{name}`[{i}] must be {expected}; got {float(array[i])!r}")
    return array


def check_weights(sample_weight: object | None, n: int) -> FloatArray:
    """Non-negative sample weights with a positive sum (all ones when ``None``)."""
    if sample_weight is None:
        return np.ones(n, dtype=np.float64)
    weights = as_vector(sample_weight, name="sample_weight", n=n)
    if np.any(weights < 0) or not weights.sum() > 0:
        raise ValueError("`sample_weight` must be non-negative with a positive sum")
    return weights


def n_rows(X: object, *, name: str = "X") -> int:
    """Number of queries in ``X``: a sequence of queries or an array with one row per query."""
    if isinstance(X, np.ndarray):
        if X.ndim == 0:
            raise ValueError(f"`{name}` must hold one entry per query; got a 0-d array")
        return int(X.shape[0])
    if isinstance(X, str | bytes) or not isinstance(X, Sequence):
        raise ValueError(f"`{name}` must be a sequence of queries or an array; got {type(X).__name__}")
    return len(X)


def spec_as_dict(spec: object) -> dict[str, Any]:
    """A feature spec as a JSON-able dict: a pydantic model (``model_dump``) or a mapping."""
    dump = getattr(spec, "model_dump", None)
    if callable(dump):
        data = dump(mode="json")
    elif isinstance(spec, Mapping):
        data = dict(spec)
    else:
        raise TypeError(f"a feature spec must be a pydantic model or a mapping; got {type(spec).__name__}")
    if not isinstance(data, dict):
        raise TypeError(f"a feature spec must dump to a dict; got {type(data).__name__}")
    # Normalize through JSON so a spec compares equal before and after a save/load round trip.
    normalized: dict[str, Any] = json.loads(json.dumps(data, sort_keys=True, allow_nan=False))
    return normalized


def json_settings(params: Mapping[str, Any]) -> dict[str, Any]:
    """Settings as JSON values: numpy numbers as Python ones, arrays and tuples as lists."""

    def plain(value: Any) -> Any:
        if isinstance(value, np.generic):
            return value.item()
        if isinstance(value, np.ndarray | list | tuple):
            return [plain(v) for v in value]
        return value

    return {name: plain(value) for name, value in params.items()}


def write_json(path: Path, payload: Mapping[str, Any]) -> None:
    """Write ``payload`` as JSON atomically (a killed save never leaves a half-written file)."""
    atomic_write_json(path, payload, allow_nan=False)


def read_json(path: Path, *, kind: str | None, what: str | None = None) -> dict[str, Any]:
    """Read a JSON object saved by :func:`write_json`; check its ``format`` is ``kind`` (``None``:
    any JSON object). ``what`` names the file in messages (default: ``kind``)."""
    what = what or kind or "JSON object"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"no saved {what} here (file not found)", path=path) from None
    except OSError as exc:
        raise DataError(f"unreadable {what}: {exc}", path=path) from None
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"not valid JSON: {exc.msg}", path=path, line=exc.lineno) from None
    if not isinstance(payload, dict):
        raise DataError(f"expected a JSON object; got {type(payload).__name__}", path=path)
    found = payload.get("format")
    if kind is not None and found != kind:
        raise DataError(f"expected a saved {kind!r}; got format {found!r}", path=path, field="format")
    return payload


def sigmoid(z: FloatArray) -> FloatArray:
    """Numerically stable logistic function."""
    out = np.empty_like(z)
    positive = z >= 0
    out[positive] = 1.0 / (1.0 + np.exp(-z[positive]))
    ez = np.exp(z[~positive])
    out[~positive] = ez / (1.0 + ez)
    return out


def fit_logistic_link(
    z: FloatArray, y: FloatArray, w: FloatArray, *, l2: float = 0.0, max_iter: int = 100, tol: float = 1e-10
) -> tuple[FloatArray, int, bool]:
    """``(theta = [a, b], n_iter, converged)``: ``(a, b)`` minimizing the weighted soft-target
    cross-entropy of ``sigmoid(a z + b)`` against ``y`` plus ``(l2/2) a²``, by damped Newton from
    ``(1, 0)`` (Platt scaling on a score ``z``)."""
    design = np.stack([z, np.ones_like(z)], axis=1)
    penalty = np.array([l2, 0.0])

    def loss(theta: FloatArray) -> float:
        t = design @ theta
        # Soft-target cross-entropy, stable form: log(1 + e^t) - y t.
        return float(np.sum(w * (np.logaddexp(0.0, t) - y * t)) + 0.5 * l2 * theta[0] ** 2)

    theta = np.array([1.0, 0.0])
    current = loss(theta)
    total = float(w.sum())
    converged, n_iter = False, 0
    while n_iter < max_iter:
        p = sigmoid(design @ theta)
        grad = design.T @ (w * (p - y)) + penalty * theta
        if np.max(np.abs(grad)) / total < tol:
            converged = True
            break
        hess = (design * (w * p * (1 - p))[:, None]).T @ design + np.diag(penalty)
        step = np.linalg.lstsq(hess + 1e-12 * total * np.eye(2), grad, rcond=None)[0]
        decrement = float(grad @ step)  # twice the loss decrease Newton predicts
        scale = 1.0
        while scale > 1e-10:
            candidate = theta - scale * step
            value = loss(candidate)
            if value <= current:
                break
            scale /= 2
        else:
            converged = True  # no step lowers the loss: optimal to machine precision
            break
        theta, current = candidate, value
        n_iter += 1
        if decrement / 2 <= 1e-12 * max(abs(current), 1e-12):
            converged = True  # that step was below the loss's precision (Newton: quadratic)
            break
    return theta, n_iter, converged


def brier_and_bce(p: FloatArray, y: FloatArray) -> dict[str, float]:
    """The Brier score and the cross-entropy of predictions ``p`` against soft targets ``y``."""
    q = np.clip(p, 1e-12, 1 - 1e-12)
    bce = -np.mean(y * np.log(q) + (1 - y) * np.log1p(-q))
    return {"brier": float(np.mean((p - y) ** 2)), "bce": float(bce)}
