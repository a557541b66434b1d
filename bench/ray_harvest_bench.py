"""Harvest throughput on Ray: samples/s with 1 and 2 Ray workers against one vLLM server, and the
local (one-process) harvest as the baseline.

The server is the CI's (``bash scripts/with-vllm-server.sh .venv/bin/python bench/ray_harvest_bench.py``
exports CAPGATE_TEST_VLLM_URL / CAPGATE_TEST_VLLM_MODEL; or pass --base-url / --served-model).
Each run labels the same ``--queries`` synthetic additions ("What is a + b?", numeric grading)
into a fresh file, k samples each, ``--batch-size`` queries per request; Ray runs on a local
instance started here (``--num-cpus``, workers reserve no CPU: they only call the server). The
time of a run is wall clock from the first request to the last fsync (Ray start-up excluded:
``HarvestReport.elapsed_s``). One server serves every worker, so more workers only mean more
requests in flight at once, which the server batches; a real scale-out gives each worker its own
replica (``--base-url URL1,URL2``).
Run: ``python bench/ray_harvest_bench.py [--queries 24] [-k 8] [--max-tokens 32]``. ``--smoke``: 4
queries x k=2, local and one Ray worker, against the test suite's server if it is set, else an
in-process fake one (the test suite runs it).
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import tempfile
from pathlib import Path

from capgate.cli.harvest_cmd import worker_backend
from capgate.datasets import DatasetItem
from capgate.labels.harvest_ray import ray_harvest
from capgate.labels.harvesting import harvest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base-url", default=os.environ.get("CAPGATE_TEST_VLLM_URL"))
    parser.add_argument("--served-model", default=os.environ.get("CAPGATE_TEST_VLLM_MODEL"))
    parser.add_argument("--queries", type=int, default=24)
    parser.add_argument("-k", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--num-cpus", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="seconds, 1 Ray worker (a test runs it)")
    args = parser.parse_args()
    if args.smoke:
        from _smoke import openai_server

        args.queries, args.k, args.max_tokens, args.num_cpus = 4, 2, 8, 1
        with openai_server(args.base_url, args.served_model) as (args.base_url, args.served_model):
            run(args, [("local (no Ray)", 0), ("Ray, 1 worker", 1)])
        return
    if not args.base_url or not args.served_model:
        raise SystemExit("give --base-url and --served-model, or run under scripts/with-vllm-server.sh")
    run(args, [("local (no Ray)", 0), ("Ray, 1 worker", 1), ("Ray, 2 workers", 2)])


def run(args: argparse.Namespace, runs: list[tuple[str, int]]) -> None:
    import ray

    items = [
        DatasetItem(
            id=f"q{i:03d}",
            question=f"What is {i} + {2 * i + 3}?",
            references=[str(3 * i + 3)],
            kind="numeric",
        )
        for i in range(args.queries)
    ]
    settings = {"max_tokens": args.max_tokens, "seed": 0, "batch_size": args.batch_size, "progress": False}
    target = ("default", None, "auto", "auto", [args.base_url], args.served_model, None)
    make = functools.partial(worker_backend, *target)
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(
        f"server: {args.served_model} at {args.base_url}; {args.queries} queries x k={args.k}, "
        f"max_tokens={args.max_tokens}, {args.batch_size} queries per request\n"
    )
    print(f"{'run':>16} {'samples':>8} {'seconds':>8} {'samples/s':>10} {'correct':>8}")
    ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    with tempfile.TemporaryDirectory() as tmp:
        for name, workers in runs:
            out = Path(tmp) / f"labels_{workers}.jsonl"
            if workers == 0:
                report = harvest(make(0), items, out, k=args.k, **settings)
            else:
                report = ray_harvest(
                    make, items, out, k=args.k, workers=workers, cpus_per_worker=0, **settings
                )
            accuracy = report.n_correct / report.n_samples
            print(
                f"{name:>16} {report.n_samples:>8} {report.elapsed_s:>8.2f} "
                f"{report.samples_per_s:>10.1f} {accuracy:>8.3f}"
            )
    ray.shutdown()


if __name__ == "__main__":
    main()
