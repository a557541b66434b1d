"""``capgate eval``: calibration of one or more confidence sources on labelled data."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

from capgate._util.validate import check_positive_int
from capgate.cli._common import (
    JsonFlag,
    JsonOut,
    check_option,
    console,
    parse_int_list,
    run_reporting_errors,
    show_figures,
)
from capgate.errors import CapgateError
from capgate.labels.labelled import read_labelled

__all__ = ["register"]

ORACLE = "oracle (µ̂)"


def eval_command(
    data: Annotated[Path, typer.Argument(help="Labelled JSONL: id, k, correct, and confidence columns.")],
    confidence: Annotated[
        list[str], typer.Option("--confidence", "-c", help="Confidence column to evaluate (repeatable).")
    ],
    oracle: Annotated[bool, typer.Option(help="Add a row that uses µ̂ itself as the confidence.")] = False,
    pass_k: Annotated[str, typer.Option(help="Comma-separated k for the pass@k MSE columns.")] = "1,4,16,64",
    bins: Annotated[int, typer.Option(help="Equal-width bins for ECE.")] = 10,
    as_json: JsonFlag = False,
    json_out: JsonOut = None,
    plot: Annotated[
        Path | None, typer.Option(help="Write one reliability-diagram PNG per source here.")
    ] = None,
) -> None:
    """Report accuracy and calibration (Brier, ECE, AUROC, Spearman, pass@k MSE) per source."""
    from capgate.metrics import reliability_diagram
    from capgate.metrics.table import calibration_row, format_table

    ks = parse_int_list(pass_k, option="--pass-k")
    check_option(check_positive_int, "--bins", bins)
    labelled = run_reporting_errors(lambda: read_labelled(data, confidence=confidence))
    sources = dict(labelled.confidences)
    if oracle:
        sources[ORACLE] = labelled.mu_hat
    rows = [
        calibration_row(name, p, labelled.correct, labelled.k, pass_ks=ks, n_bins=bins)
        for name, p in sources.items()
    ]
    show_figures(
        {"data": str(data), "n": len(labelled), "rows": [row.to_dict() for row in rows]},
        lambda: console().print(
            format_table(rows, title=f"{data.name}: {len(labelled)} queries, calibration by source")
        ),
        as_json=as_json,
        json_out=json_out,
    )
    if plot is not None:
        from capgate.metrics.plots import plot_reliability

        def draw(folder: Path) -> None:
            for name, p in sources.items():
                diagram = reliability_diagram(p, labelled.mu_hat, n_bins=bins)
                safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_")
                written = plot_reliability(diagram, folder / f"reliability_{safe}.png", title=name)
                typer.echo(f"wrote {written}", err=as_json)

        # matplotlib missing or an unusable folder: an error line, not a traceback
        run_reporting_errors(lambda: draw(plot), (CapgateError, OSError))


def register(app: typer.Typer) -> None:
    """Add ``eval`` to the CLI."""
    app.command("eval")(eval_command)
