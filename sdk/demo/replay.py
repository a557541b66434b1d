"""``capgate demo``, replay part: a real 20B model's recorded answers through a calibrated policy.

No model runs here. The shipped file ``sdk/assets/math500_gpt-oss-20b_probe-math.jsonl`` (see its
README) holds, for each of the 500 MATH-500 test questions, the paper's Probe-MATH capability
estimate for gpt-oss-20b and how many of 100 answers sampled from it were graded correct (µ̂).

:func:`replay_math500` splits the questions in two halves (seeded), runs ``capgate policy
calibrate`` (:func:`capgate.cli.policy_cmd.calibrate_cmd` itself, with its defaults:
Learn-then-Test, binomial p-value, delta 0.05) on the first for a selective risk of ``risk``, then
decides every question of the other half with the written policy and scores the decisions
against the recorded answers:

* coverage (answered / questions) and the accuracy of what is answered (the mean µ̂ of answered
  questions: the chance one sampled answer is right) against answering everything (the mean µ̂
  of all), with Wilson intervals (for a mean of fractional µ̂ that interval is conservative);
  the expected wrong answers (one sampled answer per question: the sum of 1 - µ̂) given without
  the gate, given with it and stopped by it, and the expected right answers it stopped;
* the samples a pass@k budget saves: spending k samples on every question (N·k samples) reaches
  an expected pass rate S (:func:`capgate.metrics.expected_success` on the recorded 100-sample
  pools); :func:`capgate.metrics.greedy_allocation`, spending where the probe's p says a sample
  helps most, reaches S with fewer; the smallest such budget is found by bisection (greedy
  budgets are nested, so S grows with the budget).
"""

from __future__ import annotations

import bisect
import contextlib
import io
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from capgate._util.jsonl import json_ready, open_text
from capgate.assets import MATH500_GPT_OSS_20B
from capgate.decision.analysis.report import Rate, wilson

__all__ = [
    "REPLAY_CONFIDENCE",
    "REPLAY_DATA",
    "PassAtKSaving",
    "ReplayReport",
    "replay_math500",
]

REPLAY_DATA = MATH500_GPT_OSS_20B
"""The MATH-500 × gpt-oss-20b file shipped inside the package (``capgate/assets``)."""
REPLAY_CONFIDENCE = "probe_conf_raw"
"""Its field holding the Probe-MATH estimate."""


@dataclass(frozen=True)
class PassAtKSaving:
    """Samples a pass@k budget saves on the scored half.

    Attributes:
        k: Samples per question of the uniform budget.
        uniform_samples: N·k.
        uniform_success: Its expected pass rate on the recorded pools.
        greedy_samples: The fewest samples the probe-guided greedy allocation needs to reach it.
        greedy_success: The expected pass rate of that allocation.
        saved: ``uniform_samples - greedy_samples``.
    """

    k: int
    uniform_samples: int
    uniform_success: float
    greedy_samples: int
    greedy_success: float
    saved: int


@dataclass
class ReplayReport:
    """The replay's figures (see the module docstring)."""

    data: str
    questions: int
    calibration_questions: int
    scored_questions: int
    risk: float
    delta: float
    threshold: float
    policy_yaml: str
    calibration: dict[str, Any]
    answered: int
    coverage: Rate | None
    accuracy_answered: Rate | None
    accuracy_all: Rate | None
    wrong_all: float
    wrong_answered: float
    wrong_stopped: float
    right_stopped: float
    passk: list[PassAtKSaving]
    seed: int
    p: NDArray[np.float64] = field(repr=False, default_factory=lambda: np.zeros(0))
    mu_hat: NDArray[np.float64] = field(repr=False, default_factory=lambda: np.zeros(0))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data (without the per-question arrays)."""
        out: dict[str, Any] = json_ready({k: v for k, v in vars(self).items() if k not in ("p", "mu_hat")})
        out["calibration"] = {k: v for k, v in self.calibration.items() if k != "out"}  # a temporary file
        out["part"] = "replay"
        out["model"] = "gpt-oss-20b (recorded: 100 sampled answers per question)"
        out["estimates"] = "Probe-MATH (recorded, the paper's)"
        return out


def _calibrate(lines: list[str], *, risk: float, workdir: Path) -> tuple[dict[str, Any], Path]:
    """Run ``capgate policy calibrate`` on ``lines`` (JSONL); its JSON summary and the policy path."""
    import typer

    from capgate.cli.policy_cmd import calibrate_cmd

    data = workdir / "calibration_half.jsonl"
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = workdir / "math500_calibrated.yaml"
    stdout, stderr = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            calibrate_cmd(
                data=data,
                confidence=REPLAY_CONFIDENCE,
                risk=risk,
                out=out,
                as_json=True,
                name="math500-replay",
            )
    except typer.Exit as exc:
        raise ValueError(
            f"capgate policy calibrate failed (exit {exc.exit_code}): {stderr.getvalue().strip()}"
        ) from None
    return json.loads(stdout.getvalue()), out


def _fewest_samples(p: NDArray[np.float64], n: NDArray[np.int64], c: NDArray[np.int64], target: float) -> int:
    """The smallest budget whose greedy allocation's expected success reaches ``target``."""
    from capgate.metrics import expected_success, greedy_allocation

    def reaches(budget: int) -> bool:
        return expected_success(greedy_allocation(p, budget, max_per_query=n), n, c) >= target - 1e-12

    # The smallest budget below n.sum() that reaches the target, else n.sum() (every pool in full).
    return bisect.bisect_left(range(int(n.sum())), True, key=reaches)


