"""Reliability-diagram plots (needs the ``plots`` extra: matplotlib)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from capgate.metrics import ReliabilityDiagram

__all__ = ["plot_reliability"]


def plot_reliability(diagram: ReliabilityDiagram, path: str | Path, *, title: str = "") -> Path:
    """Draw a reliability diagram (mean µ̂ against mean confidence per bin) to a PNG file.

    Bars show each bin's mean µ̂ at its mean confidence; the diagonal is perfect calibration;
    a lower panel shows how many queries fall in each bin.

    Returns:
        The written path.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError("plotting needs matplotlib: pip install 'capgate[plots]'") from exc

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
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
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
