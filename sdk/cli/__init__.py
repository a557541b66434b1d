"""The ``capgate`` command line.

Each command lives in its own module exposing ``register(app)``; this module only assembles them.
"""

from __future__ import annotations

from types import ModuleType

import typer

from capgate.cli._common import command_group

app = command_group("capgate", "Predict an LLM's capability on queries, report calibration, and act on it.")


def _print_version(value: bool) -> None:
    if value:
        from capgate import __version__

        typer.echo(f"capgate {__version__}")
        raise typer.Exit()


@app.callback()
def _top_level(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print capgate's version and exit."
    ),
) -> None:
    """Predict an LLM's capability on queries, report calibration, and act on it."""


def _register_commands() -> None:
    from capgate.cli import (
        budget_cmd,
        calibrate_cmd,
        demo_cmd,
        eval_cmd,
        harvest_cmd,
        log_cmd,
        model_cmd,
        monitor_cmd,
        policy_cmd,
        probe_cmd,
        report_cmd,
        simulate_cmd,
        train_cmd,
    )

    modules: tuple[ModuleType, ...] = (
        demo_cmd,
        eval_cmd,
        budget_cmd,
        calibrate_cmd,
        harvest_cmd,
        model_cmd,
        log_cmd,
        monitor_cmd,
        policy_cmd,
        probe_cmd,
        report_cmd,
        simulate_cmd,
        train_cmd,
    )
    for module in modules:
        module.register(app)


_register_commands()


def main() -> None:
    """Entry point of the ``capgate`` console script."""
    app()
