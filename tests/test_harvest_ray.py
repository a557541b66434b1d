"""``capgate harvest --ray``: a harvest spread over a local Ray instance (2 CPUs) whose workers each
hold an OpenAI-compatible backend on the CI vLLM server (scripts/with-vllm-server.sh), or load the
embedded model themselves (a local model per worker).

Without the server these tests fail under CI (env CI set) and are skipped, with that reason,
elsewhere. Workers are killed for real (SIGKILL to the worker's process), and so is a driver.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _ci_server import ci_vllm_server
from typer.testing import CliRunner

from capgate import LabelledQuery
from capgate.cli import app
from capgate.datasets import DatasetItem, write_dataset
from capgate.labels.harvesting import harvest, meta_path

pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parent
SETTINGS = {"temperature": 1.0, "max_tokens": 12, "seed": 7, "batch_size": 1, "progress": False}


def items(n: int) -> list[DatasetItem]:
    return [
        DatasetItem(
            id=f"q{i:02d}", question=f"What is {i} + {i + 2}?", references=[str(2 * i + 2)], kind="numeric"
        )
        for i in range(n)
    ]


def lines(path: Path) -> list[LabelledQuery]:
    return [LabelledQuery.model_validate_json(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def server() -> tuple[str, str]:
    return ci_vllm_server()


@pytest.fixture(scope="module")
def ray_local() -> Iterator[str]:
    """A local Ray instance with 2 CPUs; its workers can import tests/_ray_workers.py."""
    import ray

    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": path}},
    )
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def factory(server: tuple[str, str], pid_dir: Path, worker: str = "vllm_worker") -> functools.partial[object]:
    """``tests/_ray_workers.<worker>`` bound to the CI server, noting worker pids in ``pid_dir``."""
    import _ray_workers

    pid_dir.mkdir(exist_ok=True)
    return functools.partial(getattr(_ray_workers, worker), server[0], server[1], str(pid_dir))


def harvest_killing_worker_0(make: functools.partial[object], out: Path, pids: Path, workers: int) -> object:
    """Harvest 12 queries on Ray and SIGKILL worker 0's process once two records are written;
    returns the harvest's report, or the exception it raised."""
    from capgate.labels.harvest_ray import ray_harvest

    done: list[object] = []

    def run() -> None:
        try:
            done.append(ray_harvest(make, items(12), out, k=4, workers=workers, **SETTINGS))
        except BaseException as exc:
            done.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (out.exists() and len(out.read_text().splitlines()) >= 2):
        time.sleep(0.05)
    assert not done, done  # still running when the worker is killed
    victims = [p for p in pids.iterdir() if p.name.startswith("0.")]
    assert len(victims) == 1
    os.kill(int(victims[0].name.split(".")[1]), signal.SIGKILL)
    thread.join(timeout=600)
    (result,) = done
    return result


def test_a_ray_harvest_writes_the_resumable_labels_of_a_local_one(
    ray_local: str, server: tuple[str, str], tmp_path: Path
) -> None:
    from capgate.adapters.backends.openai import OpenAIBackend
    from capgate.labels.harvest_ray import ray_harvest

    out = tmp_path / "labels.jsonl"
    report = ray_harvest(factory(server, tmp_path / "pids"), items(6), out, k=4, workers=2, **SETTINGS)
    assert (report.workers, report.worker_failures, report.n_new, report.n_samples) == (2, 0, 6, 24)
    assert report.samples_per_s > 0
    got = lines(out)
    assert sorted(q.id for q in got) == [f"q{i:02d}" for i in range(6)]
    assert all(q.k == 4 and len(q.samples or []) == 4 for q in got)
    assert len(list((tmp_path / "pids").iterdir())) == 2  # one backend per worker
    meta = json.loads(meta_path(out).read_text())
    assert (meta["model_id"], meta["endpoint"], meta["base_url"]) == (server[1], "openai", server[0])
    # resuming on Ray samples only the new queries ...
    more = ray_harvest(factory(server, tmp_path / "pids2"), items(8), out, k=4, workers=2, **SETTINGS)
    assert (more.n_resumed, more.n_new) == (6, 2)
    # ... and a local harvest resumes the same file: nothing left to sample
    local = harvest(OpenAIBackend(server[1], base_url=server[0]), items(8), out, k=4, **SETTINGS)
    assert (local.n_resumed, local.n_new) == (8, 0)
    assert sorted(q.id for q in lines(out)) == [f"q{i:02d}" for i in range(8)]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_worker_killed_mid_run_loses_and_duplicates_nothing(
    ray_local: str, server: tuple[str, str], tmp_path: Path, workers: int
) -> None:
    from capgate.labels.harvest_ray import RayHarvestReport

    out, pids = tmp_path / "labels.jsonl", tmp_path / "pids"
    # the killed worker takes 5 s to come back: alone, the run waits for it; with another, that one
    # goes on meanwhile (and may finish the run before the restart is done)
    report = harvest_killing_worker_0(factory(server, pids, "slow_restart_worker"), out, pids, workers)
    assert isinstance(report, RayHarvestReport), report
    # its in-flight batches (at most in_flight=2) were lost and sampled again; none was thrown at it
    # while it restarted (Ray fails those at once: CI once counted 11 of them as lost)
    assert 1 <= report.worker_failures <= 2
    restarted = len([p for p in pids.iterdir() if p.name.startswith("0.")]) == 2
    assert restarted or workers > 1  # alone, it must have been restarted by Ray to finish
    ids = [q.id for q in lines(out)]
    assert sorted(ids) == [f"q{i:02d}" for i in range(12)]  # each query once: none lost, none twice
    assert report.n_new == 12


