"""The gate report (:mod:`capgate.decision.analysis.report`) as text and as plots."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from capgate.decision.analysis._report_stats import Rate
from capgate.decision.analysis.simulate import ACTIONS

# The report's classes are read here, not imported (capgate.decision.analysis.report imports this module).
GateReport = Any
GroupReport = Any


def _rate(rate: Rate | None, what: str = "") -> str:
    if rate is None:
        return "-"
    return f"{rate}{f'  ({what})' if what else ''}"


def _mass(value: float) -> str:
    return f"{value:g}" if value == int(value) else f"{value:.1f}"


def _group_lines(g: GroupReport, candidate: str | None) -> list[str]:
    shadow = g.mode != "enforce"  # shadow, or a candidate calibration's shadow: would-be actions
    lines = [
        f"== {g.label} ==",
        f"  {g.decisions} decisions, {g.with_outcome} with an outcome, {g.without_outcome} without, "
        f"{g.degraded} degraded",
        f"  {f'would-be actions ({g.mode})' if shadow else 'actions'}: "
        + ", ".join(f"{a} {g.actions[a]}" for a in ACTIONS if g.actions[a]),
    ]
    through = g.actions["answer"] + g.actions["resample"]
    lines.append(f"  coverage                 {_rate(g.coverage, f'{through} of {g.decisions} let through')}")
    if g.enough_outcomes:
        gated = "had we enforced" if shadow else "what the gate let through"
        lines += [
            f"  accuracy, ungated agent  {_rate(g.accuracy_all, f'all {g.with_outcome} with an outcome')}",
            f"  accuracy, gated          {_rate(g.accuracy_gated, gated)}",
            f"  wrong answers stopped    {_mass(g.wrong_stopped or 0.0)}: share of the wrong "
            f"{_rate(g.wrong_stopped_share)}",
            f"  right answers stopped    {_mass(g.right_stopped or 0.0)}: share of the right "
            f"{_rate(g.right_stopped_share)}",
        ]
    if g.escalations:
        lines.append(
            f"  escalations              {g.escalations} ({g.escalation_outcomes} with an outcome; "
            f"their accuracy {_rate(g.escalation_accuracy)})"
        )
    if g.routed:
        lines.append(f"  routed                   {g.routed} (another model answered: not in the accuracies)")
    lines.append(f"  samples spent            {g.samples}")
    if g.latency_p50_s is not None and g.latency_p95_s is not None:
        added = "the gate would add (shadow: it ran beside the call)" if shadow else "the gate added"
        lines.append(
            f"  latency {added}: p50 {g.latency_p50_s * 1000:.1f} ms, p95 {g.latency_p95_s * 1000:.1f} ms "
            f"({g.latency_n} recorded)"
        )
    else:
        lines.append("  latency                  not recorded")
    c = g.calibration
    if c is not None:
        lines.append(
            f"  calibration (n={c.n})   Brier {c.brier}, ECE {c.ece}, AUROC {_rate(c.auroc)} (bootstrap)"
        )
    r = g.candidate
    if r is not None:
        rates = ", ".join(f"{a} {r.rates[a]:.3f}" for a in ACTIONS if r.rates[a])
        accuracy = "-" if np.isnan(r.accuracy) else f"{r.accuracy:.3f}"
        lines.append(
            f"  candidate '{candidate}' replayed on {r.n}: coverage {r.coverage:.3f}, accuracy {accuracy}, "
            f"samples/query {r.samples_per_query:.2f}; {rates}"
        )
    lines += [f"  note: {note}" for note in g.notes]
    return lines


def _comparison_lines(c: Any) -> list[str]:
    lines = [
        f"== candidate calibration {c.label} (same decisions) ==",
        f"  {c.pairs} decisions made under both, {c.with_outcome} with an outcome",
    ]
    if c.enough_outcomes:
        better = ""
        d = c.brier_difference
        if d is not None and d.high < 0:
            better = ": the candidate is better"
        elif d is not None and d.low > 0:
            better = ": the candidate is worse"
        auroc = " vs ".join("-" if a is None else f"{a:.3f}" for a in (c.auroc_candidate, c.auroc_enforced))
        lines += [
            f"  Brier, candidate vs enforced   {_rate(c.brier_candidate)} vs {_rate(c.brier_enforced)}",
            f"  Brier difference (cand - enf)  {_rate(d)}{better}",
            f"  AUROC, candidate vs enforced   {auroc}",
            f"  coverage, candidate vs enf.    {_rate(c.coverage_candidate)} vs {_rate(c.coverage_enforced)}",
            f"  accuracy of the let-through    {_rate(c.accuracy_candidate)} vs {_rate(c.accuracy_enforced)}",
            f"  same action                    {_rate(c.agreement)}",
        ]
    lines += [f"  note: {note}" for note in c.notes]
    return lines


def format_report(report: GateReport) -> str:
    """The report as text: a header, then each group's figures (rates with 95% intervals)."""
    window = f"{report.since.isoformat() if report.since else 'the first decision'} to "
    window += report.until.isoformat() if report.until else "now"
    source = f"outcomes from source '{report.source}'" if report.source else "outcomes from every source"
    lines = [
        f"capgate report of {report.location}",
        f"window: {window}; {source}; rates with 95% intervals; at least {report.min_outcomes} "
        "outcomes per rate",
    ]
    if not report.groups:
        lines.append("no decisions in this window")
        return "\n".join(lines)
    lines.append(f"{report.decisions} decisions in {len(report.groups)} group(s)")
    for group in report.groups:
        lines += ["", *_group_lines(group, report.candidate_policy)]
    for comparison in report.comparisons:
        lines += ["", *_comparison_lines(comparison)]
    return "\n".join(lines)


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", label.replace(" / ", "__")).strip("_") or "group"


def plot_report(report: GateReport, folder: Path) -> list[Path]:
    """Each group's reliability diagram and risk-coverage curve, as PNGs in ``folder``."""
    from capgate.metrics import reliability_diagram
    from capgate.metrics.plots import plot_reliability

    written: list[Path] = []
    for group in report.groups:
        if group.calibration is None:
            continue
        usable = ~np.isnan(group.p)
        p, y = group.p[usable], group.y[usable]
        name = _slug(group.label)
        written.append(
            plot_reliability(reliability_diagram(p, y), folder / f"{name}.reliability.png", title=group.label)
        )
        written.append(_plot_risk_coverage(p, y, folder / f"{name}.risk_coverage.png", group.label))
    return written


def _plot_risk_coverage(p: np.ndarray, y: np.ndarray, path: Path, title: str) -> Path:
    from capgate.metrics.plots import agg_pyplot, save_figure

    plt = agg_pyplot()
    order = np.argsort(-p, kind="stable")
    ends = np.r_[np.flatnonzero(np.diff(p[order]) != 0), p.size - 1]  # one point per threshold
    kept = ends + 1
    risk = 1.0 - np.cumsum(y[order])[ends] / kept
    figure, axes = plt.subplots(figsize=(5, 4))
    axes.plot(kept / p.size, risk, color="black", marker=".", label="answer when p >= threshold")
    axes.axhline(1.0 - float(np.mean(y)), linestyle="--", color="grey", label="ungated risk")
    axes.set_xlabel("coverage")
    axes.set_ylabel("risk (1 - accuracy of the answered)")
    axes.set_xlim(0, 1)
    axes.set_ylim(0, max(0.05, float(np.max(risk)) * 1.1))
    axes.set_title(title, fontsize=9)
    axes.legend(loc="upper left", fontsize=8)
    return save_figure(plt, figure, path)
