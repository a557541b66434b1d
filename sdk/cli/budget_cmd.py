"""``capgate budget``: success rate of budget allocations on pooled samples."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from capgate.cli._common import JsonFlag, JsonOut, console, parse_int_list, run_reporting_errors, show_figures
from capgate.labels.labelled import read_labelled

__all__ = ["register"]


def budget_command(
    data: Annotated[Path, typer.Argument(help="Labelled JSONL with k samples per query pooled.")],
    confidence: Annotated[
        str, typer.Option("--confidence", "-c", help="Confidence column that drives greedy.")
    ],
    budgets: Annotated[str, typer.Option(help="Average samples per query to try, comma-separated.")] = (
        "1,2,4,8,16,32,64"
    ),
    as_json: JsonFlag = False,
    json_out: JsonOut = None,
) -> None:
    """Expected success rate per budget for greedy(confidence), greedy(oracle µ̂) and uniform.

    A budget B gives B·N samples in all. Each query's samples are drawn without replacement
    from its pool of k, so no query gets more than k, and the success rate is exact:
    1 − C(k−c, b)/C(k, b) per query given b draws.
    """
    from capgate.metrics import expected_success, greedy_allocation, uniform_allocation

    per_query = parse_int_list(budgets, option="--budgets")
    labelled = run_reporting_errors(lambda: read_labelled(data, confidence=[confidence]))
    n, k, c = len(labelled), labelled.k, labelled.correct
    p = labelled.confidences[confidence]
    results = []
    for b in per_query:
        total = b * n
        results.append(
            {
                "budget_per_query": b,
                "greedy_confidence": expected_success(greedy_allocation(p, total, max_per_query=k), k, c),
                "greedy_oracle": expected_success(
                    greedy_allocation(labelled.mu_hat, total, max_per_query=k), k, c
                ),
                "uniform": expected_success(uniform_allocation(n, total, max_per_query=k), k, c),
            }
        )

    def show_table() -> None:
        table = Table(title=f"{data.name}: expected success rate by sampling budget ({n} queries)")
        for name in ("samples/query", f"greedy({confidence})", "greedy(oracle µ̂)", "uniform"):
            table.add_column(name, justify="right")
        for r in results:
            table.add_row(
                str(r["budget_per_query"]),
                f"{r['greedy_confidence']:.4f}",
                f"{r['greedy_oracle']:.4f}",
                f"{r['uniform']:.4f}",
            )
        console().print(table)

    show_figures(
        {"data": str(data), "confidence": confidence, "n": n, "rows": results},
        show_table,
        as_json=as_json,
        json_out=json_out,
    )


def register(app: typer.Typer) -> None:
    """Add ``budget`` to the CLI."""
    app.command("budget")(budget_command)
