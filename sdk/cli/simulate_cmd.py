"""``capgate simulate``: replay a policy on labelled data, or on the logged decisions that have an
outcome (``--db``, either store), over a sweep of answer thresholds."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

import typer

from capgate.cli._common import JsonFlag, fail_lines
from capgate.errors import CapgateError, DataError

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


def _logged(db: str, method: str | None) -> tuple[Any, Any, Any, int]:
    """p (NaN when unavailable), outcome µ and degraded flags of the logged decisions that have
    an outcome (µ: the mean over its sources, :attr:`LoggedDecision.value`, as ``capgate report``
    scores it), and how many lacked one."""
    import numpy as np

    from capgate.cli.log_cmd import open_existing_log

    with open_existing_log(db) as log:
        rows = log.decisions(method=method, with_outcome=True)
        unscored = log.count(method=method, with_outcome=False)
    scored: list[tuple[float, float, bool]] = []
    for row in rows:
        if row.value is not None:
            flagged = row.decision.degraded or row.decision.estimate.degraded  # as the report's
            scored.append((np.nan if row.p is None else row.p, row.value, flagged))
    if not scored:
        raise DataError("no logged decision has an outcome to replay on", path=db)
    p = np.array([row[0] for row in scored], dtype=float)
    mu = np.array([row[1] for row in scored], dtype=float)
    degraded = np.array([row[2] for row in scored], dtype=bool)
    return p, mu, degraded, unscored + len(rows) - len(scored)


def simulate_cmd(
    policy: Annotated[str, typer.Option("--policy", help="Policy file or preset name.")],
    data: Annotated[
        Path | None, typer.Option("--data", help="Labelled queries (JSONL, one LabelledQuery a line).")
    ] = None,
    confidence: Annotated[
        str | None, typer.Option("--confidence", help="Field holding the confidence p (with --data).")
    ] = None,
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            help="Replay on the decision log's decisions with outcomes instead (a SQLite file or a "
            "postgresql:// URL): p as logged, the outcome as µ.",
        ),
    ] = None,
    method: Annotated[
        str | None, typer.Option("--method", help="With --db: only decisions of this estimator method.")
    ] = None,
    thresholds: Annotated[
        str | None, typer.Option("--thresholds", help="Comma-separated answer thresholds to sweep.")
    ] = None,
    grid: Annotated[
        int, typer.Option("--grid", help="Sweep this many evenly spaced thresholds in [0, 1].")
    ] = 11,
    step: Annotated[str | None, typer.Option("--step", help="Replay as queries of this agent step.")] = None,
    tool: Annotated[str | None, typer.Option("--tool", help="Replay as calls gated for this tool.")] = None,
    no_sweep: Annotated[bool, typer.Option("--no-sweep", help="Replay only the policy as written.")] = False,
    as_json: JsonFlag = False,
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
    from capgate.decision.analysis.simulate import ACTIONS, replay_policy, threshold_frontier
    from capgate.labels.labelled import read_labelled
    from capgate.policies import load_policy

    unscored = 0
    try:
        if (data is None) == (db is None):
            raise DataError("give either --data FILE --confidence FIELD, or --db LOG", field="--data")
        chosen = load_policy(policy)
        shared: dict[str, Any] = {"step": step, "tool": tool, "orders": orders, "seed": seed}
        if data is not None:
            if confidence is None:
                raise DataError("--data needs --confidence FIELD", field="--confidence")
            labels = read_labelled(data, confidence=[confidence], allow_missing=True)
            conf, mu = labels.confidences[confidence], labels.mu_hat
            pools = [record.samples or None for record in labels.records]
            shared |= {"n_samples": labels.k, "pools": pools}
        else:
            assert db is not None
            conf, mu, degraded, unscored = _logged(db, method)
            pools = [None] * len(conf)
            shared["degraded"] = degraded
        as_written = replay_policy(chosen, conf, mu, **shared)
        rows = [as_written]
        if not no_sweep:
            sweep: list[float] | int = _parse_thresholds(thresholds) if thresholds is not None else grid
            rows += threshold_frontier(chosen, conf, mu, thresholds=sweep, **shared)
    except (CapgateError, ValueError) as exc:  # a bad policy or file, or a log locked or down
        fail_lines(exc)

    if as_json:
        payload = {
            "policy": chosen.name,
            "data": str(data) if data is not None else db,
            "confidence": confidence if data is not None else "logged p",
            "unscored": unscored,
            "n": as_written.n,
            "n_degraded": as_written.n_degraded,
            "queries_with_pools": sum(pool is not None for pool in pools),
            "as_written": as_written.to_dict(),
            "sweep": [r.to_dict() for r in rows[1:]],
        }
        typer.echo(json.dumps(payload, indent=2))
        return
    source = data if data is not None else f"the logged decisions with an outcome in {db}"
    typer.echo(
        f"policy '{chosen.name}' on {source} ({as_written.n} queries, {as_written.n_degraded} with a "
        "degraded estimate); accuracy among answered queries"
    )
    if unscored:
        typer.echo(f"({unscored} logged decisions have no outcome yet and are left out)")
    actions = [a for a in ACTIONS if a != "route"]
    routes = any(row.rates["route"] > 0 for row in rows)  # a column only for policies that route
    header = ("threshold", "coverage", "accuracy", *actions, *(["route"] if routes else []), "samples/q")
    typer.echo("  ".join(f"{h:>9}" for h in header))
    for row in rows:
        cells = [
            "as-is" if row.threshold is None else f"{row.threshold:.3f}",
            _cell(row.coverage, ".3f"),
            _cell(row.accuracy, ".4f"),
            *(_cell(row.rates[a], ".3f") for a in actions),
            *([_cell(row.rates["route"], ".3f")] if routes else []),
            _cell(row.samples_per_query, ".2f"),
        ]
        typer.echo("  ".join(f"{c:>9}" for c in cells))
    if any(row.rates["resample"] > 0 for row in rows):
        _resample_notes(data if data is not None else str(db), pools, orders, as_written)


def _resample_notes(data: Path | str, pools: list[Any], orders: int, as_written: Any) -> None:
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
