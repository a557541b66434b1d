"""``bench/c3rl.py --smoke``: every phase of the C3RL bench (labels, training, test pools, report) runs
in seconds on the tiny random-weight model and prints the bench's last line."""

from __future__ import annotations

import json
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
         "--data", str(tmp_path), "--ship", str(tmp_path / "shipped")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    tail = (done.stdout + done.stderr)[-4000:]
    assert done.returncode == 0, tail
    lines = done.stdout.strip().splitlines()
    trained_line = next(line for line in lines if line.startswith("c3rl: "))
    assert trained_line.startswith("c3rl: tag rate 0.00 -> "), tail
    assert "AUROC" in trained_line
    assert "accuracy" in trained_line
    assert (tmp_path / "run" / "manifest.json").is_file()
    assert (tmp_path / "test_trained.jsonl").is_file()
    # --ship: the adapter as the package ships it, merged by capgate, with its own test pool
    assert "as shipped (float16 adapter, merged without PEFT):" in lines
    assert lines[-1].startswith("c3rl: tag rate 0.00 -> "), tail
    assert (tmp_path / "test_shipped.jsonl").is_file()
    from capgate.local.lora import read_provenance

    provenance = read_provenance(tmp_path / "shipped")
    assert provenance is not None
    assert provenance.c3rl is True
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert provenance.base_weights_fingerprint == manifest["base_weights_fingerprint"]
