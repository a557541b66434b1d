"""``capgate monitor``: live calibration of logged decisions, with drift flags."""

from __future__ import annotations

import contextlib
import json
import time
from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from capgate._util.validate import check_positive_number
from capgate.cli._common import DbOption, JsonFlag, check_option, run_reporting_errors
from capgate.cli.log_cmd import open_existing_log
from capgate.decision.analysis.monitor import MethodReport, calibration_report

__all__ = ["monitor", "register"]

EXIT_DRIFT = 1


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def _table(reports: list[MethodReport], window: int, db: str) -> Table:
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    table = Table(title=f"capability calibration, window {window} ({db}, {stamp})")
    columns = ("method", "decisions", "unavailable", "scored", "window n", "Brier", "ECE", "mean p")
    for column in (*columns, "mean outcome", "ref Brier", "ΔBrier", "ΔECE", "z", "drift"):
        table.add_column(column)
    for r in reports:
        w, ref = r.window, r.reference
        table.add_row(
            r.label,
            str(r.n_decisions),
            str(r.n_unavailable),
            str(r.n_scored),
            "0" if w is None else str(w.n),
            _fmt(None if w is None else w.brier, ".4f"),
            _fmt(None if w is None else w.ece, ".4f"),
            _fmt(None if w is None else w.mean_p),
            _fmt(None if w is None else w.mean_outcome),
            _fmt(None if ref is None else ref.brier, ".4f"),
            _fmt(r.brier_delta, "+.4f"),
            _fmt(r.ece_delta, "+.4f"),
            _fmt(None if w is None else w.z, "+.2f"),
            "DRIFT" if r.drift else "ok",
        )
    return table


def monitor(
    db: DbOption = None,
    window: Annotated[int, typer.Option("--window", min=1, help="Decisions with outcomes per window.")] = 200,
    method: Annotated[str | None, typer.Option("--method", help="Only this estimator method.")] = None,
    calibration: Annotated[
        str | None,
        typer.Option(
            "--calibration",
            help="Only decisions made under this calibration version ('none': only uncalibrated ones).",
        ),
    ] = None,
    min_count: Annotated[
        int,
        typer.Option("--min-count", min=1, help="Fewest decisions in a window before drift can be flagged."),
    ] = 30,
    brier_tolerance: Annotated[
        float,
        typer.Option("--brier-tolerance", min=0.0, help="Flag a Brier rise over the reference above this."),
    ] = 0.05,
    z_threshold: Annotated[
        float, typer.Option("--z-threshold", help="Flag |calibration-in-the-large z| above this.")
    ] = 3.0,
    as_json: JsonFlag = False,
    follow: Annotated[bool, typer.Option("--follow", help="Refresh every --interval seconds.")] = False,
    interval: Annotated[float, typer.Option("--interval", min=0.0, help="Seconds between refreshes.")] = 5.0,
    max_refreshes: Annotated[
        int | None,
        typer.Option("--max-refreshes", min=1, help="With --follow: stop after this many reports."),
    ] = None,
    fail_on_drift: Annotated[
        bool, typer.Option("--fail-on-drift", help="Exit with status 1 when the last report flags drift.")
    ] = False,
) -> None:
    """Report live capability calibration (Brier, ECE) per estimator from logged outcomes, and flag drift.

    Drift: the window's Brier exceeds the previous window's by more than --brier-tolerance, or
    the calibration-in-the-large z = Σ(µ − p)/√Σp(1 − p) exceeds --z-threshold in size. Each
    method, target and calibration version is reported apart; a flagged one names the `capgate
    calibrate` command that recalibrates it on the recent outcomes.
    """
    check_option(check_positive_number, "--z-threshold", z_threshold)
    version = "" if calibration is not None and calibration.lower() == "none" else calibration
    console = Console(width=200)
    refreshes = 0
    reports: list[MethodReport] = []
    with open_existing_log(db) as log, contextlib.suppress(KeyboardInterrupt):
        while True:
            reports = run_reporting_errors(
                lambda: calibration_report(
                    log,
                    window=window,
                    method=method,
                    calibration=version,
                    min_count=min_count,
                    brier_tolerance=brier_tolerance,
                    z_threshold=z_threshold,
                )
            )
            if as_json:
                typer.echo(json.dumps([r.model_dump(mode="json") for r in reports], ensure_ascii=False))
            elif not reports:
                console.print(f"no decisions logged in {log.location} yet")
            else:
                console.print(_table(reports, window, log.location))
                for r in reports:
                    for reason in r.reasons:
                        console.print(f"DRIFT {r.label}: {reason}", highlight=False)
                    if r.advice:
                        console.print(f"  {r.advice}", highlight=False, soft_wrap=True)
            refreshes += 1
            if not follow or (max_refreshes is not None and refreshes >= max_refreshes):
                break
            time.sleep(interval)
    if fail_on_drift and any(r.drift for r in reports):
        for r in reports:
            if r.drift:
                typer.echo(f"drift flagged for {r.label}: {r.advice}", err=True)
        raise typer.Exit(EXIT_DRIFT)


def register(app: typer.Typer) -> None:
    """Add ``capgate monitor`` to the CLI."""
    app.command("monitor")(monitor)
