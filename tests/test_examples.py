"""Every runnable example in examples/ runs as a script and prints what it should."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from capgate.decision import calibrate_threshold
from capgate.labels.labelled import read_labelled

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
ACTIONS = {"answer", "abstain", "clarify", "escalate", "resample"}


def run(name: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def questions(out: str, n: int, decision: str) -> list[tuple[str, re.Match[str]]]:
    """The ``n`` per-question blocks an example printed, each with its decision line matched by
    ``decision`` (whose first group must be one of the policy's actions)."""
    blocks = out.split("question: ")[1:]
    assert len(blocks) == n, out
    found = [(block, re.search(decision, block)) for block in blocks]
    assert all(m is not None and m.group(1) in ACTIONS for _, m in found), out
    return [(block, m) for block, m in found if m is not None]


def test_policy_walkthrough() -> None:
    out = run("policy_walkthrough.py")
    assert (
        "preset balanced: [0, 0.3) abstain, [0.3, 0.6) clarify, [0.6, 1] answer; on_degraded: abstain" in out
    )
    for line in (
        "preset conservative:",
        "preset cost-saver:",
        "broken.yaml:5: field 'bands[1].below'",
        "broken.yaml:6: field 'on_degraded.action': unknown action 'shrug'",
        "p=0.92: answer",
        "p=0.45: clarify",
        "p=0.12: abstain",
        "p=None: abstain (estimate degraded (hidden states not available)",
    ):
        assert line in out
    data = read_labelled(
        EXAMPLES.parent / "sdk" / "assets" / "math500_gpt-oss-20b_probe-math.jsonl",
        confidence=["probe_conf_raw"],
    )
    control = calibrate_threshold(data.confidences["probe_conf_raw"], data.mu_hat, alpha=0.03, delta=0.1)
    assert control.threshold is not None
    assert f"calibrated threshold: {control.threshold:.3f} (answers {control.n_answered} of 500" in out
    assert f"clarify band [0.3, 0.6) now ends at {control.threshold:g}" in out


@pytest.mark.slow
def test_guard_quickstart() -> None:
    out = run("guard_quickstart.py", "--model", "default")
    decisions = re.findall(r"decision: (\w+)\n  (answer|blocked): (.+)", out)
    assert len(decisions) == 3
    for action, kind, text in decisions:
        assert action in ACTIONS
        assert kind == ("answer" if action in ("answer", "resample") else "blocked")
        assert text.strip()
    assert re.search(r"strict(: Abstained|: ClarificationNeeded|: Escalated| answer): .+", out)
    counts = {a: [d[0] for d in decisions].count(a) for a in {d[0] for d in decisions}}
    stats = re.search(r"stats: calls=(\d+) actions=(\{.*\})", out)
    assert stats is not None
    assert int(stats.group(1)) == 3
    assert ast.literal_eval(stats.group(2)) == counts


@pytest.mark.slow
def test_langgraph_escalation_resumes_in_a_new_process(tmp_path: Path) -> None:
    db = str(tmp_path / "checkpoints.sqlite")
    first = run("langgraph_escalation.py", "ask", "--model", "default", "--db", db, "--thread", "t")
    assert "decision: escalate" in first
    assert "escalated to maths-desk: Escalated for human review by policy 'review-desk'" in first
    assert "pending escalation saved" in first
    second = run("langgraph_escalation.py", "resume", "--db", db, "--thread", "t", "--reply", "It is 6.")
    assert "found pending escalation (escalate to maths-desk)" in second
    assert "What is the 20th digit of pi after the decimal point?" in second
    assert second.strip().endswith("final answer: It is 6.")
    third = run("langgraph_escalation.py", "resume", "--db", db, "--thread", "t", "--approve")
    assert "nothing pending for this thread" in third


@pytest.mark.slow
def test_langchain_middleware() -> None:
    out = run("langchain_middleware.py", "--model", "default")
    for block, _ in questions(out, 3, r"decision: (\w+)"):
        reply = re.search(r"  reply: (.+)", block)
        assert reply is not None
        assert reply.group(1).strip()
    assert re.search(r"gate stats: calls=\d+ actions=", out)


@pytest.mark.slow
def test_shadow_rollout_reports_ungated_against_would_be_gated(tmp_path: Path) -> None:
    from capgate.decision import DecisionLog, gate_report

    db = tmp_path / "log.sqlite3"
    out = run("shadow_rollout.py", "--db", str(db))
    assert "asked 24 held-out questions in shadow mode; 24 outcomes attached" in out
    assert "actions taken: {'answer': 24}" in out  # shadow mode never blocks
    with DecisionLog(db) as log:
        rows = log.decisions()
        (group,) = gate_report(log, min_outcomes=20).groups
    assert len(rows) == 24
    assert all(r.decision.shadow and r.outcome is not None and r.outcome.source == "grader" for r in rows)
    for line in (
        f"ungated accuracy:         {group.accuracy_all}",
        f"would-be gated accuracy:  {group.accuracy_gated}",
        f"would-be coverage:        {group.coverage}",
        "(had we enforced)",
    ):
        assert line in out


@pytest.mark.slow
def test_calibrate_your_model_runs_the_whole_workflow(tmp_path: Path) -> None:
    out = run("calibrate_your_model.py", "--questions", "16", "-k", "2", "--work", str(tmp_path))
    for command in ("capgate harvest", "capgate probe featurize", "capgate probe fit", "capgate probe eval",
                    "capgate policy calibrate"):  # fmt: skip
        assert f"$ {command}" in out
    assert len((tmp_path / "labels.jsonl").read_text().splitlines()) == 16
    assert (tmp_path / "probe" / "probe.safetensors").is_file()
    assert "constant-prior" in out or "constant prior" in out
    assert ("calibrated policy written" in out) != ("no threshold certified" in out)


@pytest.mark.slow
def test_proxy_probe_workflow_against_the_vllm_server(tmp_path: Path) -> None:
    """A proxy probe: the embedded model reads, the CI vLLM server (sampled at another setting
    than the shipped probe's labels) is the target; gating its calls costs it no extra call."""
    import json
    import os

    url, served = os.environ.get("CAPGATE_TEST_VLLM_URL"), os.environ.get("CAPGATE_TEST_VLLM_MODEL")
    assert url, "run under scripts/with-vllm-server.sh (CAPGATE_TEST_VLLM_URL is not set)"
    assert served, "run under scripts/with-vllm-server.sh (CAPGATE_TEST_VLLM_MODEL is not set)"
    out = run(
        "calibrate_your_model.py", "--questions", "16", "-k", "2", "--work", str(tmp_path),
        "--target-url", url, "--target-model", served,
    )  # fmt: skip
    meta = json.loads((tmp_path / "labels.jsonl.meta.json").read_text())
    assert (meta["model_id"], meta["endpoint"], meta["temperature"]) == (served, "openai", 0.7)
    saved = json.loads((tmp_path / "probe" / "probe.json").read_text())
    assert saved["target"]["model"] == served
    assert saved["feature_spec"]["model_id"]  # the reader, recorded beside the target
    assert saved["target"]["endpoint"] == "openai"
    assert f"target {served}" in out
    gated = re.findall(rf"gated call to {re.escape(served)}: p=[\d.]+ -> (\w+)", out)
    assert len(gated) == 4
    calls = re.search(r"calls to the target: (\d+); drawn by the decisions: (\d+); by the estimates: 0", out)
    assert calls is not None
    assert calls.group(1) == calls.group(2)
    assert "a gate for another model is refused" in out


@pytest.mark.slow
def test_openai_agents_guardrail_against_the_vllm_server() -> None:
    """The Agents SDK example: a real Runner over the CI server, gated by the model's own
    verbalized confidence, a blocking guardrail and a triage that hands off."""
    import os

    url, served = os.environ.get("CAPGATE_TEST_VLLM_URL"), os.environ.get("CAPGATE_TEST_VLLM_MODEL")
    assert url, "run under scripts/with-vllm-server.sh (CAPGATE_TEST_VLLM_URL is not set)"
    assert served, "run under scripts/with-vllm-server.sh (CAPGATE_TEST_VLLM_MODEL is not set)"
    out = run("openai_agents_guardrail.py", "--base-url", url, "--model", served)
    for block, decision in questions(out, 2, r"decision: (\w+) \(p=\S+, target (\S+)\)"):
        assert decision.group(2) == served  # the agent's model, read by the guardrail
        assert re.search(r"  (reply|tripped): \S", block)
    triage = re.search(r"triage: .+\n  decision: (\w+); (handed to: (helper|reviewer)|tripped: \S)", out)
    assert triage is not None
    assert re.search(r"gate stats: calls=2 ", out)


@pytest.mark.slow
def test_learn_from_traffic_runs_the_whole_loop(tmp_path: Path) -> None:
    """shadow -> graded outcomes -> calibrate -> the new version in shadow beside the current one ->
    promote, on the embedded model: the log records each step and every decision's version."""
    from capgate.decision import DecisionLog
    from capgate.learn import Calibration

    out = run("learn_from_traffic.py", "--work", str(tmp_path))
    assert "1. shadow: 120 questions asked, 120 graded outcomes attached" in out
    cal = Calibration.load(tmp_path / "calibration-1")
    assert f"3. calibrate: kept {cal.kind!r}, version {cal.version}" in out
    assert len(re.findall(r"^   (previous|isotonic|platt|probe) +Brier ", out, flags=re.M)) >= 3
    assert out.count("  <- kept") == 1
    with DecisionLog(tmp_path / "decisions.sqlite3") as log:
        events = [(e.event, e.version) for e in log.calibration_events()]
        rows = log.decisions()
    assert events == [("shadow", cal.version), ("promote", cal.version)]
    first = [r for r in rows if r.decision.shadow and r.decision.beside is None]
    candidates = [r for r in rows if r.decision.beside is not None]
    enforced = [r for r in rows if not r.decision.shadow]
    assert len(first) == 120 + 40  # the shadow decisions, before and beside the candidate
    assert all(r.decision.calibration is None for r in first)  # nothing promoted yet
    assert len(candidates) == 40
    assert all(r.decision.shadow and r.decision.calibration == cal.version for r in candidates)
    assert {r.decision.beside for r in candidates} <= {r.id for r in first}
    assert len(enforced) == 3
    assert all(r.decision.calibration == cal.version for r in enforced)
    assert len(re.findall(rf"^5\. \w+ under {cal.version} \(p=", out, flags=re.M)) == 3
    assert f"target None: enforced {cal.version}" in out
