"""Convex probe fits and the pieces of their cross-validation, for :class:`~capgate.estimators.ProbeSearch`
(numpy; logistic regression needs torch). :func:`fit_link` turns a linear score into a probability
and, composed with it, is still one linear probe.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from capgate._util.extras import import_extra
from capgate._util.validate import FloatArray
from capgate.estimators._common import fit_logistic_link


def kfold(n: int, n_splits: int, random_state: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Shuffled K-fold ``(train, test)`` index pairs (sorted), seeded by ``random_state``.

    Examples:
        >>> [test.tolist() for _, test in kfold(6, 3, 0)]
        [[2, 3], [4, 5], [0, 1]]
    """
    if n_splits < 2 or n_splits > n:
        raise ValueError(f"`n_splits` must be in [2, n_queries={n}]; got {n_splits}")
    order = np.random.default_rng(random_state).permutation(n)
    folds = [np.sort(part) for part in np.array_split(order, n_splits)]
    everything = np.arange(n)
    return [(np.setdiff1d(everything, test), test) for test in folds]


def layer_candidates(n_layers: int, *, widths: Sequence[int] = (2, 4, 8, 16)) -> list[tuple[int, ...]]:
    """Layer sets to choose from: each single layer, contiguous ranges of each width ``w`` starting
    every ``max(1, w // 2)`` layers (overlapping by half), and all layers.

    Examples:
        >>> layer_candidates(4, widths=(2,))
        [(0,), (1,), (2,), (3,), (0, 1), (1, 2), (2, 3), (0, 1, 2, 3)]
    """
    out: list[tuple[int, ...]] = [(i,) for i in range(n_layers)]
    for width in widths:
        if 1 < width < n_layers:
            step = max(1, width // 2)
            starts = list(range(0, n_layers - width + 1, step))
            if starts[-1] != n_layers - width:
                starts.append(n_layers - width)
            out.extend(tuple(range(s, s + width)) for s in starts)
    if n_layers > 1:
        out.append(tuple(range(n_layers)))
    return list(dict.fromkeys(out))  # without repeats, in order


def pool_layers(X: np.ndarray, layers: Sequence[int] | None) -> FloatArray:
    """The mean over ``layers`` of per-layer features ``(n, n_layers, dim)``; 2-D ``X`` as is."""
    if layers is None:
        return np.asarray(X, dtype=np.float64)
    picked = np.asarray(X[:, list(layers), :], dtype=np.float64)
    pooled: FloatArray = picked.mean(axis=1)
    return pooled


def zscore(X: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Column means and standard deviations, a (near-)constant column's scale replaced by 1."""
    mean = X.mean(axis=0)
    scale = X.std(axis=0)
    tiny = 10 * np.finfo(np.float64).eps * np.maximum(np.abs(mean), 1.0)
    scale[scale <= tiny] = 1.0
    return mean, scale


def ridge_path(z: FloatArray, y: FloatArray, alphas: Sequence[float]) -> tuple[FloatArray, FloatArray]:
    """Ridge fits ``min (1/2n)||y - Zw - b||² + (α/2)||w||²`` for every α, from one eigendecomposition.

    Returns:
        ``(w_all, b)``: weights of shape ``(len(alphas), dim)`` and intercepts ``(len(alphas),)``.
    """
    n = z.shape[0]
    z_mean = z.mean(axis=0)
    y_mean = float(y.mean())
    zc = z - z_mean
    yc = y - y_mean
    t = n * np.asarray(alphas, dtype=np.float64)[:, None]
    # n <= d: w = Zcᵀ (zc Zcᵀ + t)⁻¹ yc = (Qᵀ zc)ᵀ diag(1/(lam + t)) Qᵀ yc  with zc Zcᵀ = q lam Qᵀ
    # n > d:  w = (ZcᵀZc + t)⁻¹ Zcᵀ yc = v diag(1/(lam + t)) Vᵀ Zcᵀ yc    with ZcᵀZc = v lam Vᵀ
    if n <= z.shape[1]:
        lam, q = np.linalg.eigh(zc @ zc.T)
        w_all: FloatArray = ((q.T @ yc)[None, :] / (np.clip(lam, 0.0, None)[None, :] + t)) @ (q.T @ zc)
    else:
        lam, v = np.linalg.eigh(zc.T @ zc)
        w_all = ((v.T @ (zc.T @ yc))[None, :] / (np.clip(lam, 0.0, None)[None, :] + t)) @ v.T
    b: FloatArray = y_mean - w_all @ z_mean
    return w_all, b


def ridge_loo(z: FloatArray, y: FloatArray, alphas: Sequence[float]) -> FloatArray:
    """Exact leave-one-out predictions of :func:`ridge_path`, ``(len(alphas), n)``, from one fit:
    ``y_i - (y_i - ŷ_i) / (1 - H_ii)`` with the hat matrix ``H = 11ᵀ/n + zc (ZcᵀZc + nα)⁻¹ Zcᵀ``.
    (``z`` is taken as given: a z-scoring computed on all rows is not redone per left-out row.)
    """
    n = z.shape[0]
    y_mean = float(y.mean())
    zc = z - z.mean(axis=0)
    yc = y - y_mean
    if n <= z.shape[1]:
        lam, q = np.linalg.eigh(zc @ zc.T)
        lam = np.clip(lam, 0.0, None)
        r = q
        weights = lam  # H - 11ᵀ/n = q diag(lam / (lam + t)) Qᵀ
    else:
        lam, v = np.linalg.eigh(zc.T @ zc)
        lam = np.clip(lam, 0.0, None)
        r = zc @ v  # H - 11ᵀ/n = r diag(1 / (lam + t)) Rᵀ
        weights = np.ones_like(lam)
    t = n * np.asarray(alphas, dtype=np.float64)[:, None]
    gain = weights[None, :] / (lam[None, :] + t)  # (n_alpha, r)
    fitted = y_mean + (gain * (r.T @ yc)[None, :]) @ r.T  # (n_alpha, n)
    leverage = 1.0 / n + gain @ (r**2).T
    loo: FloatArray = y[None, :] - (y[None, :] - fitted) / np.maximum(1.0 - leverage, 1e-12)
    return loo


def fit_logistic(
    z: FloatArray,
    y: FloatArray,
    alpha: float,
    *,
    init: tuple[FloatArray, float] | None = None,
    max_iter: int = 500,
) -> tuple[FloatArray, float]:
    """Logistic regression on soft targets: ``min mean BCE(sigmoid(Zw + b), y) + (α/2)||w||²``, by
    deterministic L-BFGS (torch, float64, one CPU thread, strong Wolfe), from ``init = (w, b)`` or
    else ``w = 0, b = logit(mean y)`` (the constant prior).
    """
    torch = import_extra("torch", "local", "fitting a LinearProbe")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        zt = torch.from_numpy(np.ascontiguousarray(z, dtype=np.float64))
        yt = torch.from_numpy(np.ascontiguousarray(y, dtype=np.float64))
        if init is None:
            prior = min(max(float(y.mean()), 1e-6), 1 - 1e-6)
            w0, b0 = np.zeros(z.shape[1]), math.log(prior / (1 - prior))
        else:
            w0, b0 = init
        w = torch.tensor(np.asarray(w0, dtype=np.float64), requires_grad=True)
        b = torch.tensor([float(b0)], dtype=torch.float64, requires_grad=True)
        optimizer = torch.optim.LBFGS(
            [w, b],
            lr=1.0,
            max_iter=max_iter,
            tolerance_grad=1e-9,
            tolerance_change=1e-12,
            history_size=20,
            line_search_fn="strong_wolfe",
        )
        bce = torch.nn.functional.binary_cross_entropy_with_logits

        def closure() -> Any:
            optimizer.zero_grad()
            loss = bce(zt @ w + b, yt) + 0.5 * alpha * torch.dot(w, w)
            loss.backward()
            return loss

        optimizer.step(closure)
        return w.detach().numpy().copy(), float(b.detach().numpy()[0])
    finally:
        torch.set_num_threads(threads)


def fit_link(score: FloatArray, y: FloatArray, *, l2: float = 1e-6) -> tuple[float, float]:
    """``(a, c)`` minimizing mean BCE(sigmoid(a * score + c), y) (+ a tiny L2 on ``a``), by Newton:
    Platt scaling of a linear score (the fit of :class:`~capgate.estimators.PlattCalibrator`).

    Examples:
        >>> s = np.linspace(-3, 3, 200)
        >>> a, c = fit_link(s, 1 / (1 + np.exp(-(2 * s + 1))))
        >>> round(a, 3), round(c, 3)
        (2.0, 1.0)
    """
    weights = np.full(len(y), 1.0 / len(y))
    theta, _, _ = fit_logistic_link(score, y, weights, l2=l2, max_iter=100, tol=1e-10)
    return float(theta[0]), float(theta[1])
