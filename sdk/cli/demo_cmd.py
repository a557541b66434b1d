"""``capgate demo``: the end-to-end main job (embedded model, shipped probe, gated agent)."""

from __future__ import annotations

import math
from typing import Annotated

import typer

from capgate.cli._common import console

__all__ = ["register"]


def demo_command(
    questions: Annotated[int, typer.Option(min=1, max=96, help="Held-out questions to run.")] = 12,
    seed: Annotated[int, typer.Option(help="Seed of the question draw and of sampling.")] = 0,
) -> None:
    """Run a small capability-gated agent on the embedded model over real held-out questions."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from capgate.demo import DemoRow, run_demo

    out = console()
    out.print(
        "[bold]capgate demo[/]: SmolLM2-135M-Instruct (embedded) + its shipped capability probe; "
        "policy: abstain p<0.10, CAS resample (<=6 samples) p<0.35, answer otherwise."
    )
    out.print(
        "Questions: held-out basic_arithmetic and TriviaQA items; µ̂ = share of 40 sampled answers correct.\n"
    )
    with Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(), console=out, transient=True,
    ) as progress:  # fmt: skip
        task = progress.add_task("loading model and probe", total=questions)

        def show(index: int, row: DemoRow) -> None:
            p = "n/a" if row.p is None else f"{row.p:.2f}"
            if row.answer is None:
                outcome = f"[yellow]{row.action}[/]: {row.message}"
            else:
                mark = "[green]correct[/]" if row.correct else "[red]wrong[/]"
                outcome = f"[cyan]{row.action}[/] -> {row.answer!r} ({mark}, {row.samples} sample(s))"
            progress.console.print(
                f"[{index + 1:>2}] {row.question.item.question[:70]!r}\n"
                f"     p={p}  µ̂={row.question.mu_hat:.2f}  {outcome}"
            )
            progress.update(task, advance=1, description="gated agent")

        report = run_demo(n_questions=questions, seed=seed, on_row=show)
    summary = report.summary()
    table = Table(title=f"capgate demo: {int(summary['questions'])} questions in {report.seconds:.0f} s")
    for name in (
        "coverage",
        "accuracy among answered",
        "samples spent",
        "mean p",
        "mean µ̂",
        "cap. Brier",
        "AUROC",
    ):
        table.add_column(name, justify="right")

    def cell(value: float, fmt: str = "{:.3f}") -> str:
        return "n/a" if value is None or math.isnan(value) else fmt.format(value)

    table.add_row(
        cell(summary["coverage"], "{:.0%}"),
        cell(summary["accuracy_answered"], "{:.0%}"),
        cell(summary["samples"], "{:.0f}"),
        cell(summary["mean_p"]),
        cell(summary["mean_mu_hat"]),
        cell(summary.get("capability_brier", float("nan"))),
        cell(summary.get("auroc", float("nan"))),
    )
    out.print(table)


def register(app: typer.Typer) -> None:
    """Add ``demo`` to the CLI."""
    app.command("demo")(demo_command)
