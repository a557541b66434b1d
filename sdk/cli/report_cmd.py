"""``capgate report``: what the gate buys, from the decision log (either store), per policy /
step / tool / target / mode, for a time window (:mod:`capgate.decision.analysis.report`)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated

import typer

from capgate.cli._common import DbOption, JsonFlag, check_option, fail, run_reporting_errors
from capgate.cli.log_cmd import open_existing_log
from capgate.errors import CapgateError

__all__ = ["parse_time", "register", "report_cmd"]

_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def register(app: typer.Typer) -> None:
    """Add ``report`` to the ``capgate`` command line."""
    app.command("report")(report_cmd)


def parse_time(text: str, option: str, *, now: datetime | None = None) -> datetime:
    """A window bound: an ISO date or time (UTC unless it says otherwise), or a span back from now
    (``30m``, ``24h``, ``7d``, ``2w``).

    Examples:
        >>> parse_time("2026-12-01", "--since").isoformat()
        '2026-12-01T00:00:00+00:00'
        >>> now = datetime(2026, 12, 2, tzinfo=UTC)
        >>> parse_time("36h", "--since", now=now).isoformat()
        '2026-11-30T12:00:00+00:00'
    """
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text)
    if match:
        span = timedelta(**{_UNITS[match.group(2)]: float(match.group(1))})
        return (now or datetime.now(UTC)) - span
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        fail(f"{option} must be an ISO date or time (2026-12-01T08:00) or a span (24h, 7d); got {text!r}")
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def report_cmd(
    db: DbOption = None,
    since: Annotated[
        str | None,
        typer.Option("--since", help="Window start: an ISO date/time (UTC) or a span back (24h, 7d)."),
    ] = None,
    until: Annotated[
        str | None, typer.Option("--until", help="Window end (exclusive): an ISO date/time or a span back.")
    ] = None,
    source: Annotated[
        str | None, typer.Option("--source", help="Only outcomes from this source (default: all, averaged).")
    ] = None,
    policy: Annotated[
        str | None,
        typer.Option("--policy", help="A candidate policy file or preset, replayed on the logged estimates."),
    ] = None,
    min_outcomes: Annotated[
        int, typer.Option("--min-outcomes", help="Outcomes a group needs before any rate is given.")
    ] = 30,
    as_json: JsonFlag = False,
    plot: Annotated[
        Path | None,
        typer.Option(
            "--plot", help="Write each group's reliability diagram and risk-coverage curve here (PNG)."
        ),
    ] = None,
) -> None:
    """What the gate buys: decisions by action and, where outcomes exist, the ungated agent's
    accuracy against the accuracy of what the gate let through (for shadow decisions: had it been
    enforced), coverage, wrong and right answers stopped, escalations, samples, latency and
    calibration, each rate with its 95% interval. Decisions without outcomes are counted, never
    guessed; a group with too few outcomes says so and gives no rate."""
    from capgate._util.validate import check_int_at_least
    from capgate.decision.analysis.report import gate_report

    check_option(check_int_at_least, "--min-outcomes", min_outcomes, 1)
    start = None if since is None else parse_time(since, "--since")
    end = None if until is None else parse_time(until, "--until")
    if start is not None and end is not None and start >= end:
        fail(f"--since ({start.isoformat()}) must be before --until ({end.isoformat()})")
    with open_existing_log(db) as log:
        report = run_reporting_errors(
            lambda: gate_report(
                log, since=start, until=end, source=source, policy=policy, min_outcomes=min_outcomes
            )
        )
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2, ensure_ascii=False))
    else:
        typer.echo(report.format())
    if plot is not None:  # matplotlib missing or an unusable folder: an error line
        written = run_reporting_errors(lambda: report.plot(plot), (CapgateError, OSError))
        where = ", ".join(str(p) for p in written) if written else "none (no group has enough outcomes)"
        typer.echo(f"plots: {where}", err=as_json)
