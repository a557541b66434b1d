"""``capgate simulate``: replay a policy on labelled data over a sweep of answer thresholds."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

import typer

from capgate.cli._common import EXIT_BAD_INPUT
from capgate.errors import DataError

__all__ = ["register", "simulate_cmd"]


def register(app: typer.Typer) -> None:
    """Add ``simulate`` to the ``capgate`` command line."""
    app.command("simulate")(simulate_cmd)


def _parse_thresholds(text: str) -> list[float]:
    values: list[float] = []
    for part in text.split(","):
        try:
            value = float(part)
        except ValueError:
            raise DataError(f"not a number: {part.strip()!r}", field="--thresholds") from None
        if not 0.0 <= value <= 1.0:
            raise DataError(f"thresholds must be in [0, 1]; got {value:g}", field="--thresholds")
        values.append(value)
    return values


def _cell(value: float | None, spec: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def simulate_cmd(
    policy: Annotated[str, typer.Option("--policy", help="Policy file or preset name.")],
    data: Annotated[Path, typer.Option("--data", help="Labelled queries (JSONL, one LabelledQuery a line).")],
    confidence: Annotated[str, typer.Option("--confidence", help="Field holding the confidence p.")],
    thresholds: Annotated[
        str | None, typer.Option("--thresholds", help="Comma-separated answer thresholds to sweep.")
    ] = None,
    grid: Annotated[
        int, typer.Option("--grid", help="Sweep this many evenly spaced thresholds in [0, 1].")
    ] = 11,
    step: Annotated[str | None, typer.Option("--step", help="Replay as queries of this agent step.")] = None,
    tool: Annotated[str | None, typer.Option("--tool", help="Replay as calls gated for this tool.")] = None,
    no_sweep: Annotated[bool, typer.Option("--no-sweep", help="Replay only the policy as written.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    orders: Annotated[
        int, typer.Option("--orders", min=1, help="Random orders each query's sample pool is replayed in.")
    ] = 20,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the replay orders.")] = 0,
) -> None:
    """Replay a policy on labelled data: coverage, accuracy among answered, action rates, samples.

    The first row is the policy as written; the others move its answer band's lower edge to each
    threshold of the sweep (the coverage/accuracy frontier). A ``resample`` replays its vote on the
    query's graded samples when the file has them (the winner's correctness, the samples spent, the
    rule that stopped); the output says when a file has none and µ̂ is used instead.
    """
    from capgate.decision.simulate import replay_policy, threshold_frontier
    from capgate.labels import read_labelled
    from capgate.policies import PolicyError, load_policy

    try:
        chosen = load_policy(policy)
        labels = read_labelled(data, confidence=[confidence], allow_missing=True)
        conf = labels.confidences[confidence]
        pools = [record.samples or None for record in labels.records]
        shared = {
            "n_samples": labels.k,
            "step": step,
            "tool": tool,
            "pools": pools,
            "orders": orders,
            "seed": seed,
        }
        as_written = replay_policy(chosen, conf, labels.mu_hat, **shared)  # type: ignore[arg-type]
        rows = [as_written]
        if not no_sweep:
            sweep: list[float] | int = _parse_thresholds(thresholds) if thresholds is not None else grid
            rows += threshold_frontier(chosen, conf, labels.mu_hat, thresholds=sweep, **shared)  # type: ignore[arg-type]
    except (PolicyError, DataError, ValueError) as exc:
        for line in str(exc).splitlines():
            typer.echo(f"error: {line}", err=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None

    if as_json:
        payload = {
            "policy": chosen.name,
            "data": str(data),
            "confidence": confidence,
            "n": as_written.n,
            "n_degraded": as_written.n_degraded,
            "queries_with_pools": sum(pool is not None for pool in pools),
            "as_written": as_written.to_dict(),
            "sweep": [r.to_dict() for r in rows[1:]],
        }
        typer.echo(json.dumps(payload, indent=2))
        return
    typer.echo(
        f"policy '{chosen.name}' on {data} ({as_written.n} queries, {as_written.n_degraded} with a degraded "
        f"estimate); accuracy among answered queries"
    )
    header: tuple[str, ...] = (
        "threshold",
        "coverage",
        "accuracy",
        "answer",
        "abstain",
        "clarify",
        "escalate",
        "resample",
        "samples/q",
    )
    routes = any(row.rates["route"] > 0 for row in rows)  # a column only for policies that route
    if routes:
        header = (*header[:-1], "route", header[-1])
    typer.echo("  ".join(f"{h:>9}" for h in header))
    for row in rows:
        cells = [
            "as-is" if row.threshold is None else f"{row.threshold:.3f}",
            _cell(row.coverage, ".3f"),
            _cell(row.accuracy, ".4f"),
            *(_cell(row.rates[a], ".3f") for a in ("answer", "abstain", "clarify", "escalate", "resample")),
            *([_cell(row.rates["route"], ".3f")] if routes else []),
            _cell(row.samples_per_query, ".2f"),
        ]
        typer.echo("  ".join(f"{c:>9}" for c in cells))
    if any(row.rates["resample"] > 0 for row in rows):
        _resample_notes(data, pools, orders, as_written)


def _resample_notes(data: Path, pools: list[Any], orders: int, as_written: Any) -> None:
    """Say how resamples were scored: replayed on pools, or credited with µ̂."""
    with_pools = sum(pool is not None for pool in pools)
    if not with_pools:
        typer.echo(f"resample: {data} has no per-sample pools; a resample is credited with µ̂ (one response)")
        return
    note = f"resample: votes replayed on the sample pools of {with_pools} queries, {orders} orders each"
    if with_pools < len(pools):
        note += f"; {len(pools) - with_pools} queries have no pool and are credited with µ̂"
    typer.echo(note)
    if as_written.stopped_by:
        shares = ", ".join(f"{name} {share:.0%}" for name, share in as_written.stopped_by.items())
        typer.echo(f"resample stopped by (policy as written): {shares}")
