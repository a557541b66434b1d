"""Command-line errors name what the user typed: an option refused under its own name (not the
library parameter it feeds), and ``policy calibrate --policy`` refusing the options of a new policy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from capgate.policies import load_policy

runner = CliRunner()
FEATURIZER = "_probe_helpers:CharCountFeaturizer"


@pytest.fixture
def labels(tmp_path: Path) -> Path:
    """40 labelled queries with a question and a confidence ``conf``, all answered right."""
    path = tmp_path / "labels.jsonl"
    rows = [
        {"id": f"q{i}", "question": f"what is {i} + {i}?", "k": 2, "correct": 2, "conf": 0.9}
        for i in range(40)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def invoke(*args: str | Path) -> tuple[int, str]:
    from capgate.cli import app

    result = runner.invoke(app, [str(arg) for arg in args])
    return result.exit_code, result.stderr


CALIBRATE = ("policy", "calibrate", "--data", "{labels}", "--confidence", "conf", "--out", "{out}")
FIT = ("probe", "fit", "--labels", "{labels}", "--out", "{out}", "--featurizer", FEATURIZER)
NAMED = {
    "--risk": ([*CALIBRATE, "--risk", "0"], "`--risk` must be a number in (0, 1); got 0.0"),
    "--delta": (
        [*CALIBRATE, "--risk", "0.2", "--delta", "1"],
        "`--delta` must be a number in (0, 1); got 1.0",
    ),
    "--min-answered": (
        [*CALIBRATE, "--risk", "0.2", "--min-answered", "0"],
        "`--min-answered` must be a positive integer; got 0",
    ),
    "--grid": ([*CALIBRATE, "--risk", "0.2", "--grid", "1"], "`--grid` must be an integer >= 2; got 1"),
    "--start": (
        [*CALIBRATE, "--risk", "0.2", "--procedure", "fixed-sequence", "--start", "1.5"],
        "`--start` must be a number in [0, 1]; got 1.5",
    ),
    "demo --risk": (
        ["demo", "--no-live", "--no-verbalized", "--risk", "1.5"],
        "`--risk` must be a number in (0, 1); got 1.5",
    ),
    "--z-threshold": (
        ["monitor", "--db", "{out}", "--z-threshold", "0"],
        "`--z-threshold` must be a positive number; got 0.0",
    ),
    "--validation-fraction": (
        [*FIT, "--validation-fraction", "1"],
        "`--validation-fraction` must be a number in (0, 1); got 1.0",
    ),
    "--max-epochs": ([*FIT, "--max-epochs", "0"], "`--max-epochs` must be a positive integer; got 0"),
    "--patience": ([*FIT, "--patience", "0"], "`--patience` must be a positive integer; got 0"),
    "--seed": ([*FIT, "--seed", "-1"], "`--seed` must be an integer >= 0; got -1"),
    "--lr": ([*FIT, "--lr", "inf"], "--lr must be 'sweep' or positive numbers; got 'inf'"),
}


@pytest.mark.parametrize("case", sorted(NAMED))
def test_a_bad_option_is_refused_under_the_name_typed(case: str, labels: Path, tmp_path: Path) -> None:
    """Not under the library's parameter (``alpha``, ``z_threshold``, ``validation_fraction``...)."""
    args, message = NAMED[case]
    out = tmp_path / "out"
    code, stderr = invoke(*(arg.format(labels=labels, out=out) for arg in args))
    assert (code, stderr) == (2, f"error: {message}\n")
    assert not out.exists()


@pytest.mark.parametrize(
    ("given", "options"),
    [
        (["--name", "mine"], "--name is"),
        (["--name", "mine", "--below", "escalate"], "--name and --below are"),
    ],
)
def test_policy_calibrate_refuses_the_options_of_a_new_policy_with_policy(
    given: list[str], options: str, labels: Path, tmp_path: Path
) -> None:
    """--name and --below shape the policy made without --policy: with it they were dropped silently
    (the calibrated copy kept the preset's name, so reports grouped it with the preset)."""
    out = tmp_path / "p.yaml"
    args = ["policy", "calibrate", "--data", labels, "--confidence", "conf", "--risk", "0.1", "--out", out]
    code, stderr = invoke(*args, "--policy", "balanced", *given)
    assert code == 2
    assert stderr == (
        f"error: {options} for a new policy (without --policy); the --policy policy keeps its own name "
        "and bands\n"
    )
    assert not out.exists()
    code, stderr = invoke(*args, *given)  # without --policy they make the new policy
    assert code == 0, stderr
    made = load_policy(out)
    assert made.name == "mine"
    assert made.on_degraded.action == ("escalate" if "--below" in given else "abstain")
