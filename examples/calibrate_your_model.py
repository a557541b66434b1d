"""Calibrate your own model: harvest labels → fit a probe → evaluate it → calibrate a policy.

The whole workflow on a small scale, with the commands a user runs (``capgate harvest``,
``capgate probe featurize / fit / eval``, ``capgate policy calibrate``), on the local model
(the embedded SmolLM2-135M-Instruct by default; any HF folder or hub id works the same way):

1. sample k answers per question and grade them (µ̂ = correct / k);
2. extract hidden-state features and fit a linear probe on a train split;
3. print the held-out calibration table (probe vs uniform vs constant prior);
4. score the held-out questions with the probe and pick, with a risk guarantee, the threshold
   above which the policy answers.

At this toy scale (default 32 questions, k = 4) the numbers are noisy and the calibration step
may decline to certify any threshold: that is the guarantee working. Scale ``--questions`` and
``-k`` up for real use (``bench/probe_smollm2.py`` is the full-size version).

Run: .venv/bin/python examples/calibrate_your_model.py [--model default] [--work DIR]
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
    lines = [line for line in labels.read_text(encoding="utf-8").splitlines() if line.strip()]
    cut = int(len(lines) * 0.7)
    train.write_text("\n".join(lines[:cut]) + "\n", encoding="utf-8")
    test.write_text("\n".join(lines[cut:]) + "\n", encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="default")
    parser.add_argument("--questions", type=int, default=32)
    parser.add_argument("-k", type=int, default=4)
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="capgate-calibrate-"))
    work.mkdir(parents=True, exist_ok=True)
    labels = work / "labels.jsonl"

    # 1. Labels: k graded samples per question (resumable: rerun to continue a killed run).
    capgate("harvest", "basic_arithmetic:easy", "--limit", str(args.questions), "-k", str(args.k),
            "--max-tokens", "16", "--temperature", "0.7", "--seed", "0", "--model", args.model,
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
    print(f"workflow files in {work}")


if __name__ == "__main__":
    main()
