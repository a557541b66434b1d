"""``capgate simulate`` through typer's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from capgate.cli import app
from capgate.decision.analysis.simulate import replay_policy, threshold_frontier
from capgate.labels.labelled import read_labelled
from capgate.policies import load_policy

MATH500 = Path(__file__).resolve().parents[1] / "sdk" / "assets" / "math500_gpt-oss-20b_probe-math.jsonl"
runner = CliRunner()
BASE = ["simulate", "--data", str(MATH500), "--confidence", "probe_conf_raw"]


def test_table_has_the_policy_as_written_then_the_sweep() -> None:
    result = runner.invoke(app, [*BASE, "--policy", "balanced"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("policy 'balanced' on ")
    assert "(500 queries, 0 with a degraded estimate)" in lines[0]
    header = "threshold coverage accuracy answer abstain clarify escalate resample samples/q"
    assert lines[1].split() == header.split()
    rows = [line.split() for line in lines[2:]]
    assert len(rows) == 1 + 11
    assert rows[0][0] == "as-is"
    data = read_labelled(MATH500, confidence=["probe_conf_raw"])
    as_written = replay_policy(
        load_policy("balanced"), data.confidences["probe_conf_raw"], data.mu_hat, n_samples=data.k
    )
    assert rows[0][1:3] == [f"{as_written.coverage:.3f}", f"{as_written.accuracy:.4f}"]
    assert [r[0] for r in rows[1:]] == [f"{t / 10:.3f}" for t in range(11)]
    assert rows[-1][2] == "-"  # threshold 1: nothing answered, no accuracy


def test_json_matches_the_library() -> None:
    result = runner.invoke(app, [*BASE, "--policy", "conservative", "--json", "--thresholds", "0.8,0.9,0.95"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    data = read_labelled(MATH500, confidence=["probe_conf_raw"])
    policy = load_policy("conservative")
    assert payload["policy"] == "conservative"
    assert payload["n"] == 500
    assert (
        payload["as_written"]
        == replay_policy(policy, data.confidences["probe_conf_raw"], data.mu_hat, n_samples=data.k).to_dict()
    )
    expected = threshold_frontier(
        policy, data.confidences["probe_conf_raw"], data.mu_hat, thresholds=[0.8, 0.9, 0.95], n_samples=data.k
    )
    assert payload["sweep"] == [r.to_dict() for r in expected]
    coverages = [row["coverage"] for row in payload["sweep"]]
    assert coverages == sorted(coverages, reverse=True)


def test_no_sweep_and_step_tool_overrides(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("name: p\nbands: 0.5\non_degraded: abstain\ntools:\n  submit: 0.95\n", encoding="utf-8")
    plain = json.loads(runner.invoke(app, [*BASE, "--policy", str(path), "--no-sweep", "--json"]).stdout)
    gated = json.loads(
        runner.invoke(app, [*BASE, "--policy", str(path), "--no-sweep", "--json", "--tool", "submit"]).stdout
    )
    assert plain["sweep"] == []
    assert gated["as_written"]["coverage"] < plain["as_written"]["coverage"]
    assert gated["as_written"]["accuracy"] > plain["as_written"]["accuracy"]


def test_degraded_rows_are_counted(tmp_path: Path) -> None:
    data = tmp_path / "labels.jsonl"
    data.write_text(
        '{"id": "a", "k": 2, "correct": 2, "c": 0.9}\n{"id": "b", "k": 2, "correct": 0, "c": null}\n',
        encoding="utf-8",
    )
    result = runner.invoke(
        app, ["simulate", "--data", str(data), "--confidence", "c", "--policy", "conservative", "--json"]
    )
    payload = json.loads(result.stdout)
    assert payload["n_degraded"] == 1
    assert payload["as_written"]["rates"]["escalate"] == 0.5  # conservative escalates without an estimate


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--policy", "nope"], "error: no policy preset or file named 'nope'"),
        (["--policy", "balanced", "--thresholds", "0.5,x"], "error: field '--thresholds': not a number: 'x'"),
        (["--policy", "balanced", "--thresholds", "1.5"], "thresholds must be in [0, 1]; got 1.5"),
        (["--policy", "balanced", "--grid", "1"], "error: `thresholds` must be at least 2"),
    ],
)
def test_bad_input_exits_2(extra: list[str], message: str) -> None:
    result = runner.invoke(app, [*BASE, *extra])
    assert result.exit_code == 2
    assert message in result.stderr


def test_bad_policy_file_lists_its_errors(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\nbands: 0.5\nbands2: 1\n", encoding="utf-8")
    result = runner.invoke(app, [*BASE, "--policy", str(path)])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        f"error: {path}:1: field 'on_degraded': missing required key 'on_degraded'",
        f"error: {path}:3: field 'bands2': unknown key 'bands2' "
        "(allowed here: version, name, description, bands, on_degraded, steps, tools, mode)",
    ]


def test_replays_on_logged_decisions_of_either_store(log_location: str | Path) -> None:
    """``--db`` replays on the logged decisions that have an outcome, as the library does on
    their p and outcomes."""
    import numpy as np

    from capgate import Estimate
    from capgate.decision import Decision, DecisionLog

    rng = np.random.default_rng(0)
    p = rng.uniform(0, 1, 40)
    y = rng.uniform(0, 1, 40) < p
    with DecisionLog(log_location) as log:
        for pi, yi in zip(p.tolist(), y.tolist(), strict=True):
            d = Decision(action="answer", estimate=Estimate(p=pi, method="probe"), reason="t")
            log.record(d)
            log.record_outcome(d.id, correct=yi)
        log.record(Decision(action="answer", estimate=Estimate(p=0.5, method="probe"), reason="no outcome"))
        location = log.location
    result = runner.invoke(app, ["simulate", "--policy", "balanced", "--db", location, "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    expected = replay_policy(load_policy("balanced"), p, y.astype(float))
    assert payload["n"] == 40
    assert payload["unscored"] == 1
    assert payload["as_written"] == expected.to_dict()
    table = runner.invoke(app, ["simulate", "--policy", "balanced", "--db", location, "--no-sweep"])
    assert table.exit_code == 0, table.output
    assert "1 logged decisions have no outcome yet" in table.output
    both = runner.invoke(app, ["simulate", "--policy", "balanced", "--db", location, *BASE[1:]])
    assert both.exit_code == 2
    assert "give either --data FILE --confidence FIELD, or --db LOG" in both.stderr


def test_db_scores_each_decision_on_the_mean_of_its_sources_as_report_does(tmp_path: Path) -> None:
    """A decision with a grader's ``correct`` and a later user's ``score`` is scored on their mean
    (as ``capgate report --policy`` is), not on the latest source alone nor called unscored."""
    import numpy as np

    from capgate import Estimate
    from capgate.decision import Decision, DecisionLog

    path = tmp_path / "log.sqlite3"
    p = np.random.default_rng(1).uniform(0, 1, 40)
    with DecisionLog(path) as log:
        for i, pi in enumerate(p.tolist()):
            d = Decision(action="answer", estimate=Estimate(p=pi, method="probe"), reason="t", shadow=True)
            log.record(d)
            log.record_outcome(d.id, correct=True, source="grader")
            if i < 20:
                log.record_outcome(d.id, score=0.0, source="user")
    result = runner.invoke(
        app, ["simulate", "--policy", "balanced", "--db", str(path), "--no-sweep", "--json"]
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert (payload["n"], payload["unscored"]) == (40, 0)
    report = runner.invoke(
        app, ["report", "--db", str(path), "--policy", "balanced", "--min-outcomes", "1", "--json"]
    )
    assert report.exit_code == 0, report.output
    (group,) = json.loads(report.output)["groups"]
    assert payload["as_written"] == group["candidate"]
    expected = replay_policy(load_policy("balanced"), p, np.array([0.5] * 20 + [1.0] * 20))
    assert payload["as_written"] == expected.to_dict()


def test_db_locked_or_down_is_an_error_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from capgate.decision import DecisionLog
    from capgate.errors import LogUnavailableError

    path = tmp_path / "log.sqlite3"
    DecisionLog(path).count()  # creates the file

    def locked(self: DecisionLog, **_: object) -> None:
        raise LogUnavailableError("database is locked", location=str(path))

    monkeypatch.setattr(DecisionLog, "decisions", locked)
    result = runner.invoke(app, ["simulate", "--policy", "balanced", "--db", str(path)])
    assert result.exit_code == 2, result.output
    assert "error: " in result.stderr
    assert "database is locked" in result.stderr
