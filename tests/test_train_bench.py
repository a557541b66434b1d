"""``bench/c3rl.py --smoke``: every phase of the C3RL bench (labels, training, test pools, report) runs
in seconds on the tiny random-weight model and prints the bench's last line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import trl  # noqa: F401  - the train extra (trl, peft), installed by scripts/setup.sh: a missing one fails, never skips

ROOT = Path(__file__).resolve().parents[1]


def test_the_c3rl_bench_smoke_run_prints_its_last_line(tiny_model_dir: Path, tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "c3rl.py"), "--smoke", "--model", str(tiny_model_dir),
         "--data", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    tail = (done.stdout + done.stderr)[-4000:]
    assert done.returncode == 0, tail
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("c3rl: tag rate 0.00 -> "), tail
    assert "AUROC" in last
    assert "accuracy" in last
    assert (tmp_path / "run" / "manifest.json").is_file()
    assert (tmp_path / "test_trained.jsonl").is_file()
