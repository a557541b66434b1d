"""Calibrate your own model: harvest labels → fit a probe → evaluate it → calibrate a policy.

The whole workflow on a small scale, with the commands a user runs (``capgate harvest``,
``capgate probe featurize / fit / eval``, ``capgate policy calibrate``). The probe has a *reader*
(``--model``: the local model whose hidden states are its features; the embedded
SmolLM2-135M-Instruct by default, any HF folder or hub id works the same way) and a *target* (the
model whose capability it predicts: the reader itself by default, or, with ``--target-url`` and
``--target-model``, any OpenAI-compatible server — a hosted model whose hidden states nobody can
read; this is a *proxy probe*):

1. sample k answers per question and grade them (µ̂ = correct / k);
2. extract hidden-state features and fit a linear probe on a train split;
3. print the held-out calibration table (probe vs uniform vs constant prior);
4. score the held-out questions with the probe and pick, with a risk guarantee, the threshold
   above which the policy answers;
5. with a target server: gate calls to the target with the probe (``target=`` the served model):
   the estimates read only the local reader, so the gate makes no extra call to the target, and a
   gate for another model is refused.

At this toy scale (default 32 questions, k = 4) the numbers are noisy and the calibration step
may decline to certify any threshold: that is the guarantee working. Scale ``--questions`` and
``-k`` up for real use (``bench/probe_smollm2.py`` is the full-size version).

Run: .venv/bin/python examples/calibrate_your_model.py [--model default] [--work DIR]
     [--target-url http://127.0.0.1:8000/v1 --target-model NAME]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path


def capgate(*args: str) -> subprocess.CompletedProcess[str]:
    """Run a capgate command, echoing it, and return the finished process."""
    print(f"\n$ capgate {' '.join(args)}", flush=True)
    done = subprocess.run(
        [sys.executable, "-m", "capgate.cli", *args], text=True, capture_output=True, check=False
    )
    print(done.stdout, end="")
    if done.returncode not in (0, 1):
        print(done.stderr, end="", file=sys.stderr)
        raise SystemExit(done.returncode)
    return done


def split_file(labels: Path, train: Path, test: Path) -> None:
    """70/30 split; each part keeps the harvest's settings file (the labels' target)."""
    from capgate.labels.harvesting import meta_path

    lines = [line for line in labels.read_text(encoding="utf-8").splitlines() if line.strip()]
    cut = int(len(lines) * 0.7)
    for part, rows in ((train, lines[:cut]), (test, lines[cut:])):
        part.write_text("\n".join(rows) + "\n", encoding="utf-8")
        meta_path(part).write_text(meta_path(labels).read_text(encoding="utf-8"), encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="default")
    parser.add_argument("--questions", type=int, default=32)
    parser.add_argument("-k", type=int, default=4)
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--target-url", default=None, help="OpenAI-compatible server of the target")
    parser.add_argument("--target-model", default=None, help="the target's served model name")
    args = parser.parse_args(argv)
    if (args.target_url is None) != (args.target_model is None):
        parser.error("--target-url and --target-model go together")
    source = (
        ["--model", args.model]
        if args.target_url is None
        else ["--base-url", args.target_url, "--served-model", args.target_model]
    )
    work = args.work or Path(tempfile.mkdtemp(prefix="capgate-calibrate-"))
    work.mkdir(parents=True, exist_ok=True)
    labels = work / "labels.jsonl"

    # 1. Labels: k graded samples per question (resumable: rerun to continue a killed run).
    capgate("harvest", "basic_arithmetic:easy", "--limit", str(args.questions), "-k", str(args.k),
            "--max-tokens", "16", "--temperature", "0.7", *source,
            "--out", str(labels), "--no-progress")  # fmt: skip
    train, test = work / "train.jsonl", work / "test.jsonl"
    split_file(labels, train, test)

    # 2. Features and probe (features are cached in .npz files keyed by query id).
    for part in (train, test):
        capgate("probe", "featurize", "--labels", str(part), "--out", str(part.with_suffix(".npz")),
                "--model", args.model)  # fmt: skip
    probe = work / "probe"
    capgate("probe", "fit", "--labels", str(train), "--features", str(train.with_suffix(".npz")),
            "--out", str(probe), "--lr", "1e-3", "--seed", "0")  # fmt: skip

    # 3. Held-out table with the baselines beside the probe.
    capgate(
        "probe",
        "eval",
        "--probe",
        str(probe),
        "--labels",
        str(test),
        "--features",
        str(test.with_suffix(".npz")),
    )

    # 4. Score held-out questions with the probe, then calibrate the answer threshold.
    import capgate as cg

    estimator = cg.load_estimator(args.model, probe=probe)
    rows = [json.loads(line) for line in test.read_text(encoding="utf-8").splitlines() if line.strip()]
    estimates = estimator.estimate([row["prompt"] for row in rows])
    scored = work / "test_scored.jsonl"
    with scored.open("w", encoding="utf-8") as handle:
        for row, estimate in zip(rows, estimates, strict=True):
            handle.write(json.dumps({**row, "probe": estimate.p}) + "\n")
    policy_out = str(work / "policy.yaml")
    result = capgate("policy", "calibrate", "--data", str(scored), "--confidence", "probe", "--risk", "0.8",
                     "--delta", "0.1", "--policy", "balanced", "--out", policy_out)  # fmt: skip
    if result.returncode == 1:
        print("no threshold certified at this scale: harvest more questions (the guarantee needs data)")
    else:
        print(f"calibrated policy written to {work / 'policy.yaml'}")
    if args.target_url is not None:
        gate_calls_to_the_target(estimator, args.target_url, args.target_model, rows)
    print(f"workflow files in {work}")


def gate_calls_to_the_target(estimator: object, url: str, served: str, rows: list[dict[str, object]]) -> None:
    """Step 5: the proxy probe gates calls to the remote target; estimating costs it nothing."""
    import capgate as cg
    from capgate.adapters.backends.openai import OpenAIBackend

    target = OpenAIBackend(served, base_url=url, api_key="EMPTY")
    calls: list[str] = []

    @cg.guard(policy="balanced", estimator=estimator, target=served)
    def ask(prompt: str) -> str:
        calls.append(prompt)
        [[answer]] = target.generate([prompt], cg.SamplingParams(max_tokens=16, temperature=0.7))
        return answer.text

    for row in rows[:4]:
        ask(str(row["prompt"]))
        decision = ask.stats.last_decision
        assert decision is not None
        print(f"gated call to {decision.target}: p={decision.estimate.p:.3f} -> {decision.action}")
    drawn = ask.stats.actions["answer"] + ask.stats.samples  # an answer calls once; resample draws
    print(f"calls to the target: {len(calls)}; drawn by the decisions: {drawn}; by the estimates: 0")
    try:
        cg.Gate(estimator=estimator, target="another-model")  # type: ignore[arg-type]
    except cg.SettingsError as refused:
        print(f"a gate for another model is refused: {str(refused)[:80]}...")


if __name__ == "__main__":
    main()
