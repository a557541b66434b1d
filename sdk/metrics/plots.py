"""Reliability-diagram and risk–coverage plots (needs the ``plots`` extra: matplotlib)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from capgate._util.extras import require_extra
from capgate._util.validate import as_probabilities, same_length
from capgate.metrics import ReliabilityDiagram

__all__ = ["plot_reliability", "plot_risk_coverage"]


def agg_pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend, imported when a plot is drawn.

    Raises:
        MissingExtraError: matplotlib is not installed (the ``plots`` extra).
    """
    require_extra("plots", "plotting")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(plt: Any, figure: Any, path: str | Path) -> Path:
    """Write ``figure`` to the PNG file ``path`` (its folder made if needed), close it, return the path."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.tight_layout()
        figure.savefig(path, dpi=110)
    finally:
        plt.close(figure)
    return path


def plot_reliability(diagram: ReliabilityDiagram, path: str | Path, *, title: str = "") -> Path:
    """Draw a reliability diagram (mean µ̂ against mean confidence per bin) to a PNG file.

    Bars show each bin's mean µ̂ at its mean confidence; the diagonal is perfect calibration;
    a lower panel shows how many queries fall in each bin.

    Returns:
        The written path.
    """
    plt = agg_pyplot()
    filled = diagram.counts > 0
    n_bins = len(diagram.counts)
    centers = (
        (diagram.edges[:-1] + diagram.edges[1:]) / 2.0
        if diagram.strategy == "uniform"
        else np.where(filled, diagram.mean_confidence, np.nan)
    )
    width = 1.0 / n_bins
    figure, (top, bottom) = plt.subplots(
        2, 1, figsize=(5, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    top.plot([0, 1], [0, 1], linestyle="--", color="grey", label="perfect calibration")
    top.bar(
        centers[filled],
        diagram.mean_capability[filled],
        width=width * 0.9,
        alpha=0.7,
        edgecolor="black",
        label="mean µ̂ per bin",
    )
    top.scatter(
        diagram.mean_confidence[filled], diagram.mean_capability[filled], color="black", zorder=3, s=12
    )
    top.set_ylabel("empirical capability µ̂")
    top.set_xlim(0, 1)
    top.set_ylim(0, 1)
    top.set_title(f"{title}  (ECE {diagram.ece:.4f})" if title else f"ECE {diagram.ece:.4f}")
    top.legend(loc="upper left")
    bottom.bar(centers[filled], diagram.counts[filled], width=width * 0.9, color="grey")
    bottom.set_xlabel("predicted capability p")
    bottom.set_ylabel("queries")
    return save_figure(plt, figure, path)


def plot_risk_coverage(
    p: ArrayLike,
    mu: ArrayLike,
    path: str | Path,
    *,
    threshold: float | None = None,
    target: float | None = None,
    title: str = "",
) -> Path:
    """Draw the risk–coverage curve of answering the queries with p >= t, for every t, to a PNG file.

    Queries are answered from the most to the least confident: at coverage i / N the risk is the
    mean 1 - µ̂ of the i answered (the chance a sampled answer is wrong). ``threshold`` marks the
    point a policy answers at; ``target`` draws the allowed risk.

    Returns:
        The written path.
    """
    plt = agg_pyplot()
    pa, ma = as_probabilities("p", p), as_probabilities("mu", mu)
    if same_length(p=pa, mu=ma) == 0:
        raise ValueError("`p` and `mu` must not be empty")
    order = np.argsort(-pa, kind="stable")
    answered = np.arange(1, pa.size + 1)
    coverage = answered / pa.size
    risk = np.cumsum(1.0 - ma[order]) / answered
    figure, axes = plt.subplots(figsize=(5, 4))
    axes.plot(coverage, risk, color="black", label="answer the most confident")
    axes.scatter([1.0], [risk[-1]], color="grey", zorder=3, label="answer everything")
    if target is not None:
        axes.axhline(target, linestyle="--", color="red", label=f"allowed risk {target:g}")
    if threshold is not None:
        n_answered = int((pa >= threshold).sum())
        if n_answered:
            axes.scatter(
                [coverage[n_answered - 1]], [risk[n_answered - 1]], color="red", zorder=4,
                label=f"policy: answer p >= {threshold:g}",
            )  # fmt: skip
    axes.set_xlabel("coverage (share answered)")
    axes.set_ylabel("risk (1 - mean µ̂ of answered)")
    axes.set_xlim(0, 1.02)
    axes.set_ylim(0, max(float(risk.max()) * 1.1, (target or 0.0) * 1.2, 0.05))
    axes.set_title(title or "risk–coverage")
    axes.legend(loc="upper left", fontsize=8)
    return save_figure(plt, figure, path)
