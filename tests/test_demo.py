"""`capgate demo`, the README's main job, end to end on the embedded model (no mocks)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from capgate.demo import DEMO_POLICY, demo_questions
from capgate.policies import load_policy


def test_demo_policy_is_valid_and_questions_are_held_out() -> None:
    policy = load_policy(DEMO_POLICY)
    assert policy.name == "demo-smollm2"
    questions = demo_questions(5, seed=0)
    assert len(questions) == 5
    assert len({q.item.id for q in questions}) == 5
    assert all(0.0 <= q.mu_hat <= 1.0 and q.prompt for q in questions)


@pytest.mark.slow
def test_capgate_demo_runs_end_to_end(default_model_dir: Path) -> None:
    env = dict(os.environ)
    result = subprocess.run(
        [sys.executable, "-m", "capgate.cli", "demo", "--questions", "4"],
        capture_output=True, text=True, env=env, timeout=900, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert out.count("p=") == 4
    for heading in ("coverage", "accuracy among answered", "samples spent", "cap. Brier"):
        assert heading in out
