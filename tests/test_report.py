"""``capgate report`` / :func:`gate_report` (#22 part 3): every figure checked against a small log
computed by hand, on both stores."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from _fakes import decision
from typer.testing import CliRunner

from capgate.cli import app
from capgate.decision import DecisionLog
from capgate.decision.analysis.report import gate_report, wilson
from capgate.decision.analysis.simulate import replay_policy
from capgate.policies import load_policy

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)

# The shadow group, by hand: (would-be action, p, correct). 6 answers (5 right), 3 abstains
# (1 right), 1 escalation (wrong): 10 decisions, 10 outcomes.
SHADOW = [("answer", 0.9, True)] * 5 + [("answer", 0.9, False)]
SHADOW += [("abstain", 0.1, False)] * 2 + [("abstain", 0.1, True), ("escalate", 0.3, False)]


def _fill(log: DecisionLog) -> list[str]:
    ids = []
    for i, (action, p, correct) in enumerate(SHADOW):
        at = T0 + timedelta(minutes=i)
        d = decision(p, action, method="m", policy="balanced", shadow=True, target="m1", created_at=at)
        log.record(d, latency_s=0.01 * (i + 1), samples_used=1 if action == "answer" else 0)
        log.record_outcome(d.id, correct=correct, source="grader")
        ids.append(d.id)
    # the enforce group: two abstains, one outcome: too few for any rate
    for i in range(2):
        d = decision(
            0.2, "abstain", method="m", policy="strict", step="draft", created_at=T0 + timedelta(minutes=i)
        )
        log.record(d, latency_s=0.5)
        if i == 0:
            log.record_outcome(d.id, correct=True, source="user")
    # outside the window below
    old = decision(0.5, method="m", created_at=T0 - timedelta(days=2))
    log.record(old)
    return ids


def test_the_figures_match_a_log_computed_by_hand(log_location: str | Path) -> None:
    with DecisionLog(log_location) as log:
        _fill(log)
        report = gate_report(log, since=T0 - timedelta(days=1), min_outcomes=5, policy="balanced")
    assert report.decisions == 12  # the old one is outside the window
    shadow, enforce = report.groups
    assert (shadow.policy, shadow.step, shadow.tool, shadow.target, shadow.mode) == (
        "balanced",
        None,
        None,
        "m1",
        "shadow",
    )
    assert shadow.actions == {
        "answer": 6,
        "abstain": 3,
        "clarify": 0,
        "escalate": 1,
        "resample": 0,
        "route": 0,
    }
    assert (shadow.decisions, shadow.with_outcome, shadow.without_outcome) == (10, 10, 0)
    assert shadow.coverage is not None
    assert shadow.coverage.value == pytest.approx(0.6)
    # Wilson's interval of 6/10, by hand: center (0.6 + 1.96²/20) / (1 + 1.96²/10), half-width
    # 1.96 sqrt(0.6·0.4/10 + 1.96²/400) / (1 + 1.96²/10)
    z = 1.959963984540054
    center = (0.6 + z * z / 20) / (1 + z * z / 10)
    half = z * math.sqrt(0.024 + z * z / 400) / (1 + z * z / 10)
    assert (shadow.coverage.low, shadow.coverage.high) == pytest.approx((center - half, center + half))
    assert (round(shadow.coverage.low, 3), round(shadow.coverage.high, 3)) == (0.313, 0.832)
    assert shadow.accuracy_all is not None
    assert shadow.accuracy_gated is not None
    assert shadow.accuracy_all.value == pytest.approx(6 / 10)  # 5 + 1 right of 10
    assert shadow.accuracy_gated.value == pytest.approx(5 / 6)  # had we enforced: 5 of the 6 answers
    assert shadow.accuracy_gated.n == 6
    assert (shadow.wrong_stopped, shadow.right_stopped) == (3.0, 1.0)  # 2 abstains + 1 escalation; 1 abstain
    assert shadow.wrong_stopped_share is not None
    assert shadow.right_stopped_share is not None
    assert shadow.wrong_stopped_share.value == pytest.approx(3 / 4)
    assert shadow.right_stopped_share.value == pytest.approx(1 / 6)
    assert (shadow.escalations, shadow.escalation_outcomes) == (1, 1)
    assert shadow.escalation_accuracy is not None
    assert shadow.escalation_accuracy.value == 0.0
    assert shadow.samples == 6
    assert shadow.latency_p50_s == pytest.approx(0.055)  # latencies 0.01 .. 0.10
    assert shadow.latency_p95_s == pytest.approx(0.0955)
    c = shadow.calibration
    assert c is not None
    assert c.n == 10
    # Brier: 5(0.1²) + 0.9² (answers) + 2(0.1²) + 0.9² (abstains) + 0.3² (escalation), over 10
    assert c.brier.value == pytest.approx(1.78 / 10)
    # ECE: bin 0.9: 6/10 · |0.9 - 5/6|; bin 0.1: 3/10 · |0.1 - 1/3|; bin 0.3: 1/10 · 0.3
    assert c.ece.value == pytest.approx(0.14)
    # AUROC: 6 right, 4 wrong; the 5 right at 0.9 beat 3 wrong, tie 1; the right at 0.1 ties 2
    assert c.auroc is not None
    assert c.auroc.value == pytest.approx((5 * 3.5 + 1) / 24)
    for rate in (c.brier, c.ece, c.auroc):
        assert rate.low <= rate.value <= rate.high
    replayed = replay_policy(
        load_policy("balanced"), [p for _, p, _ in SHADOW], [float(y) for _, _, y in SHADOW]
    )
    assert shadow.candidate == replayed  # the candidate is replayed by simulate's replay
    assert enforce.mode == "enforce"
    assert (enforce.policy, enforce.step, enforce.decisions, enforce.with_outcome) == (
        "strict",
        "draft",
        2,
        1,
    )
    assert enforce.coverage is None
    assert enforce.accuracy_all is None
    assert enforce.accuracy_gated is None
    assert enforce.wrong_stopped is None
    assert enforce.calibration is None
    assert enforce.candidate is None
    assert "only 1 of 2 decisions have an outcome (at least 5 needed)" in " ".join(enforce.notes)
    assert enforce.latency_p50_s == pytest.approx(0.5)


def test_outcomes_are_averaged_over_sources_or_read_from_one(log_location: str | Path) -> None:
    with DecisionLog(log_location) as log:
        ids = _fill(log)
        for decision_id in ids[:6]:  # a user disagrees with the grader on every answer
            log.record_outcome(decision_id, score=0.0, source="user")
        both = gate_report(log, since=T0, min_outcomes=5).groups[0]
        grader = gate_report(log, since=T0, min_outcomes=5, source="grader").groups[0]
        users = gate_report(log, since=T0, min_outcomes=5, source="user").groups[0]
        window = gate_report(log, since=T0 + timedelta(minutes=6), until=T0 + timedelta(minutes=9))
    assert both.accuracy_gated is not None
    assert both.accuracy_gated.value == pytest.approx(5 / 6 / 2)
    assert grader.accuracy_gated is not None
    assert grader.accuracy_gated.value == pytest.approx(5 / 6)
    assert (users.with_outcome, users.without_outcome) == (6, 4)
    assert any("4 decisions have no outcome" in note for note in users.notes)
    assert [g.decisions for g in window.groups] == [3]  # minutes 6, 7, 8


def test_wilson_interval() -> None:
    assert wilson(0, 0) is None
    r = wilson(0, 20)
    assert r is not None
    assert (r.value, r.low) == (0.0, 0.0)
    assert 0.1 < r.high < 0.2
    r = wilson(2.5, 5)  # a mean of fractional outcomes
    assert r is not None
    assert r.low < 0.5 < r.high


def test_cli_report_text_json_and_plots(tmp_path: Path) -> None:
    db = tmp_path / "d.sqlite3"
    with DecisionLog(db) as log:
        _fill(log)
    runner = CliRunner()
    since = (T0 - timedelta(days=1)).isoformat()
    result = runner.invoke(app, ["report", "--db", str(db), "--since", since, "--min-outcomes", "5"])
    assert result.exit_code == 0, result.output
    text = result.stdout
    for line in (
        "12 decisions in 2 group(s)",
        "== balanced / - / - / m1 / shadow ==",
        "would-be actions (shadow): answer 6, abstain 3, escalate 1",
        "accuracy, ungated agent  0.600 [0.313, 0.832]",
        "accuracy, gated          0.833 [",
        "(had we enforced)",
        "only 1 of 2 decisions have an outcome",
    ):
        assert line in text
    result = runner.invoke(
        app,
        [
            "report",
            "--db",
            str(db),
            "--json",
            "--min-outcomes",
            "5",
            "--policy",
            "conservative",
            "--plot",
            str(tmp_path / "p"),
        ],
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["decisions"] == 13
    assert payload["candidate_policy"] == "conservative"
    shadow = next(g for g in payload["groups"] if g["mode"] == "shadow")
    assert shadow["accuracy_gated"]["value"] == pytest.approx(5 / 6)
    assert shadow["candidate"]["n"] == 10
    pngs = sorted(p.name for p in (tmp_path / "p").iterdir())
    assert pngs == [
        "balanced__-__-__m1__shadow.reliability.png",
        "balanced__-__-__m1__shadow.risk_coverage.png",
    ]
    assert "plots:" in result.stderr


def test_cli_report_plot_without_matplotlib_or_to_a_file_is_an_error_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import capgate.metrics.plots as plots
    from capgate.errors import MissingExtraError

    db = tmp_path / "d.sqlite3"
    with DecisionLog(db) as log:
        _fill(log)
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    result = CliRunner().invoke(
        app, ["report", "--db", str(db), "--min-outcomes", "5", "--plot", str(a_file)]
    )
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ")

    def missing(extra: str, what: str) -> None:
        raise MissingExtraError(extra, ["matplotlib"], what)

    monkeypatch.setattr(plots, "require_extra", missing)
    result = CliRunner().invoke(
        app, ["report", "--db", str(db), "--min-outcomes", "5", "--plot", str(tmp_path)]
    )
    assert result.exit_code == 2, result.output
    assert "error: plotting needs matplotlib" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--since", "yesterday"], "--since must be an ISO date or time"),
        (["--since", "1h", "--until", "2h"], "must be before --until"),
        (["--min-outcomes", "0"], "`--min-outcomes` must be"),
        (["--policy", "no-such-policy"], "no-such-policy"),
    ],
)
def test_cli_report_bad_input_exits_2(tmp_path: Path, args: list[str], message: str) -> None:
    db = tmp_path / "d.sqlite3"
    with DecisionLog(db) as log:
        _fill(log)
    result = CliRunner().invoke(app, ["report", "--db", str(db), *args])
    assert result.exit_code == 2
    assert message in result.stderr


def test_an_empty_window_says_so(tmp_path: Path) -> None:
    with DecisionLog(tmp_path / "d.sqlite3") as log:
        _fill(log)
        report = gate_report(log, until=T0 - timedelta(days=10))
    assert report.groups == []
    assert "no decisions in this window" in report.format()
    with pytest.raises(ValueError, match="time zone"):
        gate_report(DecisionLog(tmp_path / "d.sqlite3"), since=datetime(2026, 1, 1))
