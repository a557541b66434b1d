"""Every bench runs: each script in ``bench/`` has a ``--smoke`` mode (its own code path, in seconds,
on tiny or synthetic data, writing only under a temporary folder) and this file runs each one as a
subprocess, so a change that breaks a bench fails the suite instead of rotting until someone
reruns it. ``bench/_smoke.py`` holds what the smoke runs share (the temporary folder, the tiny model).

The smoke runs start together when the first of them is checked, two at a time (most of a run is
importing, loading and waiting on its own servers and time-outs), slowest first; each test then
checks its own run. The tiny model and a probe fitted for it are built once and shared.

A bench that needs an optional service (PostgreSQL, the CPU vLLM server, Ray, a peer library's
venv) smokes what runs without it and says in its output what it left out; under the README's
test command (``scripts/with-vllm-server.sh``) the services' variables reach the smoke runs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
HELPERS = {"_cache.py", "_pg_server.py", "_report.py", "_smoke.py"}


@dataclass(frozen=True)
class Smoke:
    """How one bench's smoke run is checked: what its table's header prints, and its limits."""

    header: str
    args: tuple[str, ...] = ("--smoke",)
    timeout_s: float = 90.0
    model: bool = False  # gets the session's tiny random-weight model (CAPGATE_BENCH_TINY_MODEL)


@dataclass(frozen=True)
class RunBy:
    """A bench file whose code a smoke run elsewhere takes: a module another bench imports, or a
    bench whose own test file runs its ``--smoke`` (not run a second time here)."""

    by: str
    needle: str  # a regular expression that file matches, showing that it runs this one


SMOKES: dict[str, Smoke | RunBy] = {
    # tests/test_train_bench.py runs c3rl's --smoke (the slowest, ~1 min): once is enough.
    "c3rl.py": RunBy("tests/test_train_bench.py", r'"c3rl\.py"\)?,\s*"--smoke"'),
    "cas_bench.py": Smoke("CAS fresh pools:"),
    "features_bench.py": Smoke("samples/s", model=True),
    "probe_speed.py": Smoke("probe speed:", model=True),
    "probe_smollm2.py": Smoke("Held-out capability calibration", model=True),
    "proxy_probe_math500.py": Smoke("proxy MATH-500: Brier", timeout_s=180.0, model=True),
    "cas_fresh_pools.py": Smoke("first pool:"),
    "learn_from_traffic.py": Smoke("learn: after 100 outcomes"),
    "overhead_bench.py": Smoke("overhead: local", model=True),
    "probe_lr.py": Smoke("Brier/µ̂"),
    "ray_harvest_bench.py": Smoke("Ray, 1 worker"),
    "train_claim_detector.py": Smoke("train positives caught"),
    "injection_families.py": RunBy("bench/injection_bench.py", "from injection_families import"),
    "peers_table.py": RunBy("bench/peers_bench.py", "from peers_table import"),
    "_loop_watch.py": RunBy("bench/load_bench.py", "from _loop_watch import"),
    "default_probe_v2.py": Smoke("beats the shipped probe in capability Brier", timeout_s=180.0, model=True),
    "estimators_smollm2.py": Smoke("paper's Brier ordering on Qwen3-8B", model=True),
    "injection_bench.py": Smoke("forward passes of the reader model this run", model=True),
    "load_bench.py": Smoke("reliability: ", timeout_s=150.0, model=True),
    "log_outage_bench.py": Smoke("lost 0", timeout_s=120.0),
    "peers_bench.py": Smoke("peers: no headline (no peer row", model=True),
    "vllm_hidden_states_bench.py": Smoke("features vs transformers", model=True),
    "datasets_grading_bench.py": Smoke("grader, data"),
    "decision_log_bench.py": Smoke("decisions/s"),
    "decision_ids_bench.py": Smoke("ids: 32 on a loop beside 2 busy threads"),
    "features_log_bench.py": Smoke("1/call rows/s"),
    "fuzz_bench.py": Smoke("fuzz: 30 cases, 0 unexpected"),
    "learn_selection.py": Smoke("selection: false replacement"),
    "metrics_bench.py": Smoke("rows/s"),
    "report_bench.py": Smoke("report/read"),
    "risk_control_bench.py": Smoke("p-value / loss / procedure"),
    "telemetry_bench.py": Smoke("telemetry: no-otel"),
}

RUNS = sorted(name for name, smoke in SMOKES.items() if isinstance(smoke, Smoke))
# Started first, so that two at a time end close together (the slowest measured, slowest first).
SLOWEST = (
    "default_probe_v2.py",
    "load_bench.py",
    "overhead_bench.py",
    "injection_bench.py",
    "estimators_smollm2.py",
    "ray_harvest_bench.py",
    "probe_smollm2.py",
    "features_bench.py",
)
AT_ONCE = 2


def test_every_bench_has_a_smoke_run() -> None:
    benches = {path.name for path in BENCH.glob("*.py")} - HELPERS
    missing = sorted(benches - set(SMOKES))
    assert not missing, f"benches without a smoke entry in {Path(__file__).name}: {missing}"
    gone = sorted(set(SMOKES) - benches)
    assert not gone, f"smoke entries for benches that no longer exist: {gone}"


@pytest.mark.parametrize("name", sorted(n for n, s in SMOKES.items() if isinstance(s, RunBy)))
def test_a_bench_run_elsewhere_is_run_there(name: str) -> None:
    smoke = SMOKES[name]
    assert isinstance(smoke, RunBy)
    root = BENCH.parent
    text = (root / smoke.by).read_text(encoding="utf-8")
    assert re.search(smoke.needle, text), f"{smoke.by} no longer runs {name} ({smoke.needle!r} not in it)"


@pytest.fixture(scope="module")
def smoke_env(request: pytest.FixtureRequest) -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BENCH), env.get("PYTHONPATH", "")) if p)
    # A smoke run checks the bench's own code, not the server: every remote path talks to the
    # in-process fake server (bench/_smoke.py), even when the suite runs beside the CPU vLLM one,
    # whose free-text answers under CI load took the overhead and load smokes past their limits.
    for name in ("CAPGATE_TEST_VLLM_URL", "CAPGATE_TEST_VLLM_MODEL"):
        env.pop(name, None)
    return env


def _smoke_run(name: str, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
    smoke = SMOKES[name]
    assert isinstance(smoke, Smoke)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, str(BENCH / name), *smoke.args],
        cwd=BENCH.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=smoke.timeout_s,
        check=False,
    )
    return done, time.perf_counter() - start


@pytest.fixture(scope="module")
def smoke_runs(
    smoke_env: dict[str, str], request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Future[tuple[subprocess.CompletedProcess[str], float]]]]:
    """Every selected smoke run, started at once, ``AT_ONCE`` at a time."""
    chosen = {
        item.callspec.params["name"]
        for item in request.session.items
        if getattr(item, "originalname", "") == "test_the_bench_smoke_run_passes"
        and hasattr(item, "callspec")
    }
    names = [n for n in SLOWEST if n in chosen] + sorted(chosen - set(SLOWEST))
    with_model = dict(smoke_env)
    if any(SMOKES[n].model for n in names):  # type: ignore[union-attr]
        model = request.getfixturevalue("tiny_model_dir")
        sys.path.insert(0, str(BENCH))
        try:
            from _smoke import tiny_probe
        finally:
            sys.path.remove(str(BENCH))
        probe = tiny_probe(model, tmp_path_factory.mktemp("smoke-probe"))
        with_model.update(CAPGATE_BENCH_TINY_MODEL=str(model), CAPGATE_BENCH_TINY_PROBE=str(probe))
    pool = ThreadPoolExecutor(max_workers=AT_ONCE, thread_name_prefix="smoke")
    try:
        yield {
            n: pool.submit(_smoke_run, n, with_model if SMOKES[n].model else smoke_env)  # type: ignore[union-attr]
            for n in names
        }
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.parametrize("name", RUNS)
def test_the_bench_smoke_run_passes(
    name: str, smoke_runs: dict[str, Future[tuple[subprocess.CompletedProcess[str], float]]]
) -> None:
    smoke = SMOKES[name]
    assert isinstance(smoke, Smoke)
    done, took = smoke_runs[name].result()
    print(f"{name} --smoke: {took:.1f} s")
    tail = (done.stdout + done.stderr)[-4000:]
    assert done.returncode == 0, f"{name} --smoke exited {done.returncode} after {took:.1f} s:\n{tail}"
    assert smoke.header in done.stdout, f"{name} --smoke did not print {smoke.header!r}:\n{tail}"
