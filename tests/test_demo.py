"""`capgate demo`, the README's main job: the question draw, the header, the comparison against a
hand count, the replay of the shipped MATH-500 file, ``--json`` and ``--plot``; end to end on the
embedded model (slow, no mocks)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import DemoRun
from typer.testing import CliRunner

from capgate.cli import app
from capgate.demo import live
from capgate.demo.comparison import Comparison, compare
from capgate.demo.replay import REPLAY_CONFIDENCE, REPLAY_DATA, replay_math500
from capgate.labels.labelled import iter_labelled, read_labelled
from capgate.policies import load_policy

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "sdk" / "assets"


# --------------------------------------------------------------------------- the questions


def test_demo_policy_is_valid_and_questions_are_held_out() -> None:
    policy = load_policy(live.DEMO_POLICY)
    assert policy.name == "demo-smollm2"
    questions = live.demo_questions(5, seed=0)
    assert len(questions) == 5
    assert len({q.item.id for q in questions}) == 5
    assert all(0.0 <= q.mu_hat <= 1.0 and q.prompt for q in questions)
    held_out = set(json.loads((ASSETS / "default_split.json").read_text(encoding="utf-8"))["test"])
    assert {q.item.id for q in live.demo_questions(40, seed=3)} <= held_out


def _in_stratum(question: live.DemoQuestion) -> bool:
    bounds = {name: (lower, upper) for name, lower, upper in live.STRATA}
    lower, upper = bounds[question.stratum]
    mu = question.mu_hat
    if question.stratum == live.STRATA[0][0]:
        return bool(mu == 0.0)
    return bool(mu > 0.0 and (lower <= mu < upper or (upper == 1.0 and mu == 1.0)))


def test_questions_are_stratified_over_mu_hat_and_seeded() -> None:
    questions = live.demo_questions(12, seed=0)
    assert Counter(q.stratum for q in questions) == {name: 3 for name, _, _ in live.STRATA}
    assert all(_in_stratum(q) for q in questions)
    assert [q.item.id for q in live.demo_questions(12, seed=0)] == [q.item.id for q in questions]
    assert [q.item.id for q in live.demo_questions(12, seed=1)] != [q.item.id for q in questions]
    # a stratum that runs out hands its share to the others; the whole split is every question
    size = live.held_out_size()
    assert size == 356
    everything = live.demo_questions(size, seed=0)
    assert len({q.item.id for q in everything}) == size
    assert all(_in_stratum(q) for q in everything)
    top = live.STRATA[-1][0]
    n_top = sum(q.stratum == top for q in everything)
    drawn = Counter(q.stratum for q in live.demo_questions(4 * n_top + 9, seed=0))
    assert drawn[top] == n_top  # all of them, and the 9 left over go to the other strata
    assert sorted(drawn.values()) == [n_top, n_top + 3, n_top + 3, n_top + 3]


@pytest.mark.parametrize("n", [0, -1, 357, True, 2.0])
def test_question_count_out_of_range_is_refused(n: Any) -> None:
    with pytest.raises(ValueError, match="from 1 to 356"):
        live.demo_questions(n)


def test_question_sources_match_the_harvest_that_made_them() -> None:
    """The source read from id and kind agrees with the v2 harvest's own record of each source."""
    recorded = json.loads((ROOT / "bench" / "data" / "default_v2_split.json").read_text(encoding="utf-8"))
    names = {
        "triviaqa": "TriviaQA",
        "mmlu": "MMLU",
        "gsm8k": "GSM8K",
        "arc_easy": "ARC",
        "arc_challenge": "ARC",
    }
    checked = 0
    for _, record in iter_labelled(ASSETS / "default_labels.jsonl"):
        if record.id in recorded["source"]:
            source = recorded["source"][record.id]
            expected = "basic_arithmetic" if source.startswith("basic_arithmetic") else names[source]
            assert live.question_source(record) == expected, record.id
            checked += 1
    assert checked == 1040
    assert {q.source for q in live.demo_questions(live.held_out_size())} == {
        "ARC", "GSM8K", "MMLU", "TriviaQA", "basic_arithmetic",
    }  # fmt: skip


# --------------------------------------------------------------------------- the header


