"""The PNG plots: written where asked, and no figure left open when the file cannot be written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from capgate.metrics.calibration import reliability_diagram
from capgate.metrics.plots import agg_pyplot, plot_reliability, plot_risk_coverage

P = np.linspace(0.05, 0.95, 20)
MU = np.clip(P + np.random.default_rng(0).normal(0.0, 0.1, P.size), 0.0, 1.0)


def _draw(kind: str, path: Path) -> Path:
    if kind == "reliability":
        return plot_reliability(reliability_diagram(P, MU, n_bins=5), path, title="t")
    return plot_risk_coverage(P, MU, path, threshold=0.5, target=0.2)


@pytest.mark.parametrize("kind", ["reliability", "risk_coverage"])
def test_plot_writes_a_png_in_a_new_folder(tmp_path: Path, kind: str) -> None:
    written = _draw(kind, tmp_path / "new" / f"{kind}.png")
    assert written == tmp_path / "new" / f"{kind}.png"
    assert written.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert agg_pyplot().get_fignums() == []


@pytest.mark.parametrize("kind", ["reliability", "risk_coverage"])
def test_plot_that_cannot_be_written_leaves_no_open_figure(tmp_path: Path, kind: str) -> None:
    (tmp_path / "a_file").write_text("not a folder")
    with pytest.raises(FileExistsError):
        _draw(kind, tmp_path / "a_file" / "plot.png")
    assert agg_pyplot().get_fignums() == []
