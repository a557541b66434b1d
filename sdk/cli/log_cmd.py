"""``capgate log``: read the decision log and attach outcomes to logged decisions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from capgate._util.jsonl import data_error_from_validation
from capgate._util.validate import check_int_at_least, check_non_negative_number, check_unit_interval
from capgate.cli._common import DbOption, JsonFlag, check_option, command_group, fail, run_reporting_errors
from capgate.core.types import Outcome
from capgate.decision.store.log import DecisionLog, default_log_path, is_database_url
from capgate.errors import CapgateError

__all__ = ["log_app", "register"]


_OUTCOME_OPTIONS = {
    "correct": "--correct",
    "mu_hat": "--mu-hat",
    "k": "--k",
    "score": "--score",
    "source": "--source",
    "note": "--note",
    "samples_used": "--samples",
    "latency_s": "--latency",
}
"""The option of ``capgate log outcome`` that sets each field of an outcome."""


log_app = command_group("log", "Read the decision log and attach outcomes to logged decisions.")


_YES = {"yes", "y", "true", "1", "correct"}
_NO = {"no", "n", "false", "0", "wrong", "incorrect"}


def open_existing_log(db: str | None) -> DecisionLog:
    """The log at ``db`` (a file or a database URL; default: :func:`default_log_path`).

    A missing file is an error, not a new empty log; a database that cannot be reached or is not
    a usable log is an error too (exit status 2, the message names it).
    """
    if db is not None and is_database_url(db):
        log = DecisionLog(db)
        run_reporting_errors(log.schema_version, (CapgateError,))  # connects (and migrates) now, to fail here
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


def _import_file(path: Path, db: str | None, *, skip_bad: bool, replace: bool) -> None:
    from capgate.decision.store.outcomes import OutcomeImportError

    with open_existing_log(db) as log:
        try:
            summary = log.import_outcomes(path, skip_bad=skip_bad, replace=replace)
        except OutcomeImportError as exc:
            for error in exc.errors:
                typer.echo(f"error: {error}", err=True)
            fail(f"{path}: {len(exc.errors)} bad line(s); nothing imported (--skip-bad imports the others)")
        except CapgateError as exc:
            fail(str(exc))
    for error in summary.errors:
        typer.echo(f"skipped: {error}", err=True)
    typer.echo(
        f"imported {summary.imported} outcomes from {path} ({summary.unchanged} already recorded, "
        f"{summary.skipped} bad lines skipped)"
    )


@log_app.command("outcome")
def outcome(
    decision_id: Annotated[
        str | None, typer.Argument(help="Id of the logged decision (or give --file).")
    ] = None,
    correct: Annotated[
        str | None, typer.Option("--correct", help="Was the final answer right? yes|no")
    ] = None,
    mu_hat: Annotated[
        float | None, typer.Option("--mu-hat", help="Measured capability correct/k for the query, in [0, 1].")
    ] = None,
    k: Annotated[int | None, typer.Option("--k", help="Responses --mu-hat was measured on.")] = None,
    score: Annotated[float | None, typer.Option("--score", help="A graded score in [0, 1].")] = None,
    source: Annotated[
        str,
        typer.Option("--source", help="Who judged it: user, grader, test, tool, or a label of your own."),
    ] = "unspecified",
    note: Annotated[str | None, typer.Option("--note", help="Free text kept with the outcome.")] = None,
    samples: Annotated[int, typer.Option("--samples", help="Responses actually drawn.")] = 0,
    latency: Annotated[
        float | None, typer.Option("--latency", help="Seconds from decision to outcome.")
    ] = None,
    replace: Annotated[
        bool, typer.Option("--replace", help="Replace a different outcome already recorded from this source.")
    ] = False,
    file: Annotated[
        Path | None,
        typer.Option(
            "--file",
            help="Import outcomes in bulk from a JSONL file (one object a line: decision_id and the "
            "outcome fields correct, mu_hat, k, score, source, note, samples_used, latency_s).",
        ),
    ] = None,
    skip_bad: Annotated[
        bool, typer.Option("--skip-bad", help="With --file: import the good lines of a file with bad ones.")
    ] = False,
    db: DbOption = None,
) -> None:
    """Attach an outcome to a logged decision, or many from a JSONL file (--file).

    A decision keeps one outcome per source; the same judgement again changes nothing, a
    different one from the same source is an error unless --replace. A file with a bad line (each
    is reported as file:line) imports nothing unless --skip-bad.
    """
    if file is not None:
        given = [
            name
            for name, value in (
                ("DECISION_ID", decision_id),
                ("--correct", correct),
                ("--mu-hat", mu_hat),
                ("--k", k),
                ("--score", score),
                ("--note", note),
            )
            if value is not None
        ]
        if given:
            fail(f"--file takes the outcomes from the file; drop {', '.join(given)}")
        _import_file(file, db, skip_bad=skip_bad, replace=replace)
        return
    if skip_bad:
        fail("--skip-bad goes with --file")
    if decision_id is None:
        fail("give a DECISION_ID (or --file OUTCOMES.jsonl)")
    if correct is None and mu_hat is None and score is None:
        fail("give --correct yes|no, --mu-hat X or --score X")
    flag = None if correct is None else _parse_correct(correct)
    if mu_hat is not None:
        check_option(check_unit_interval, "--mu-hat", mu_hat)
    if score is not None:
        check_option(check_unit_interval, "--score", score)
    if k is not None:
        check_option(check_int_at_least, "--k", k, 1)
    check_option(check_int_at_least, "--samples", samples, 0)
    if latency is not None:
        check_option(check_non_negative_number, "--latency", latency)

    def record(log: DecisionLog) -> Outcome:
        try:
            return log.record_outcome(
                decision_id,
                correct=flag,
                mu_hat=mu_hat,
                k=k,
                score=score,
                source=source,
                note=note,
                samples_used=samples,
                latency_s=latency,
                replace=replace,
            )
        except ValidationError as exc:  # the outcome's own checks (mu_hat * k whole, a source's form...)
            error = data_error_from_validation(exc, path=None, line=None)
            option = _OUTCOME_OPTIONS.get(error.field or "")
            raise ValueError(f"{option}: {error.message}" if option else error.message) from None

    with open_existing_log(db) as log:
        stored = run_reporting_errors(lambda: record(log))
    said = {"correct": stored.correct, "mu_hat": stored.mu_hat, "k": stored.k, "score": stored.score}
    parts = " ".join(
        f"{name}={value:g}" if isinstance(value, float) else f"{name}={value}"
        for name, value in said.items()
        if value is not None
    )
    typer.echo(f"recorded outcome for {decision_id}: {parts} (source {stored.source})")


@log_app.command("show")
def show(
    last: Annotated[int, typer.Option("--last", "-n", min=1, help="How many recent decisions.")] = 20,
    method: Annotated[str | None, typer.Option("--method", help="Only this estimator method.")] = None,
    as_json: JsonFlag = False,
    db: DbOption = None,
) -> None:
    """Show the most recent decisions, oldest first, with their outcomes."""
    with open_existing_log(db) as log:
        rows = run_reporting_errors(lambda: log.decisions(method=method, last=last), (CapgateError,))
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
        elif o.correct is not None:
            outcome_text = "correct" if o.correct else "wrong"
        elif o.mu_hat is not None:
            outcome_text = f"mu_hat={o.mu_hat:g}"
        else:
            outcome_text = f"score={o.score:g}"
        if len(row.outcomes) > 1:
            outcome_text += f" (+{len(row.outcomes) - 1} more sources)"
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


@log_app.command("replay-spill")
def replay_spill(
    spill: Annotated[
        Path | None,
        typer.Option(
            "--spill", help="The spill file (default: the log's own, see capgate.decision.store.spill)."
        ),
    ] = None,
    db: DbOption = None,
) -> None:
    """Write the decisions a gate kept in the log's spill file (the log was down or its queue
    full) into the log; safe to rerun."""
    from capgate.decision.store.spill import SpillFile

    with open_existing_log(db) as log:
        kept = SpillFile(spill) if spill is not None else log.spill
        if kept is None:
            fail("this log has no spill file (opened with spill=None); pass --spill")
        count = run_reporting_errors(lambda: kept.replay(log), (CapgateError,))
    typer.echo(f"wrote {count} spilled decisions into {log.location} (from {kept.path})")


def register(app: typer.Typer) -> None:
    """Add ``capgate log`` to the CLI."""
    app.add_typer(log_app, name="log")