def replay_math500(
    path: str | Path = REPLAY_DATA,
    *,
    risk: float = 0.1,
    seed: int = 0,
    ks: tuple[int, ...] = (4, 16),
    workdir: str | Path | None = None,
) -> ReplayReport:
    """Calibrate on half of the MATH-500 file, score the other half (see the module docstring).

    Args:
        path: The labelled JSONL (the shipped file by default).
        risk: The selective risk the policy is calibrated for (``--risk``).
        seed: Seed of the split into halves.
        ks: Uniform budgets (samples per question) whose saving to report.
        workdir: Where the calibration half and the policy are written (a temporary folder if None).

    Raises:
        DataError: The file is missing or malformed (naming file, line and field).
        ValueError: Calibration certified no threshold.
    """
    from capgate import Estimate
    from capgate.labels.labelled import read_labelled
    from capgate.metrics import expected_success, greedy_allocation, uniform_allocation
    from capgate.policies import load_policy

    path = Path(path)
    labels = read_labelled(path, confidence=[REPLAY_CONFIDENCE])
    with open_text(path) as handle:  # lines as read_labelled reads them (not str.splitlines: U+2028)
        lines = [line.rstrip("\n") for line in handle if line.strip()]
    if len(lines) != len(labels.ids):  # pragma: no cover - read_labelled reads one record a line
        raise ValueError(f"{path}: {len(lines)} lines but {len(labels.ids)} records")
    order = np.random.default_rng(seed).permutation(len(lines))
    half = len(lines) // 2
    calib, scored = np.sort(order[:half]), np.sort(order[half:])
    with contextlib.ExitStack() as stack:
        folder = (
            Path(workdir) if workdir is not None else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        )
        folder.mkdir(parents=True, exist_ok=True)
        summary, policy_path = _calibrate([lines[i] for i in calib], risk=risk, workdir=folder)
        policy_yaml = policy_path.read_text(encoding="utf-8")
        policy = load_policy(policy_path)
    p = labels.confidences[REPLAY_CONFIDENCE][scored]
    n, c = labels.k[scored], labels.correct[scored]
    mu = c / n
    actions = [policy.decide(Estimate(p=float(x), method="probe-math")).action for x in p]
    answered = np.array([a == "answer" for a in actions])
    passk = []
    for k in ks:
        uniform = uniform_allocation(len(p), len(p) * k, max_per_query=n)
        target = expected_success(uniform, n, c)
        fewest = _fewest_samples(p, n, c, target)
        reached = expected_success(greedy_allocation(p, fewest, max_per_query=n), n, c)
        passk.append(
            PassAtKSaving(k, int(uniform.sum()), target, fewest, reached, int(uniform.sum()) - fewest)
        )
    return ReplayReport(
        data=str(path),
        questions=len(lines),
        calibration_questions=int(calib.size),
        scored_questions=int(scored.size),
        risk=risk,
        delta=float(summary["delta"]),
        threshold=float(summary["threshold"]),
        policy_yaml=policy_yaml,
        calibration=summary,
        answered=int(answered.sum()),
        coverage=wilson(float(answered.sum()), len(p)),
        accuracy_answered=wilson(float(mu[answered].sum()), int(answered.sum())),
        accuracy_all=wilson(float(mu.sum()), len(p)),
        wrong_all=float((1.0 - mu).sum()),
        wrong_answered=float((1.0 - mu[answered]).sum()),
        wrong_stopped=float((1.0 - mu[~answered]).sum()),
        right_stopped=float(mu[~answered].sum()),
        passk=passk,
        seed=seed,
        p=p,
        mu_hat=mu,
    )
