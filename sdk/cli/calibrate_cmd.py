"""``capgate calibrate``: learn a calibration from the decision log (:func:`capgate.learn.calibrate`),
then ``shadow``, ``promote`` or ``rollback`` it (each recorded in the log), or show the ``status``."""

from __future__ import annotations

import json
import shlex
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from capgate.cli._common import DbOption, JsonFlag, command_group, fail, run_reporting_errors

__all__ = ["calibrate_app", "register"]

calibrate_app = command_group(
    "calibrate",
    "Learn a calibration from the decision log's outcomes; shadow, promote or roll it back.",
    invoke_without_command=True,
)

TargetOpt = Annotated[
    str | None, typer.Option("--target", help="The target model (when the log has several).")
]


def register(app: typer.Typer) -> None:
    """Add ``calibrate`` (and ``calibrate shadow|promote|rollback|status``) to the CLI."""
    app.add_typer(calibrate_app, name="calibrate")


def _open(db: str | None) -> Any:
    """The log at ``db``; a missing file is an error, not a new empty log."""
    from capgate.cli.log_cmd import open_existing_log

    return open_existing_log(db)


def _on_command_line(ctx: typer.Context, name: str) -> bool:
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"  # not $CAPGATE_DB nor a default


def _hand_down(ctx: typer.Context, command: str) -> None:
    """Keep the options given to ``capgate calibrate`` before ``command`` for it (``ctx.obj``, which
    its context inherits); one it does not take is an error, not silently dropped."""
    group = ctx.command
    sub = group.get_command(ctx, command) if isinstance(group, TyperGroup) else None
    takes = {param.name for param in sub.params} if sub is not None else set()
    given = [p for p in group.params if _on_command_line(ctx, p.name or "")]
    refused = [p.opts[0] for p in given if p.name not in takes]
    if refused:
        fail(f"`capgate calibrate {command}` takes no {', '.join(refused)} (given before the command)")
    ctx.obj = {p.name: ctx.params[p.name or ""] for p in given}


def _option(ctx: typer.Context, name: str, value: Any) -> Any:
    """A subcommand's option ``name``: as given before the command (``capgate calibrate --db LOG
    status``) unless given after it; given both ways, the two must agree."""
    before = (ctx.obj or {}).get(name)
    if before is None:
        return value
    if _on_command_line(ctx, name) and value != before:
        fail(f"--{name} given twice, {before!r} before the command and {value!r} after it")
    return before


def _target(log: Any, target: str | None) -> str | None:
    """``target``, or without one the only target the log's calibration events name."""
    if target is not None:
        return target
    named = {e.target for e in run_reporting_errors(lambda: log.calibration_events())}
    return named.pop() if len(named) == 1 else None


def _time(option: str, text: str | None) -> datetime | None:
    """A window bound as ``capgate report`` reads one: an ISO date or time (UTC unless it says
    otherwise), or a span back from now (``24h``, ``7d``)."""
    from capgate.cli.report_cmd import parse_time

    return None if text is None else parse_time(text, option)


