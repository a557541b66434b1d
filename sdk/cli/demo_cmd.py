"""``capgate demo``: the main job. A live gated agent on the embedded model, the embedded model
trained by C3RL stating its confidence beside the probe, then a replay of a real 20B model's
recorded answers through a calibrated policy (:mod:`capgate.demo.live`,
:mod:`capgate.demo.verbalized`, :mod:`capgate.demo.replay`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from capgate._util.jsonl import json_ready
from capgate._util.validate import check_unit_interval
from capgate.cli._common import (
    JsonFlag,
    JsonOut,
    check_option,
    console,
    fail,
    run_reporting_errors,
    show_figures,
)

if TYPE_CHECKING:
    from rich.console import Console

    from capgate.decision.analysis.report import Rate
    from capgate.demo.live import DemoReport, DemoRow
    from capgate.demo.replay import ReplayReport
    from capgate.demo.verbalized import VerbalizedReport

__all__ = ["register"]

SCHEMA = "capgate.demo.live/1"


def time_change(seconds_added: float) -> str:
    """What the gate did to the run's time, in words: ``+1.2 s added`` or ``0.6 s saved``."""
    shown = round(seconds_added, 1) + 0.0  # + 0.0: no "-0.0"
    return f"{-shown:.1f} s saved" if shown < 0 else f"{shown:+.1f} s added"


def _pct(rate: Rate | None, spec: str = ".0%") -> str:
    """``42% [19%, 68%]`` (Wilson 95%), or ``n/a``."""
    if rate is None:
        return "n/a"
    return f"{rate.value:{spec}} [{rate.low:{spec}}, {rate.high:{spec}}]"


