"""Calibration reports: one row of metrics per confidence source, as a table or JSON."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike

from capgate._util.jsonl import json_ready
from capgate._util.validate import as_correct_and_k, as_probabilities, same_length
from capgate.metrics import (
    auroc,
    capability_brier,
    expected_calibration_error,
    pass_at_k_mse,
    spearman,
)

__all__ = ["DEFAULT_PASS_KS", "CalibrationRow", "calibration_row", "format_table"]

DEFAULT_PASS_KS: tuple[int, ...] = (1, 4, 16, 64)


@dataclass(frozen=True)
class CalibrationRow:
    """Calibration of one confidence source on one labelled set.

    ``pass_at_k_mse[k]`` is NaN when some query has fewer than k samples (the unbiased
    estimator is then undefined).
    """

    source: str
    n: int
    accuracy: float
    capability_brier: float
    ece: float
    auroc: float
    spearman: float
    pass_at_k_mse: dict[int, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready dict (NaN becomes None)."""
        ready: dict[str, object] = json_ready(self)
        return ready


def calibration_row(
    source: str,
    p: ArrayLike,
    correct: ArrayLike,
    k: ArrayLike | int,
    *,
    pass_ks: Sequence[int] = DEFAULT_PASS_KS,
    n_bins: int = 10,
) -> CalibrationRow:
    """Every headline metric of one confidence source.

    Examples:
        >>> row = calibration_row("oracle", [0.5, 1.0], [2, 4], 4, pass_ks=(1,))
        >>> (row.capability_brier, row.pass_at_k_mse[1])
        (0.0, 0.0)
    """
    pa = as_probabilities("p", p)
    c, ks = as_correct_and_k(correct, k, len(pa))
    same_length(p=pa, correct=c)
    mu = c / ks
    mses = {kk: float("nan") for kk in pass_ks}
    usable = [kk for kk in pass_ks if kk <= int(ks.min())]
    if usable:
        mses.update(pass_at_k_mse(pa, ks, c, usable))
    return CalibrationRow(
        source=source,
        n=len(pa),
        accuracy=float(np.mean(mu)),
        capability_brier=capability_brier(pa, mu),
        ece=expected_calibration_error(pa, mu, n_bins=n_bins),
        auroc=auroc(pa, c, k=ks),
        spearman=spearman(pa, mu),
        pass_at_k_mse=mses,
    )


def _cell(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.4f}"


def format_table(rows: Sequence[CalibrationRow], *, title: str | None = None) -> object:
    """A rich ``Table`` of rows (imported lazily: only the CLI needs rich)."""
    from rich.table import Table

    pass_ks = list(rows[0].pass_at_k_mse) if rows else []
    table = Table(title=title)
    table.add_column("confidence", style="bold")
    for name in ("n", "accuracy", "cap. Brier", "ECE", "AUROC", "Spearman"):
        table.add_column(name, justify="right")
    for kk in pass_ks:
        table.add_column(f"pass@{kk} MSE", justify="right")
    for row in rows:
        values = [row.accuracy, row.capability_brier, row.ece, row.auroc, row.spearman]
        values += [row.pass_at_k_mse[kk] for kk in pass_ks]
        table.add_row(row.source, str(row.n), *map(_cell, values))
    return table
