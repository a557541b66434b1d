"""The ``capgate`` command line.

Each command lives in its own module exposing ``register(app)``; this module only assembles them.
"""

from __future__ import annotations

import importlib

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


COMMANDS = ("demo", "eval", "budget", "calibrate", "harvest", "model", "log", "monitor", "policy", "probe",
            "report", "simulate", "train")  # fmt: skip
"""The command modules (``capgate.cli.<name>_cmd``), in the order ``capgate --help`` lists them."""

for _name in COMMANDS:
    importlib.import_module(f"capgate.cli.{_name}_cmd").register(app)


def main() -> None:
    """Entry point of the ``capgate`` console script."""
    app()
