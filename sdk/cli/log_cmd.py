"""``capgate log``: read the decision log and attach outcomes to logged decisions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from capgate._validate import check_int_at_least, check_non_negative_number, check_unit_interval
from capgate.cli._common import check_option, fail, sub_app
from capgate.decision.log import DecisionLog, default_log_path, is_database_url
from capgate.errors import CapgateError

__all__ = ["log_app", "register"]


log_app = sub_app("log", "Read the decision log and attach outcomes to logged decisions.")

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        envvar="CAPGATE_DB",
        help="The decision log: a SQLite file or a postgresql:// URL. Default: $CAPGATE_DB, else the "
        "user data folder.",
    ),
]

_YES = {"yes", "y", "true", "1", "correct"}
_NO = {"no", "n", "false", "0", "wrong", "incorrect"}


def open_existing_log(db: str | None) -> DecisionLog:
    """The log at ``db`` (a file or a database URL; default: :func:`default_log_path`).

    A missing file is an error, not a new empty log; a database that cannot be reached or is not
    a usable log is an error too (exit status 2, the message names it).
    """
    if db is not None and is_database_url(db):
        log = DecisionLog(db)
        try:
            log.schema_version()  # connects (and migrates) now, to fail here with a clear message
        except CapgateError as exc:
            fail(str(exc))
        return log
    path = Path(db) if db is not None else default_log_path()
    if not path.is_file():
        fail(f"{path}: no decision log at this path (pass --db or set CAPGATE_DB)")
    return DecisionLog(path)


def _parse_correct(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _YES:
        return True
    if lowered in _NO:
        return False
    fail(f"--correct must be yes or no; got {text!r}")


@log_app.command("outcome")
def outcome(
    decision_id: Annotated[str, typer.Argument(help="Id of the logged decision.")],
    correct: Annotated[
        str | None, typer.Option("--correct", help="Was the final answer right? yes|no")
    ] = None,
    mu_hat: Annotated[
        float | None, typer.Option("--mu-hat", help="Measured capability correct/k for the query, in [0, 1].")
    ] = None,
    samples: Annotated[int, typer.Option("--samples", help="Responses actually drawn.")] = 0,
    latency: Annotated[
        float | None, typer.Option("--latency", help="Seconds from decision to outcome.")
    ] = None,
    db: DbOption = None,
) -> None:
    """Attach an outcome to a logged decision (recording again replaces it)."""
    if correct is None and mu_hat is None:
        fail("give --correct yes|no or --mu-hat X (or both)")
    flag = None if correct is None else _parse_correct(correct)
    if mu_hat is not None:
        check_option(check_unit_interval, "--mu-hat", mu_hat)
    check_option(check_int_at_least, "--samples", samples, 0)
    if latency is not None:
        check_option(check_non_negative_number, "--latency", latency)
    with open_existing_log(db) as log:
        try:
            stored = log.record_outcome(
                decision_id, correct=flag, mu_hat=mu_hat, samples_used=samples, latency_s=latency
            )
        except CapgateError as exc:
            fail(str(exc))
    parts = [f"correct={stored.correct}" if stored.correct is not None else "", ""]
    if stored.mu_hat is not None:
        parts[1] = f"mu_hat={stored.mu_hat:g}"
    typer.echo(f"recorded outcome for {decision_id}: {' '.join(p for p in parts if p)}")


@log_app.command("show")
def show(
    last: Annotated[int, typer.Option("--last", "-n", min=1, help="How many recent decisions.")] = 20,
    method: Annotated[str | None, typer.Option("--method", help="Only this estimator method.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines instead of a table.")] = False,
    db: DbOption = None,
) -> None:
    """Show the most recent decisions, oldest first, with their outcomes."""
    with open_existing_log(db) as log:
        try:
            rows = log.decisions(method=method, last=last)
        except CapgateError as exc:
            fail(str(exc))
    if as_json:
        for row in rows:
            typer.echo(json.dumps(row.model_dump(mode="json"), ensure_ascii=False))
        return
    table = Table(title=f"last {len(rows)} decisions")
    for column in ("id", "time (UTC)", "policy", "step/tool", "method", "p", "action", "samples", "outcome"):
        table.add_column(column)
    for row in rows:
        d = row.decision
        p_text = "unavailable" if d.estimate.p is None else f"{d.estimate.p:.3f}"
        if d.degraded or d.estimate.degraded:
            p_text += " (degraded)"
        o = row.outcome
        if o is None:
            outcome_text = "-"
        elif o.mu_hat is not None:
            outcome_text = f"mu_hat={o.mu_hat:g}"
        else:
            outcome_text = "correct" if o.correct else "wrong"
        table.add_row(
            d.id,
            d.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            d.policy or "-",
            "/".join(x for x in (d.step, d.tool) if x) or "-",
            d.estimate.method,
            p_text,
            d.action,
            "-" if row.samples_used is None else str(row.samples_used),
            outcome_text,
        )
    Console(width=200).print(table)


def register(app: typer.Typer) -> None:
    """Add ``capgate log`` to the CLI."""
    app.add_typer(log_app, name="log")