def _shown(path: str) -> str:
    """``path`` relative to the working directory when it lies below it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return path


def _short(text: str, width: int = 50) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def row_lines(index: int, row: DemoRow) -> str:
    """One question as printed: the question, then the ungated and the gated agent side by side."""
    q = row.question
    p = "n/a" if row.p is None else f"{row.p:.2f}"
    ungated = row.ungated_answer if row.ungated_answer is not None else "(no answer found)"
    mark = "[green]right[/]" if row.ungated_correct else "[red]wrong[/]"
    if row.answered:
        gated_mark = "[green]right[/]" if row.correct else "[red]wrong[/]"
        gated = f"[cyan]{row.action}[/] -> {row.answer} ({gated_mark}, {row.samples} sample(s))"
    else:
        gated = f"[yellow]{row.action}[/]: stopped ({row.samples} sample(s))"
    return (
        f"[{index + 1:>2}] {_short(q.item.question, 70)!r}  ({q.source}, µ̂={q.mu_hat:.2f})\n"
        f"     without gate: {_short(ungated, 24)} ({mark})   with gate: p={p} {gated}"
    )


def _print_live(out: Console, report: DemoReport) -> None:
    from rich.table import Table

    c = report.comparison()
    off, on = c.without_gate, c.with_gate
    table = Table(
        title=f"LIVE: {c.questions} questions, without the gate vs with the gate (95% Wilson intervals)"
    )
    table.add_column("")
    table.add_column("without the gate", justify="right")
    table.add_column("with the gate", justify="right")
    table.add_row(
        "answered",
        f"{c.questions} of {c.questions}",
        f"{on.answered} of {c.questions}: coverage {_pct(on.coverage)}",
    )
    table.add_row("accuracy", _pct(off.accuracy), f"{_pct(on.accuracy)} among answered")
    table.add_row(
        "wrong answers",
        f"{off.wrong} given",
        f"{on.wrong} given; {on.wrong_stopped} of {off.wrong} stopped ({_pct(on.wrong_stopped_share)})",
    )
    table.add_row(
        "right answers",
        f"{off.right} given",
        f"{on.right} given; {on.right_stopped} of {off.right} stopped ({_pct(on.right_stopped_share)})",
    )
    table.add_row("samples spent", str(off.samples), str(on.samples))
    table.add_row("time", f"{off.seconds:.1f} s", f"{on.seconds:.1f} s ({time_change(on.seconds_added)})")
    out.print(table)
    s = report.summary()

    def num(key: str) -> str:
        value = s.get(key, float("nan"))
        return "n/a" if math.isnan(value) else f"{value:.3f}"

    out.print(
        f"The probe on these questions: mean p {num('mean_p')}, mean µ̂ {num('mean_mu_hat')}, "
        f"capability Brier {num('capability_brier')}, AUROC {num('auroc')}. "
        f"Run in {report.seconds:.0f} s.\n"
    )


def _print_verbalized(out: Console, report: VerbalizedReport) -> None:
    from rich.table import Table

    from capgate.train.synthetic import HELD_OUT_FAMILY

    table = Table(
        title=f"VERBALIZED: SmolLM2 taught by C3RL (the shipped adapter) states its confidence, on "
        f"{len(report.rows)} arithmetic questions it never trained on"
    )
    for name in ("question", "family", "its answer", "right", "stated", "probe (base model)"):
        table.add_column(name, justify="left" if name in ("question", "family") else "right")
    for r in report.rows:
        stated = f"{r.stated:.0%}" if r.stated is not None else f"no tag: {r.reason or '?'}"
        probe = f"{r.probe:.2f}" if r.probe is not None else "n/a"
        family = f"{r.family} (held out)" if r.family == HELD_OUT_FAMILY else r.family
        graded = "?" if r.correct is None else "yes" if r.correct else "no"
        table.add_row(r.question, family, r.answer or "-", graded, stated, probe)
    out.print(table)

    def mean(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.0%}"

    right, wrong = report.mean_stated(correct=True), report.mean_stated(correct=False)
    out.print(
        f"Tagged {report.tag_rate:.0%} of its answers; mean stated {mean(right)} on its right answers, "
        f"{mean(wrong)} on its wrong ones. What it learnt, measured on 480 answers: mostly which kinds "
        f"of question it can do (bench/RESULTS.md, C3RL). Run in {report.seconds:.0f} s.\n"
    )


def _print_replay(out: Console, r: ReplayReport) -> None:
    from rich.table import Table

    out.print(
        "[bold]REPLAY[/] (recorded data; no model runs): gpt-oss-20b on MATH-500, 100 sampled answers "
        f"per question and the paper's Probe-MATH estimates ({_shown(r.data)}).\n"
        f"Policy: `capgate policy calibrate --risk {r.risk:g}` on {r.calibration_questions} questions "
        f"(split seed {r.seed}): answer when p >= {r.threshold:g} (risk <= {r.risk:g} with probability "
        f">= {1 - r.delta:g}); scored on the other {r.scored_questions}. Accuracy = chance one sampled "
        "answer is right (mean µ̂)."
    )
    table = Table(title=f"REPLAY: {r.scored_questions} held-out MATH-500 questions, gpt-oss-20b")
    table.add_column("")
    table.add_column("without the gate", justify="right")
    table.add_column("with the gate", justify="right")
    n = r.scored_questions
    table.add_row("answered", f"{n} of {n}", f"{r.answered} of {n}: coverage {_pct(r.coverage, '.1%')}")
    table.add_row(
        "accuracy", _pct(r.accuracy_all, ".1%"), f"{_pct(r.accuracy_answered, '.1%')} among answered"
    )
    share = r.wrong_stopped / r.wrong_all if r.wrong_all else float("nan")
    table.add_row(
        "expected wrong answers",
        f"{r.wrong_all:.1f} given",
        f"{r.wrong_answered:.1f} given; {r.wrong_stopped:.1f} stopped ({share:.0%})",
    )
    table.add_row("expected right answers stopped", "0", f"{r.right_stopped:.1f}")
    out.print(table)
    for s in r.passk:
        out.print(
            f"pass@{s.k} budget: {s.k} samples on every question ({s.uniform_samples}) reach an expected "
            f"pass rate of {s.uniform_success:.1%}; spending by the probe's p (greedy allocation) reaches it "
            f"with {s.greedy_samples}: {s.saved} samples saved ({s.saved / s.uniform_samples:.0%})."
        )


def _plot(directory: Path, live: DemoReport | None, replay: ReplayReport | None) -> list[Path]:
    from capgate.metrics import reliability_diagram
    from capgate.metrics.plots import plot_reliability, plot_risk_coverage

    written = []
    if live is not None:
        scored = [r for r in live.rows if r.p is not None]
        if scored:
            p = [r.p for r in scored if r.p is not None]
            mu = [r.question.mu_hat for r in scored]
            written.append(
                plot_reliability(
                    reliability_diagram(p, mu),
                    directory / "live_reliability.png",
                    title="live: SmolLM2 probe",
                )
            )
            written.append(
                plot_risk_coverage(p, mu, directory / "live_risk_coverage.png", title="live: SmolLM2")
            )
    if replay is not None:
        written.append(
            plot_reliability(
                reliability_diagram(replay.p, replay.mu_hat), directory / "replay_reliability.png",
                title="replay: Probe-MATH, gpt-oss-20b",
            )
        )  # fmt: skip
        written.append(
            plot_risk_coverage(
                replay.p, replay.mu_hat, directory / "replay_risk_coverage.png", threshold=replay.threshold,
                target=replay.risk, title="replay: gpt-oss-20b on MATH-500",
            )
        )  # fmt: skip
    return written


def live_json(report: DemoReport) -> dict[str, Any]:
    """The live part as JSON-ready data."""
    from capgate.demo.live import DEMO_POLICY, describe_policy
    from capgate.policies import load_policy

    rows = [
        {
            "id": r.question.item.id,
            "question": r.question.item.question,
            "source": r.question.source,
            "stratum": r.question.stratum,
            "mu_hat": r.question.mu_hat,
            "k": r.question.k,
            "p": r.p,
            "action": r.action,
            "answered": r.answered,
            "answer": r.answer,
            "correct": r.correct,
            "samples": r.samples,
            "ungated_answer": r.ungated_answer,
            "ungated_correct": r.ungated_correct,
            "ungated_seconds": r.ungated_seconds,
            "gated_seconds": r.gated_seconds,
        }
        for r in report.rows
    ]
    summary = json_ready(report.summary())
    return {
        "part": "live",
        "model": "SmolLM2-135M-Instruct (embedded), shipped probe",
        "policy": report.policy,
        "bands": describe_policy(load_policy(DEMO_POLICY)),
        "header": report.header,
        "seed": report.seed,
        "seconds": report.seconds,
        "comparison": report.comparison().to_dict(),
        "calibration": summary,
        "rows": rows,
    }


def demo_command(
    questions: Annotated[
        int, typer.Option(help="Held-out questions to run (up to the whole split, 356).")
    ] = 12,
    seed: Annotated[
        int, typer.Option(help="Seed of the question draw, of sampling and of the replay's split.")
    ] = 0,
    as_json: JsonFlag = False,
    json_out: JsonOut = None,
    plot: Annotated[
        Path | None, typer.Option("--plot", help="Write reliability diagrams and risk–coverage curves here.")
    ] = None,
    live: Annotated[
        bool, typer.Option("--live/--no-live", help="Run the live part (the embedded model).")
    ] = True,
    verbalized: Annotated[
        bool,
        typer.Option(
            "--verbalized/--no-verbalized",
            help="Show the embedded model trained by C3RL stating its confidence, beside the probe.",
        ),
    ] = True,
    replay: Annotated[
        bool, typer.Option("--replay/--no-replay", help="Replay the recorded gpt-oss-20b MATH-500 answers.")
    ] = True,
    replay_data: Annotated[
        Path | None,
        typer.Option("--replay-data", help="The MATH-500 file (default: the one shipped in the package)."),
    ] = None,
    risk: Annotated[
        float, typer.Option(help="The replay policy's risk (capgate policy calibrate --risk).")
    ] = 0.1,
) -> None:
    """Show what the gate buys: a live gated agent against the same agent ungated, the embedded
    model trained by C3RL stating its confidence, then a real 20B model's recorded answers through
    a policy calibrated for a risk."""
    from capgate.demo.live import held_out_size
    from capgate.demo.replay import REPLAY_DATA, replay_math500

    if not live and not verbalized and not replay:
        fail("nothing to run: --no-live, --no-verbalized and --no-replay together")
    check_option(check_unit_interval, "--risk", risk, open_ends=True)
    if live and not 1 <= questions <= held_out_size():
        fail(f"--questions must be from 1 to {held_out_size()} (the held-out split); got {questions}")
    data = replay_data if replay_data is not None else REPLAY_DATA
    replay_note = None
    if replay and replay_data is None and not data.exists():
        replay_note = (
            f"replay skipped: {data} not found "
            "(it ships inside the package, capgate/assets; pass --replay-data)"
        )
    out = console()
    live_report = _run_live(out, questions, seed, quiet=as_json) if live else None
    verbalized_report = _run_verbalized(seed) if verbalized else None
    replay_report = None
    if replay and replay_note is None:
        replay_report = run_reporting_errors(lambda: replay_math500(data, risk=risk, seed=seed))
    written = _plot(plot, live_report, replay_report) if plot is not None else []
    document = {
        "schema": SCHEMA,
        "live": live_json(live_report) if live_report is not None else None,
        "verbalized": verbalized_report.to_dict() if verbalized_report is not None else None,
        "replay": replay_report.to_dict() if replay_report is not None else None,
        "replay_skipped": replay_note,
        "plots": [str(p) for p in written],
    }

    def show() -> None:
        if live_report is not None:
            _print_live(out, live_report)
        if verbalized_report is not None:
            _print_verbalized(out, verbalized_report)
        if replay_report is not None:
            _print_replay(out, replay_report)
        if replay_note is not None:
            out.print(replay_note)
        for path in written:
            out.print(f"wrote {path}")

    show_figures(document, show, as_json=as_json, json_out=json_out)


def _run_live(out: Console, questions: int, seed: int, *, quiet: bool) -> DemoReport:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from capgate._util.extras import require_extra

    run_reporting_errors(lambda: require_extra("local", "the demo's live part (--no-live leaves it out)"))
    from transformers.utils import logging as transformers_logging

    from capgate.demo.live import run_demo

    transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    if quiet:
        return run_demo(n_questions=questions, seed=seed)
    with Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(), console=out, transient=True,
    ) as progress:  # fmt: skip
        task = progress.add_task("loading model and probe", total=questions)

        def start(header: str) -> None:
            progress.console.print(f"[bold]capgate demo[/]\n{header}\n")

        def show(index: int, row: DemoRow) -> None:
            progress.console.print(row_lines(index, row))
            progress.update(task, advance=1, description="ungated and gated agent")

        return run_demo(n_questions=questions, seed=seed, on_row=show, on_start=start)


def _run_verbalized(seed: int) -> VerbalizedReport:
    import capgate
    from capgate._util.extras import require_extra
    from capgate.demo.verbalized import run_verbalized
    from capgate.errors import CapgateError
    from capgate.estimators import VerbalizedConfidence

    run_reporting_errors(
        lambda: require_extra("local", "the demo's verbalized part (--no-verbalized leaves it out)")
    )
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    try:
        trained = capgate.load_estimator("default-c3rl", method="verbalized")
        probe = capgate.load_estimator("default")
    except (CapgateError, ValueError) as exc:
        fail(f"the verbalized part cannot load the embedded model with the shipped C3RL adapter: {exc}")
    if not isinstance(trained, VerbalizedConfidence) or not trained.tag:
        fail(f"the embedded model with the shipped C3RL adapter does not read its own tag: {trained!r}")
    return run_verbalized(trained, probe, seed=seed)


def register(app: typer.Typer) -> None:
    """Add ``demo`` to the CLI."""
    app.command("demo")(demo_command)