def _print_result(result: Any, db: str | None) -> None:
    from rich.table import Table

    from capgate.cli._common import console

    summary = result.summary
    columns = ("candidate", "n", "fitted on", "Brier [95% CI]", "vs previous (bound)", "older, cross-fitted")
    table = Table(
        *columns,
        title=f"held-out: the latest {summary['n_holdout']} of {summary['n']} outcomes "
        f"({summary['window']['first']} .. {summary['window']['last']})",
    )
    for row in result.table:
        table.add_row(
            ("* " if row.chosen else "  ") + row.candidate,
            str(row.n),
            str(row.n_fit),
            f"{row.brier:.4f} [{row.brier_low:.4f}, {row.brier_high:.4f}]",
            "-" if row.candidate == "previous" else f"{row.diff:+.4f} (< {row.diff_high:+.4f})",
            "-" if row.crossfit_brier is None else f"{row.crossfit_brier:.4f}",
        )
    console().print(table)
    for mode, actions in sorted(summary["counts"].items()):
        parts = ", ".join(
            f"{action} {c['with_outcome']}/{c['with_outcome'] + c['without']}"
            for action, c in sorted(actions.items())
        )
        typer.echo(f"{mode} decisions with outcomes, by action: {parts}")
    thresholds = summary.get("thresholds")
    if thresholds is not None and thresholds.get("threshold") is not None:
        typer.echo(
            f"threshold {thresholds['threshold']:g}: answer when p >= {thresholds['threshold']:g} "
            f"(risk <= {thresholds['alpha']:g} with probability >= {1 - thresholds['delta']:g}; "
            f"{thresholds['n']} outcomes, coverage {thresholds['coverage']:.3f})"
        )
    for note in result.notes:
        typer.echo(f"note: {note}")
    typer.echo(f"kept: {summary['chosen']} -> {result.kind} calibration {result.version}")
    typer.echo(f"wrote {result.calibration.path}")
    where = [] if db is None else ["--db", db]  # the log this calibration was learnt from
    command = shlex.join(["capgate", "calibrate", "shadow", *where, str(result.calibration.path)])
    typer.echo(f"next: {command} (then promote, once the report agrees)")


@calibrate_app.callback()
def calibrate_command(
    ctx: typer.Context,
    db: DbOption = None,
    out: Annotated[Path | None, typer.Option("--out", help="The calibration folder to write.")] = None,
    target: TargetOpt = None,
    method: Annotated[
        str | None, typer.Option("--method", help="The estimator method (when the log has several).")
    ] = None,
    risk: Annotated[
        float | None, typer.Option("--risk", help="Certify an answer threshold with this error rate.")
    ] = None,
    delta: Annotated[float, typer.Option("--delta", help="Allowed probability of exceeding --risk.")] = 0.05,
    policy: Annotated[
        str | None, typer.Option("--policy", help="Policy (file or preset) whose answer threshold to set.")
    ] = None,
    holdout: Annotated[float, typer.Option("--holdout", help="Share of the latest outcomes held out.")] = 0.3,
    min_outcomes: Annotated[int, typer.Option("--min-outcomes", help="Refuse with fewer outcomes.")] = 100,
    allow_mixed_versions: Annotated[
        bool, typer.Option("--allow-mixed-versions", help="Learn across calibration versions.")
    ] = False,
    since: Annotated[
        str | None,
        typer.Option("--since", help="Only decisions made at or after this time (ISO, or a span back: 7d)."),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option("--until", help="Only decisions made before this time (ISO, or a span back)."),
    ] = None,
    no_probe: Annotated[
        bool, typer.Option("--no-probe", help="Do not fit a probe on logged features.")
    ] = False,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the probe trainer and the LTT draw.")] = 0,
    as_json: JsonFlag = False,
) -> None:
    """Learn a calibration from the log's outcomes and write it to --out (versioned, atomic).

    Candidates (the previous estimator, isotonic and Platt maps of its estimates, a probe on
    logged reader features) are fitted on the older outcomes and compared on the latest ones;
    the previous estimator is kept unless one beats it beyond the noise. With --risk, an answer
    threshold is certified by Learn-then-Test and written as DIR/policy.yaml.
    """
    if ctx.invoked_subcommand is not None:
        _hand_down(ctx, ctx.invoked_subcommand)
        return
    if out is None:
        fail(
            "give --out DIR (the calibration folder to write), "
            "or a command: shadow, promote, rollback, status"
        )
    from capgate.learn import calibrate

    start, end = _time("--since", since), _time("--until", until)
    with _open(db) as log:
        result = run_reporting_errors(
            lambda: calibrate(
                log,
                out=out,
                target=target,
                method=method,
                risk=risk,
                delta=delta,
                policy=policy,
                holdout=holdout,
                min_outcomes=min_outcomes,
                allow_mixed_versions=allow_mixed_versions,
                since=start,
                until=end,
                probe=not no_probe,
                seed=seed,
            )
        )
    if as_json:
        typer.echo(json.dumps({"version": result.version, "kind": result.kind, **result.summary}, indent=2))
        return
    _print_result(result, None if db is None else log.location)