def _bands_from_policy(name: str) -> list[tuple[str, float, float]]:
    rule = load_policy(name).rule()
    return [(band.action, lower, upper) for band, (lower, upper) in zip(rule.bands, rule.edges, strict=True)]


def test_header_states_the_loaded_policys_bands_and_the_question_sources() -> None:
    policy = load_policy(live.DEMO_POLICY)
    questions = live.demo_questions(12, seed=0)
    header = live.demo_header(policy, questions, seed=0)
    bands = _bands_from_policy(live.DEMO_POLICY)
    (abstain, _, abstain_upper), (resample, lower, upper), (answer, answer_lower, _) = bands
    assert (abstain, resample, answer) == ("abstain", "resample", "answer")
    assert f"abstain p < {abstain_upper:g}" in header
    assert (
        f"resample (CAS, <= {policy.rule().bands[1].max_samples} samples) {lower:g} <= p < {upper:g}"
        in header
    )
    assert f"answer p >= {answer_lower:g}" in header
    assert f"no estimate: {policy.on_degraded.action}" in header
    numbers = set(re.findall(r"p [<>]=? (0\.\d+)|(0\.\d+) <= p", header))
    assert {float(x or y) for x, y in numbers} == {abstain_upper, upper, answer_lower}
    # the sources named are exactly those of the questions, with their counts
    named = dict(re.findall(r"(ARC|GSM8K|MMLU|TriviaQA|basic_arithmetic) (\d+)", header))
    assert {k: int(v) for k, v in named.items()} == dict(Counter(q.source for q in questions))
    assert (
        f"share of {' or '.join(str(k) for k in sorted({q.k for q in questions}))} sampled answers" in header
    )


def test_header_follows_the_policy_not_a_literal() -> None:
    moved, _ = load_policy(live.DEMO_POLICY).with_answer_threshold(0.4)
    text = live.describe_policy(moved)
    assert "answer p >= 0.4" in text
    assert "0.26" not in text
    assert "0.13 <= p < 0.4" in text


# --------------------------------------------------------------------------- the comparison


@dataclass(frozen=True)
class Row:
    ungated_correct: bool
    action: str
    correct: bool | None
    samples: int
    ungated_seconds: float = 1.0
    gated_seconds: float = 0.5


ROWS = [
    # ungated right / wrong, the gate's action, the gated answer's correctness (None: stopped), samples
    Row(True, "answer", True, 1, 1.0, 1.25),
    Row(True, "resample", True, 4, 1.0, 4.5),
    Row(True, "abstain", None, 0, 1.0, 0.25),
    Row(False, "answer", False, 1, 1.0, 1.25),
    Row(False, "resample", True, 6, 1.0, 6.5),  # the vote found the right answer
    Row(False, "resample", None, 6, 1.0, 6.5),  # no sampled answer had one: stopped
    Row(False, "abstain", None, 0, 1.0, 0.25),
    Row(False, "abstain", None, 0, 1.0, 0.25),
    Row(False, "abstain", None, 0, 1.0, 0.25),
    Row(True, "answer", False, 1, 1.0, 1.25),  # cannot happen with the demo's seeding, counted anyway
]


def hand_count(rows: list[Row]) -> dict[str, float]:
    """The figures counted by hand, one loop, no shared code with capgate.demo.comparison."""
    counts = dict.fromkeys(
        ("n", "ungated_right", "answered", "right", "wrong_stopped", "right_stopped", "samples"), 0.0
    )
    added = 0.0
    for r in rows:
        counts["n"] += 1
        counts["ungated_right"] += r.ungated_correct
        counts["samples"] += r.samples
        added += r.gated_seconds - r.ungated_seconds
        if r.correct is None:
            counts["wrong_stopped" if not r.ungated_correct else "right_stopped"] += 1
        else:
            counts["answered"] += 1
            counts["right"] += r.correct
    counts["added"] = added
    return counts