def test_when_every_worker_is_dead_for_good_the_run_stops_and_keeps_what_it_wrote(
    ray_local: str, server: tuple[str, str], tmp_path: Path
) -> None:
    from capgate.labels.harvest_ray import ray_harvest

    out, pids = tmp_path / "labels.jsonl", tmp_path / "pids"
    error = harvest_killing_worker_0(factory(server, pids, "broken_restart_worker"), out, pids, workers=1)
    assert isinstance(error, RuntimeError), error
    assert "every Ray worker died (1 of 1" in str(error)
    written = [q.id for q in lines(out)]
    assert 2 <= len(written) < 12
    assert len(set(written)) == len(written)
    # a rerun with a healthy worker resumes: only what is missing is sampled
    report = ray_harvest(factory(server, tmp_path / "pids2"), items(12), out, k=4, workers=1, **SETTINGS)
    assert (report.n_resumed, report.n_new) == (len(written), 12 - len(written))


def test_cli_ray_driver_killed_then_resumed(ray_local: str, server: tuple[str, str], tmp_path: Path) -> None:
    data = tmp_path / "q.jsonl"
    write_dataset(items(10), data)
    out = tmp_path / "labels.jsonl"
    args = [
        "harvest", str(data), "--out", str(out), "-k", "4", "--max-tokens", "12", "--seed", "7",
        "--batch-size", "1", "--no-progress", "--base-url", server[0], "--served-model", server[1],
        "--workers", "2", "--cpus-per-worker", "0",
    ]  # fmt: skip
    driver = subprocess.Popen(
        [sys.executable, "-m", "capgate.cli", *args, "--ray", "--ray-address", ray_local],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (out.exists() and len(out.read_text().splitlines()) >= 2):
        assert driver.poll() is None, driver.communicate()
        time.sleep(0.05)
    driver.send_signal(signal.SIGKILL)
    driver.wait(timeout=60)
    written = [q.id for q in lines(out)]
    assert 2 <= len(written) < 10
    result = CliRunner().invoke(app, [*args, "--ray"])  # joins the Ray of this process
    assert result.exit_code == 0, result.output
    assert f"({10 - len(written)} new, {len(written)} resumed)" in result.output
    assert "on 2 Ray workers" in result.output
    ids = [q.id for q in lines(out)]
    assert ids[: len(written)] == written  # what the killed driver wrote was kept, not resampled
    assert sorted(ids) == [f"q{i:02d}" for i in range(10)]


def test_cli_ray_with_a_local_model_per_worker_labels_as_a_local_harvest(
    ray_local: str, tmp_path: Path
) -> None:
    """No server: each Ray worker loads the embedded model itself (transformers on CPU)."""
    data = tmp_path / "q.jsonl"
    write_dataset(items(4), data)
    args = [
        "harvest", str(data), "-k", "2", "--max-tokens", "6", "--seed", "7", "--batch-size", "1",
        "--no-progress", "--model", "default", "--device", "cpu",
    ]  # fmt: skip
    on_ray = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "ray.jsonl"), "--ray", "--workers", "2"])
    assert on_ray.exit_code == 0, on_ray.output
    assert "(4 new, 0 resumed)" in on_ray.output
    assert "on 2 Ray workers (0 batches lost" in on_ray.output
    local = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "local.jsonl")])
    assert local.exit_code == 0, local.output
    by_id = {q.id: q for q in lines(tmp_path / "local.jsonl")}
    got = {q.id: q for q in lines(tmp_path / "ray.jsonl")}
    assert sorted(got) == sorted(by_id)
    # seeded per query: the same samples whichever process drew them (log-probabilities up to the
    # float rounding of another torch thread count)
    for i, q in got.items():
        theirs = by_id[i].samples or []
        assert [(s.answer, s.correct, s.n_tokens) for s in q.samples or []] == [
            (s.answer, s.correct, s.n_tokens) for s in theirs
        ]
        assert [s.mean_logprob for s in q.samples or []] == pytest.approx(
            [s.mean_logprob for s in theirs], abs=1e-5
        )
    meta = json.loads(meta_path(tmp_path / "ray.jsonl").read_text())
    assert meta["endpoint"] == json.loads(meta_path(tmp_path / "local.jsonl").read_text())["endpoint"]


def test_a_backend_that_fails_to_build_on_the_worker_is_one_error_line(
    ray_local: str, tmp_path: Path
) -> None:
    """No server: worker 0's backend raises as it is built. The run says why in one line and writes
    nothing (Ray's own error is the worker's whole traceback); so does the CLI, for a --backend that
    resolves in the driver but fails on the worker."""
    from capgate.errors import BackendError
    from capgate.labels.harvest_ray import ray_harvest

    def broken(index: int) -> object:
        raise ImportError("simulated: the backend module is broken")

    out = tmp_path / "labels.jsonl"
    with pytest.raises(BackendError) as info:
        ray_harvest(broken, items(2), out, k=2, workers=1, cpus_per_worker=0, **SETTINGS)
    assert str(info.value) == (
        "Ray worker 0 could not build its backend: ImportError: simulated: the backend module is broken"
    )
    assert not out.exists()
    data = write_dataset(items(2), tmp_path / "q.jsonl")
    args = ["harvest", str(data), "--out", str(out), "--backend", "json:loads", "-k", "2", "--no-progress",
            "--ray", "--workers", "1", "--cpus-per-worker", "0"]  # fmt: skip
    result = CliRunner().invoke(app, args)  # joins the Ray of this process
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("error: Ray worker 0 could not build its backend: ")
    assert "cannot call 'json:loads' without arguments" in result.stderr
    assert len(result.stderr.splitlines()) == 1