def _event(event: str, db: str | None, folder: Path) -> None:
    from capgate.learn import Calibration

    calibration = run_reporting_errors(lambda: Calibration.load(folder))
    with _open(db) as log:
        active = run_reporting_errors(lambda: log.active_calibration(calibration.target))
        previous = None if active is None else active.version
        if event == "promote" and previous == calibration.version:
            fail(f"{calibration.version} is already enforced for target {calibration.target!r}")
        run_reporting_errors(
            lambda: log.record_calibration_event(
                event,
                calibration.version,
                str(folder.resolve()),
                target=calibration.target,
                previous=previous if event == "promote" else None,
            )
        )
    what = "shadows the enforced version" if event == "shadow" else "is enforced"
    typer.echo(
        f"{calibration.version} ({calibration.kind}) {what} for target {calibration.target!r} "
        f"(was: {previous or 'uncalibrated'}); recorded in {log.location}"
    )


@calibrate_app.command("shadow")
def shadow_command(
    ctx: typer.Context,
    folder: Annotated[Path, typer.Argument(help="The calibration folder.")],
    db: DbOption = None,
) -> None:
    """Run a calibration as a candidate beside the enforced one (gate: shadow_calibration="candidate")."""
    _event("shadow", _option(ctx, "db", db), folder)


@calibrate_app.command("promote")
def promote_command(
    ctx: typer.Context,
    folder: Annotated[Path, typer.Argument(help="The calibration folder.")],
    db: DbOption = None,
) -> None:
    """Enforce a calibration from now on (gates with calibration="promoted")."""
    _event("promote", _option(ctx, "db", db), folder)


@calibrate_app.command("rollback")
def rollback_command(ctx: typer.Context, db: DbOption = None, target: TargetOpt = None) -> None:
    """Return enforcement to the version promoted before the one in force (or to none).

    Without --target: the only target the log's calibration events name (else gates without one).
    """
    db, target = _option(ctx, "db", db), _option(ctx, "target", target)
    with _open(db) as log:
        target = _target(log, target)
        event = run_reporting_errors(lambda: log.rollback_calibration(target))
    typer.echo(
        f"rolled back {event.previous} for target {target!r}: now {event.version or 'uncalibrated'}; "
        f"recorded in {log.location}"
    )


@calibrate_app.command("status")
def status_command(
    ctx: typer.Context,
    db: DbOption = None,
    target: TargetOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """What is enforced and what shadows for a target, and the events that got there.

    Without --target: the only target the log's calibration events name (else gates without one).
    """
    db, target = _option(ctx, "db", db), _option(ctx, "target", target)
    as_json = _option(ctx, "as_json", as_json)
    with _open(db) as log:
        target = _target(log, target)
        active = run_reporting_errors(lambda: log.active_calibration(target))
        candidate = run_reporting_errors(lambda: log.candidate_calibration(target))
        events = run_reporting_errors(lambda: log.calibration_events(target))

    def show(e: Any) -> dict[str, Any] | None:
        if e is None:
            return None
        return {
            "at": e.at.isoformat(),
            "event": e.event,
            "target": e.target,
            "version": e.version,
            "path": e.path,
            "previous": e.previous,
        }

    if as_json:
        payload = {
            "enforced": show(active),
            "candidate": show(candidate),
            "events": [show(e) for e in events],
        }
        typer.echo(json.dumps(payload, indent=2))
        return
    typer.echo(f"target {target!r}: enforced {active.version if active else 'none (uncalibrated)'}")
    typer.echo(f"candidate (shadow): {candidate.version if candidate else 'none'}")
    for e in events:
        extra = f" (was {e.previous})" if e.previous else ""
        typer.echo(f"{e.at:%Y-%m-%d %H:%M:%S} {e.event:8} {e.target!s:20} {e.version or 'none'}{extra}")