def assert_matches(c: Comparison, rows: list[Row]) -> None:
    """Every figure of ``c`` against the hand count of ``rows``."""
    h = hand_count(rows)
    off, on = c.without_gate, c.with_gate
    assert c.questions == h["n"]
    assert (off.right, off.wrong, off.samples) == (h["ungated_right"], h["n"] - h["ungated_right"], h["n"])
    assert off.accuracy is not None
    assert off.accuracy.value == pytest.approx(h["ungated_right"] / h["n"])
    assert on.answered == h["answered"]
    assert on.samples == h["samples"]
    assert on.coverage is not None
    assert on.coverage.value == pytest.approx(h["answered"] / h["n"])
    assert (on.right, on.wrong) == (h["right"], h["answered"] - h["right"])
    assert on.accuracy is not None
    assert on.accuracy.value == pytest.approx(h["right"] / h["answered"])
    assert (on.wrong_stopped, on.right_stopped) == (h["wrong_stopped"], h["right_stopped"])
    assert on.wrong_stopped_share is not None
    assert on.right_stopped_share is not None
    assert on.wrong_stopped_share.value == pytest.approx(h["wrong_stopped"] / (h["n"] - h["ungated_right"]))
    assert on.right_stopped_share.value == pytest.approx(h["right_stopped"] / h["ungated_right"])
    assert on.seconds_added == pytest.approx(h["added"])


def test_comparison_matches_a_hand_count_and_a_planted_wrong_count_fails() -> None:
    c = compare(ROWS)
    # the figures, worked out on paper from ROWS
    assert (c.questions, c.without_gate.right, c.without_gate.wrong) == (10, 4, 6)
    assert (c.with_gate.answered, c.with_gate.right, c.with_gate.wrong) == (5, 3, 2)
    assert (c.with_gate.wrong_stopped, c.with_gate.right_stopped, c.with_gate.samples) == (4, 1, 19)
    assert c.with_gate.seconds_added == pytest.approx(22.25 - 10.0)
    assert_matches(c, ROWS)
    # one planted wrong count (a stopped wrong answer recorded as stopped right) must fail the check
    planted = list(ROWS)
    planted[6] = Row(True, "abstain", None, 0, 1.0, 0.25)
    with pytest.raises(AssertionError):
        assert_matches(c, planted)
    with pytest.raises(AssertionError):
        assert_matches(compare(planted), ROWS)


