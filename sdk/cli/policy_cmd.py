"""``capgate policy``: print the policy JSON Schema, validate policy files, calibrate thresholds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, cast, get_args

import typer

from capgate._util.validate import check_int_at_least, check_positive_int, check_unit_interval
from capgate.cli._common import (
    EXIT_BAD_INPUT,
    JsonFlag,
    check_option,
    command_group,
    fail,
    fail_lines,
    output_file,
    write_text,
)
from capgate.errors import DataError

__all__ = ["policy_app", "register"]

policy_app = command_group(
    "policy", "Policy files: print the JSON Schema, validate files, calibrate a risk-controlled threshold."
)


def register(app: typer.Typer) -> None:
    """Add the ``policy`` sub-app to the ``capgate`` command line."""
    app.add_typer(policy_app, name="policy")


@policy_app.command("schema")
def schema_cmd(
    out: Annotated[
        Path | None,
        typer.Option("--out", callback=output_file, help="Write the schema here instead of stdout."),
    ] = None,
) -> None:
    """Print the JSON Schema of policy files."""
    from capgate.policies import policy_json_schema

    text = json.dumps(policy_json_schema(), indent=2, ensure_ascii=False) + "\n"
    if out is None:
        typer.echo(text, nl=False)
    else:
        write_text(out, text, "the schema")
        typer.echo(f"wrote {out}")


@policy_app.command("validate")
def validate_cmd(
    files: Annotated[list[str], typer.Argument(help="Policy files (or preset names) to check.")],
) -> None:
    """Validate policy files; every problem is reported with its line and field (exit code 2)."""
    from capgate.policies import PolicyError, load_policy

    failed = False
    for name in files:
        try:
            policy = load_policy(name)
        except (PolicyError, DataError) as exc:
            failed = True
            for line in str(exc).splitlines():
                typer.echo(f"error: {line}", err=True)
            continue
        overrides = f"{len(policy.steps)} step and {len(policy.tools)} tool override(s)"
        typer.echo(f"ok: {name}: policy '{policy.name}', {len(policy.bands)} bands, {overrides}")
    if failed:
        raise typer.Exit(EXIT_BAD_INPUT)


def _choice(option: str, value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise DataError(f"must be one of {', '.join(choices)}; got {value!r}", field=option)
    return value


@policy_app.command("calibrate")
def calibrate_cmd(
    data: Annotated[Path, typer.Option("--data", help="Labelled queries (JSONL, one LabelledQuery a line).")],
    confidence: Annotated[str, typer.Option("--confidence", help="Field holding the confidence p.")],
    risk: Annotated[
        float, typer.Option("--risk", help="alpha: the error rate allowed among answered queries.")
    ],
    out: Annotated[Path, typer.Option("--out", help="Where to write the calibrated policy (YAML).")],
    delta: Annotated[
        float, typer.Option("--delta", help="Allowed probability that the risk exceeds alpha.")
    ] = 0.05,
    policy: Annotated[
        str | None,
        typer.Option("--policy", help="Policy (file or preset) whose answer threshold to set."),
    ] = None,
    below: Annotated[
        str | None,
        typer.Option(
            "--below",
            help="Without --policy: the action below the threshold (abstain|escalate; default abstain).",
        ),
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", help="Name of the new policy (without --policy).")
    ] = None,
    step: Annotated[str | None, typer.Option("--step", help="Calibrate this step's override.")] = None,
    tool: Annotated[str | None, typer.Option("--tool", help="Calibrate this tool's override.")] = None,
    pvalue: Annotated[
        str, typer.Option("--pvalue", help="p-value of each test: binomial | hoeffding-bentkus.")
    ] = "binomial",
    loss: Annotated[
        str,
        typer.Option(
            "--loss",
            help="auto | sampled (one graded response per query) | expected (1 - µ̂; Hoeffding–Bentkus only).",
        ),
    ] = "auto",
    procedure: Annotated[
        str, typer.Option("--procedure", help="fallback (robust) | fixed-sequence (classic LTT).")
    ] = "fallback",
    start: Annotated[
        float | None, typer.Option("--start", help="fixed-sequence only: the threshold to start testing at.")
    ] = None,
    grid: Annotated[int, typer.Option("--grid", help="Thresholds tested, evenly spaced in [0, 1].")] = 1001,
    min_answered: Annotated[
        int | None,
        typer.Option("--min-answered", help="Start the test sequence where this many are answered."),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the one-response draw (loss=sampled).")] = 0,
    as_json: JsonFlag = False,
) -> None:
    """Set the answer threshold so that the error rate among answered queries is <= RISK w.p. >= 1-DELTA.

    Learn-then-Test: the thresholds are tested from high to low (fixed-sequence testing, by default
    with fallback) with a binomial (or Hoeffding–Bentkus) p-value. The certified threshold becomes
    the answer band's lower edge in the policy written to --out.
    """
    from capgate.decision.analysis.risk import Loss, Procedure, PValue, calibrate_threshold
    from capgate.labels.labelled import read_labelled
    from capgate.learn.thresholds import base_policy, no_threshold_message, policy_header, risk_summary
    from capgate.policies import PolicyError

    given = [option for option, value in (("--name", name), ("--below", below)) if value is not None]
    if policy is not None and given:
        verb = "is" if len(given) == 1 else "are"
        fail(
            f"{' and '.join(given)} {verb} for a new policy (without --policy); the --policy policy "
            "keeps its own name and bands"
        )
    check_option(check_unit_interval, "--risk", risk, open_ends=True)
    check_option(check_unit_interval, "--delta", delta, open_ends=True)
    check_option(check_int_at_least, "--grid", grid, 2)
    if min_answered is not None:
        check_option(check_positive_int, "--min-answered", min_answered)
    if start is not None:
        check_option(check_unit_interval, "--start", start)
    try:
        _choice("--below", below or "abstain", ("abstain", "escalate"))
        _choice("--pvalue", pvalue, get_args(PValue))
        _choice("--loss", loss, get_args(Loss))
        _choice("--procedure", procedure, get_args(Procedure))
        base = base_policy(policy, name=name or f"calibrated-{data.stem}", below=below or "abstain")
        base.with_answer_threshold(0.5, step=step, tool=tool)  # fail early if the top band does not answer
        labels = read_labelled(data, confidence=[confidence], allow_missing=True)
        conf = labels.confidences[confidence]
        result = calibrate_threshold(
            conf,
            labels.mu_hat,
            alpha=risk,
            delta=delta,
            pvalue=cast(PValue, pvalue),
            loss=cast(Loss, loss),
            procedure=cast(Procedure, procedure),
            start="auto" if start is None else start,
            grid=grid,
            min_answered=min_answered,
            seed=seed,
        )
    except (PolicyError, DataError, ValueError) as exc:
        fail_lines(exc)

    summary: dict[str, object] = {**risk_summary(result), "out": None}
    if result.threshold is None:
        msg = no_threshold_message(
            result,
            advice="use more calibration data, a larger --risk, or a different --min-answered. "
            "No policy written.",
        )
        if as_json:
            typer.echo(json.dumps(summary, indent=2))
        typer.echo(f"error: {msg}", err=True)
        raise typer.Exit(1)

    calibrated, notes = base.with_answer_threshold(result.threshold, step=step, tool=tool)
    header = policy_header(
        command="capgate policy calibrate",
        data=f"{data} (confidence field {confidence!r}; {result.n} queries with a confidence)",
        result=result,
        threshold=result.threshold,
        based_on=policy if policy is not None else "a new two-band policy",
        notes=notes,
    )
    try:
        out.write_text(calibrated.to_yaml(header=header), encoding="utf-8")
    except OSError as exc:
        fail_lines(DataError(f"cannot write the policy: {exc}", path=out))
    summary["out"] = str(out)
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
        return
    typer.echo(
        f"threshold {result.threshold:g}: answer when p >= {result.threshold:g} "
        f"(risk <= {risk:g} with probability >= {1 - delta:g})"
    )
    typer.echo(
        f"calibration data: {result.n} queries, {result.n_answered} answered "
        f"(coverage {result.coverage:.3f}), empirical risk {result.risk:.4f}, "
        f"mean µ̂ of answered {result.mean_mu:.4f}"
    )
    for note in notes:
        typer.echo(f"note: {note}")
    typer.echo(f"wrote {out}")
