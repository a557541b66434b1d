"""``capgate policy schema | validate | calibrate`` through typer's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from capgate.cli import app
from capgate.labels.labelled import read_labelled
from capgate.policies import Policy, load_policy, policy_json_schema

MATH500 = Path(__file__).resolve().parents[1] / "sdk" / "assets" / "math500_gpt-oss-20b_probe-math.jsonl"
runner = CliRunner()


def test_schema_prints_and_writes(tmp_path: Path) -> None:
    result = runner.invoke(app, ["policy", "schema"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == policy_json_schema()
    out = tmp_path / "schema.json"
    result = runner.invoke(app, ["policy", "schema", "--out", str(out)])
    assert result.exit_code == 0
    assert json.loads(out.read_text(encoding="utf-8"))["title"] == "capgate policy"


def test_validate_accepts_presets_and_files(tmp_path: Path) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text("name: ok\nbands: 0.5\non_degraded: abstain\ntools:\n  pay: 0.9\n", encoding="utf-8")
    result = runner.invoke(app, ["policy", "validate", "balanced", str(path)])
    assert result.exit_code == 0, result.output
    assert "ok: balanced: policy 'balanced', 3 bands" in result.stdout
    assert f"ok: {path}: policy 'ok', 2 bands, 0 step and 1 tool override(s)" in result.stdout


def test_validate_reports_every_error_with_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "name: bad\nbands:\n  - {below: 0.6, action: clarify}\n"
        "  - {below: 0.3, action: abstian}\n  - {action: answer}\n",
        encoding="utf-8",
    )
    result = runner.invoke(app, ["policy", "validate", str(path), "conservative"])
    assert result.exit_code == 2
    errors = result.stderr.splitlines()
    assert errors == [
        f"error: {path}:1: field 'on_degraded': missing required key 'on_degraded'",
        f"error: {path}:4: field 'bands[1].action': unknown action 'abstian'; "
        "expected one of: answer, abstain, clarify, escalate, resample, route",
        f"error: {path}:4: field 'bands[1].below': bands must be listed in ascending order of p, "
        "each non-empty: bands[1].below=0.3 is not above the lower edge 0.6 of bands[1]",
    ]
    assert "ok: conservative" in result.stdout  # the other files are still checked


def test_validate_unknown_file() -> None:
    result = runner.invoke(app, ["policy", "validate", "no-such-policy.yaml"])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: no policy preset or file named 'no-such-policy.yaml'")


def test_calibrate_writes_a_policy_whose_threshold_controls_risk(tmp_path: Path) -> None:
    out = tmp_path / "calibrated.yaml"
    args = ["policy", "calibrate", "--data", str(MATH500), "--confidence", "probe_conf_raw"]
    result = runner.invoke(
        app, [*args, "--risk", "0.05", "--delta", "0.1", "--policy", "balanced", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    policy = Policy.from_yaml(out)
    threshold = policy.rule().edges[-1][0]
    assert result.stdout.startswith(f"threshold {threshold:g}: answer when p >= {threshold:g}")
    # the balanced preset's bands and texts are kept; only the answer edge moved
    balanced = load_policy("balanced")
    assert policy.name == "balanced"
    assert [b.action for b in policy.bands] == ["abstain", "clarify", "answer"]
    assert policy.bands[0] == balanced.bands[0]
    text = out.read_text(encoding="utf-8")
    assert text.startswith("# Calibrated by `capgate policy calibrate`")
    assert "is <= 0.05 with probability >= 0.9" in text
    # on the calibration data the answered queries' mean error 1 - µ̂ is within the target
    data = read_labelled(MATH500, confidence=["probe_conf_raw"])
    answered = data.confidences["probe_conf_raw"] >= threshold
    assert float(np.mean(1 - data.mu_hat[answered])) <= 0.05
    assert 0.5 < answered.mean() < 1.0


def test_calibrate_without_policy_builds_a_two_band_policy_and_prints_json(tmp_path: Path) -> None:
    out = tmp_path / "new.yaml"
    result = runner.invoke(
        app,
        [
            "policy", "calibrate", "--data", str(MATH500), "--confidence", "probe_conf_raw", "--risk", "0.05",
            "--below", "escalate", "--name", "math-gate", "--pvalue", "hoeffding-bentkus",
            "--out", str(out), "--json",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["pvalue"] == "hoeffding-bentkus"
    assert summary["loss"] == "expected"
    assert summary["procedure"] == "fallback"
    assert summary["out"] == str(out)
    assert summary["risk"] <= 0.05
    policy = Policy.from_yaml(out)
    assert policy.name == "math-gate"
    assert [b.action for b in policy.bands] == ["escalate", "answer"]
    assert policy.on_degraded.action == "escalate"
    assert policy.rule().edges[-1][0] == summary["threshold"]
    assert yaml.safe_load(out.read_text(encoding="utf-8"))["bands"][0]["below"] == summary["threshold"]


def test_calibrate_a_tool_override(tmp_path: Path) -> None:
    out = tmp_path / "tool.yaml"
    result = runner.invoke(
        app,
        [
            "policy", "calibrate", "--data", str(MATH500), "--confidence", "probe_conf_raw", "--risk", "0.05",
            "--policy", "balanced", "--tool", "submit", "--out", str(out),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    policy = Policy.from_yaml(out)
    assert policy.rule() == load_policy("balanced").rule()
    assert policy.rule(tool="submit").edges[-1][0] > 0.6


def test_calibrate_refuses_to_write_when_nothing_is_certified(tmp_path: Path) -> None:
    out = tmp_path / "never.yaml"
    result = runner.invoke(
        app,
        ["policy", "calibrate", "--data", str(MATH500), "--confidence", "probe_conf_raw", "--risk", "0.005",
         "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 1
    assert "no threshold keeps the risk <= 0.005" in result.stderr
    assert "No policy written" in result.stderr
    assert not out.exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--pvalue", "t"], "error: field '--pvalue': must be one of binomial, hoeffding-bentkus; got 't'"),
        (["--loss", "expected"], "error: the binomial p-value needs 0/1 losses"),
        (["--risk", "1.5"], "error: `--risk` must be a number in (0, 1); got 1.5"),
        (
            ["--confidence", "nope"],
            "math500_gpt-oss-20b_probe-math.jsonl:1: field 'nope': missing confidence field",
        ),
        (["--policy", "nope"], "error: no policy preset or file named 'nope'"),
        (["--start", "0.9"], "error: a fixed `start` needs procedure='fixed-sequence'"),
    ],
)
def test_calibrate_bad_input_exits_2(tmp_path: Path, extra: list[str], message: str) -> None:
    base = {
        "--data": str(MATH500),
        "--confidence": "probe_conf_raw",
        "--risk": "0.05",
        "--out": str(tmp_path / "o.yaml"),
    }
    for flag, value in zip(extra[::2], extra[1::2], strict=True):
        base[flag] = value
    args = ["policy", "calibrate", *[x for pair in base.items() for x in pair]]
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert not (tmp_path / "o.yaml").exists()


def test_calibrate_bad_data_line(tmp_path: Path) -> None:
    data = tmp_path / "labels.jsonl"
    data.write_text(
        '{"id": "a", "k": 2, "correct": 1, "c": 0.5}\n{"id": "b", "k": 2, "correct": 5, "c": 0.5}\n'
    )
    result = runner.invoke(
        app,
        [
            "policy",
            "calibrate",
            "--data",
            str(data),
            "--confidence",
            "c",
            "--risk",
            "0.1",
            "--out",
            str(tmp_path / "x.yaml"),
        ],
    )
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {data}:2: field 'correct': correct must be <= k")