def test_comparison_rates_carry_wilson_intervals() -> None:
    c = compare(ROWS)
    coverage = c.with_gate.coverage
    assert coverage is not None
    z = 1.959963984540054
    n, k = 10, 5
    center = (k / n + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt((k / n) * (1 - k / n) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    assert (coverage.low, coverage.high) == pytest.approx((center - half, center + half))
    assert coverage.method == "wilson"
    empty = compare([Row(False, "abstain", None, 0)])
    assert empty.with_gate.accuracy is None
    assert empty.with_gate.right_stopped_share is None
    assert json.loads(json.dumps(c.to_dict()))["with_gate"]["coverage"]["value"] == 0.5


# --------------------------------------------------------------------------- the replay


def test_replay_of_the_shipped_math500_file(tmp_path: Path) -> None:
    report = replay_math500(workdir=tmp_path)
    labels = read_labelled(REPLAY_DATA, confidence=[REPLAY_CONFIDENCE])
    order = np.random.default_rng(0).permutation(500)
    calib, scored = np.sort(order[:250]), np.sort(order[250:])
    assert (report.questions, report.calibration_questions, report.scored_questions) == (500, 250, 250)
    # the threshold is the one `capgate policy calibrate` writes for the calibration half
    lines = [line for line in REPLAY_DATA.read_text(encoding="utf-8").splitlines() if line.strip()]
    half = tmp_path / "half.jsonl"
    half.write_text("\n".join(lines[i] for i in calib) + "\n", encoding="utf-8")
    result = CliRunner().invoke(
        app,
        ["policy", "calibrate", "--data", str(half), "--confidence", REPLAY_CONFIDENCE, "--risk", "0.1",
         "--out", str(tmp_path / "p.yaml"), "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert report.threshold == json.loads(result.output)["threshold"] == 0.598
    assert load_policy(tmp_path / "p.yaml").rule().answer_edge == report.threshold
    # scored on the other half, by hand
    p = labels.confidences[REPLAY_CONFIDENCE][scored]
    mu = labels.correct[scored] / labels.k[scored]
    answered = p >= report.threshold
    assert report.answered == int(answered.sum()) == 244
    assert report.coverage is not None
    assert report.coverage.value == pytest.approx(answered.mean())
    assert report.accuracy_answered is not None
    assert report.accuracy_all is not None
    assert report.accuracy_answered.value == pytest.approx(mu[answered].mean())
    assert report.accuracy_all.value == pytest.approx(mu.mean())
    assert report.accuracy_answered.value > report.accuracy_all.value
    assert 1 - report.accuracy_answered.value <= report.risk
    assert report.wrong_all == pytest.approx(report.wrong_answered + report.wrong_stopped)
    assert report.right_stopped == pytest.approx(mu[~answered].sum())
    # pass@k: the uniform budget's pass rate is the mean unbiased pass@k; the greedy budget is the fewest
    from capgate.metrics import expected_success, greedy_allocation, pass_at_k_unbiased

    n, c = labels.k[scored], labels.correct[scored]
    for saving in report.passk:
        assert saving.uniform_samples == 250 * saving.k
        assert saving.uniform_success == pytest.approx(pass_at_k_unbiased(n, c, saving.k).mean())
        assert saving.greedy_success >= saving.uniform_success - 1e-12
        short = expected_success(greedy_allocation(p, saving.greedy_samples - 1, max_per_query=n), n, c)
        assert short < saving.uniform_success
        assert saving.saved == saving.uniform_samples - saving.greedy_samples > 0
    assert [s.saved for s in report.passk] == [378, 1771]


def test_replay_reads_a_record_holding_a_unicode_line_separator(tmp_path: Path) -> None:
    """U+2028 in a question (written unescaped, valid JSON) is no line break for the file reader:
    the replay splits lines as it does, instead of refusing the file."""
    records = [
        json.loads(line) for line in REPLAY_DATA.read_text(encoding="utf-8").split("\n") if line.strip()
    ]
    records[0]["question"] = f"{records[0].get('question', '')}\u2028pasted from a web page"
    data = tmp_path / "math500.jsonl"
    data.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    report = replay_math500(data, workdir=tmp_path / "work")
    assert (report.questions, report.threshold, report.answered) == (500, 0.598, 244)


def test_the_live_part_without_the_local_extra_is_an_error_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first command a user runs: without transformers, an error naming the extra, not a traceback."""
    monkeypatch.setitem(sys.modules, "transformers", None)  # as where the extra is not installed
    result = CliRunner().invoke(app, ["demo", "--no-verbalized", "--no-replay"])
    assert result.exit_code == 2, result.output
    expected = "error: the demo's live part (--no-live leaves it out) needs transformers"
    assert result.stderr.startswith(expected)
    assert "pip install 'capgate[local]'" in result.stderr


def test_replay_refuses_bad_data(tmp_path: Path) -> None:
    from capgate.errors import DataError

    with pytest.raises(DataError):
        replay_math500(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "k": 4, "correct": 3}\n', encoding="utf-8")
    with pytest.raises(DataError, match=REPLAY_CONFIDENCE):
        replay_math500(bad)


# --------------------------------------------------------------------------- the command


def test_json_schema_of_the_replay_part_and_bad_options(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["demo", "--no-live", "--no-verbalized", "--json", "--plot", str(tmp_path)])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert document["schema"] == "capgate.demo.live/1"
    assert document["live"] is None
    replay = document["replay"]
    assert replay["part"] == "replay"
    assert "recorded" in replay["model"]
    for key in ("coverage", "accuracy_answered", "accuracy_all"):
        assert set(replay[key]) == {"value", "low", "high", "n", "method"}
    assert replay["threshold"] == 0.598
    assert replay["answered"] == 244
    assert [s["saved"] for s in replay["passk"]] == [378, 1771]
    from capgate.policies import Policy

    written = Policy.from_yaml_text(replay["policy_yaml"])  # the policy `capgate policy calibrate` wrote
    assert written.rule().answer_edge == replay["threshold"]
    assert "out" not in replay["calibration"]
    assert replay["calibration"]["threshold"] == replay["threshold"]
    assert sorted(Path(p).name for p in document["plots"]) == [
        "replay_reliability.png",
        "replay_risk_coverage.png",
    ]
    assert all(Path(p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in document["plots"])
    for args, message in (
        (["--questions", "357"], "from 1 to 356"),
        (["--questions", "0"], "from 1 to 356"),
        (["--no-live", "--no-verbalized", "--no-replay"], "nothing to run"),
        (["--no-live", "--no-verbalized", "--replay-data", str(tmp_path / "none.jsonl")], "none.jsonl"),
    ):
        result = runner.invoke(app, ["demo", *args])
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output


@pytest.mark.slow
def test_demo_json_on_stdout_is_only_json_with_the_model_loaded(default_model_dir: Path) -> None:
    """``--json`` alone: loading the model and running a question print nothing beside the JSON."""
    command = [sys.executable, "-m", "capgate.cli", "demo", "--questions", "1", "--json", "--no-replay"]
    done = subprocess.run([*command, "--no-verbalized"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    document = json.loads(done.stdout)
    assert (len(document["live"]["rows"]), document["verbalized"], document["replay"]) == (1, None, None)


@pytest.mark.slow
def test_capgate_demo_json_figures_match_a_hand_count_of_its_rows(demo_run: DemoRun) -> None:
    shown = demo_run.figures["live"]
    rows = [
        Row(
            r["ungated_correct"],
            r["action"],
            r["correct"],
            r["samples"],
            r["ungated_seconds"],
            r["gated_seconds"],
        )
        for r in shown["rows"]
    ]
    assert len(rows) == 4
    assert {r["stratum"] for r in shown["rows"]} == {name for name, _, _ in live.STRATA}
    assert all((r["correct"] is None) == (not r["answered"]) for r in shown["rows"])
    assert all(r["answered"] or r["action"] in ("abstain", "resample") for r in shown["rows"])
    hand = hand_count(rows)
    on, off = shown["comparison"]["with_gate"], shown["comparison"]["without_gate"]
    assert (off["right"], off["samples"]) == (hand["ungated_right"], 4)
    assert (on["answered"], on["right"], on["samples"]) == (hand["answered"], hand["right"], hand["samples"])
    assert (on["wrong_stopped"], on["right_stopped"]) == (hand["wrong_stopped"], hand["right_stopped"])
    # an answered question's gated answer is the ungated one (same seed, same first sample)
    for r in shown["rows"]:
        if r["action"] == "answer":
            assert (r["answer"], r["correct"]) == (
                r["ungated_answer"] or "(no answer found)",
                r["ungated_correct"],
            )
    assert shown["bands"] == live.describe_policy(load_policy(live.DEMO_POLICY))
    named = dict(re.findall(r"(ARC|GSM8K|MMLU|TriviaQA|basic_arithmetic) (\d+)", shown["header"]))
    assert {k: int(v) for k, v in named.items()} == dict(Counter(r["source"] for r in shown["rows"]))


@pytest.mark.slow
def test_capgate_demo_runs_end_to_end(demo_run: DemoRun) -> None:
    out = demo_run.text
    assert out.count("without gate:") == 4
    assert out.count("with gate: p=") == 4
    assert live.describe_policy(load_policy(live.DEMO_POLICY)) in " ".join(out.split())
    assert "LIVE:" in out
    assert "REPLAY (recorded data; no model runs)" in out
    assert "VERBALIZED: SmolLM2 taught by C3RL (the shipped adapter)" in " ".join(out.split())
    for heading in (
        "without the gate",
        "with the gate",
        "coverage",
        "among answered",
        "stopped",
        "samples spent",
    ):
        assert heading in out
    assert "answer when p >= 0.598" in out
    assert "samples saved" in out
    names = [
        "live_reliability.png",
        "live_risk_coverage.png",
        "replay_reliability.png",
        "replay_risk_coverage.png",
    ]
    assert sorted(p.name for p in demo_run.plots.iterdir()) == names
    assert demo_run.figures["plots"] == [str(demo_run.plots / name) for name in names]


def test_the_time_row_says_saved_when_the_gate_saves_time() -> None:
    from capgate.cli.demo_cmd import time_change

    assert time_change(1.25) == "+1.2 s added"
    assert time_change(-0.6) == "0.6 s saved"
    assert time_change(-0.04) == "+0.0 s added"  # rounds to nothing: not "0.0 s saved"
    assert time_change(0.0) == "+0.0 s added"
