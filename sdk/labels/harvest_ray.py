"""A harvest spread over a Ray cluster: workers that each hold a backend sample, one driver writes.

:func:`ray_harvest` runs the harvest of :func:`capgate.labels.harvesting.harvest`, writing the same
resumable JSON lines, with the sampling spread over Ray actors (extra ``ray``). Each worker builds
its backend once, from ``make_backend(worker_index)`` (an OpenAI-compatible endpoint per replica,
or a local model per worker). The driver hands the batches not yet written to idle workers
(``in_flight`` each), grades what comes back and appends it, fsynced, to the one output file,
under the same lock and settings check as a local harvest. So:

- **finished queries are never resampled**: a rerun (local or on Ray) skips every query in the
  file;
- **a killed worker loses nothing and duplicates nothing**: its batches were not written, so
  they go back to the queue and a live worker samples them; the killed one gets batches again
  once Ray has restarted it and it answers a health probe; a batch is written once, when its
  answer arrives; when every worker is dead for good the run stops (a rerun resumes);
- **a killed driver loses nothing written**: the file holds whole batches (a torn last line is cut
  off on resume), and the workers of a job die with its driver.

Records land in the order batches finish, not in item order (resume reads ids, not order).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from capgate._util.extras import import_extra
from capgate._util.validate import check_positive_int
from capgate.core.backend import Backend, Generation, Prompt, SamplingParams
from capgate.datasets import DatasetItem
from capgate.errors import BackendError
from capgate.labels.harvesting import HarvestReport, HarvestRun, HarvestTarget

__all__ = ["RayHarvestReport", "ray_harvest"]

BackendFactory = Callable[[int], Backend]
"""Builds worker ``i``'s backend, inside that worker (so it must be importable or picklable)."""


class RayHarvestReport(HarvestReport):
    """What a Ray harvest run did: a :class:`~capgate.labels.harvesting.HarvestReport`, plus the workers.

    Attributes:
        workers: Ray workers that sampled.
        worker_failures: Batches whose worker died before answering (each was sampled again).
    """

    workers: int
    worker_failures: int


class _Sampler:
    """A Ray actor holding one backend."""

    def __init__(self, make_backend: BackendFactory, index: int) -> None:
        self.backend = make_backend(index)
        if not isinstance(self.backend, Backend):
            raise TypeError(
                f"make_backend({index}) made a {type(self.backend).__name__}, not a capgate.Backend"
            )

    def target(self) -> HarvestTarget:
        return HarvestTarget.of(self.backend)

    def pid(self) -> int:
        return os.getpid()

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[list[Generation]]:
        return self.backend.generate(prompts, params)


def ray_harvest(
    make_backend: BackendFactory,
    items: Iterable[DatasetItem],
    out: str | Path,
    *,
    k: int,
    workers: int = 2,
    address: str | None = None,
    in_flight: int = 2,
    cpus_per_worker: float = 1.0,
    max_worker_failures: int = 10,
    **settings: Any,
) -> RayHarvestReport:
    """Harvest ``items`` on Ray: ``workers`` actors sample, this process grades and writes ``out``.

    Args:
        make_backend: ``make_backend(i)`` builds worker ``i``'s backend inside the worker (e.g.
            an OpenAI-compatible backend for replica ``i % n``, or a local model).
        items: The queries; ids must be unique.
        out: The JSON-lines output, the same file :func:`capgate.labels.harvesting.harvest` writes and
            resumes (either can resume the other's).
        k: Responses sampled per query.
        workers: Ray actors to start.
        address: The Ray cluster (``"auto"``, ``"ray://host:10001"``, ``"host:6379"``); ``None``
            joins the Ray already initialised in this process, else starts a local one.
        in_flight: Batches handed to each worker at once (one being sampled, one queued).
        cpus_per_worker: Ray CPUs each worker reserves (0 for workers that only call a server).
        max_worker_failures: Give up after this many batches lost to dead workers.
        **settings: Every other setting of :func:`capgate.labels.harvesting.harvest` (``temperature``,
            ``seed``, ``batch_size``, ``grader``, ``prompt``, ``dataset``, ``progress``, ...).

    Returns:
        What the run did, with the workers' count and failures.

    Raises:
        DataError: As :func:`capgate.labels.harvesting.harvest` (damaged output, other settings...).
        RuntimeError: More than ``max_worker_failures`` batches were lost to dead workers.
        BackendError: A worker's backend failed (what was written so far stays written), or the
            first worker's could not be built (nothing is written then).
    """
    check_positive_int("workers", workers)
    check_positive_int("in_flight", in_flight)
    ray = import_extra("ray", "ray", "a harvest on Ray")
    run = HarvestRun(items, out, k=k, **settings)  # checks the settings before Ray starts
    if address is not None or not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    remote = ray.remote(max_restarts=max_worker_failures, max_task_retries=0)(_Sampler)
    actors = [remote.options(num_cpus=cpus_per_worker).remote(make_backend, i) for i in range(workers)]
    try:
        with run:
            queue = deque(run.open(_first_target(ray, actors[0])))
            failures = _drive(ray, run, actors, queue, in_flight, max_worker_failures)
            report = run.close()
    finally:
        for actor in actors:
            ray.kill(actor, no_restart=True)
    return RayHarvestReport(**report.model_dump(), workers=workers, worker_failures=failures)


def _first_target(ray: Any, actor: Any) -> HarvestTarget:
    """Worker 0's target, once its backend is built; a backend that fails to build is a
    :class:`BackendError` naming the worker's error (Ray's own is a traceback of the worker)."""
    from ray.exceptions import RayActorError

    try:
        target: HarvestTarget = ray.get(actor.target.remote())
    except RayActorError as exc:
        if not exc.actor_init_failed:
            raise
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        cause = lines[-1] if lines else type(exc).__name__  # the worker's traceback ends with its error
        raise BackendError(f"Ray worker 0 could not build its backend: {cause}") from None
    return target


def _drive(
    ray: Any,
    run: HarvestRun,
    actors: list[Any],
    queue: deque[list[DatasetItem]],
    in_flight: int,
    max_failures: int,
) -> int:
    """Hand batches to live workers until every batch is written; returns the batches lost.

    A worker whose batch fails leaves the rotation until a health probe (a retried ``pid()``,
    which Ray holds until the restarted actor is up) answers, so no batch is thrown at a
    restarting actor (Ray fails those at once: losses). A worker whose probe fails is dropped.
    """
    from ray.exceptions import RayActorError

    pending: dict[Any, tuple[int, list[DatasetItem], list[Prompt]]] = {}
    probes: dict[Any, int] = {}
    busy = [0] * len(actors)
    live = set(range(len(actors)))  # workers batches may go to
    dead: set[int] = set()
    failures = 0
    try:
        while queue or pending:
            for index in sorted(live):
                while queue and busy[index] < in_flight:
                    batch = queue.popleft()
                    prompts, params = run.request(batch)
                    ref = actors[index].generate.remote(prompts, params)
                    pending[ref] = (index, batch, prompts)
                    busy[index] += 1
            if not pending and not probes:
                raise RuntimeError(
                    f"every Ray worker died ({len(dead)} of {len(actors)}, restarts used up or "
                    "their backend failing to build); what was written stays written: rerun to resume"
                )
            (ref,), _ = ray.wait([*pending, *probes], num_returns=1)
            if ref in probes:
                index = probes.pop(ref)
                try:
                    ray.get(ref)
                except RayActorError:
                    dead.add(index)
                else:
                    live.add(index)
                continue
            index, batch, prompts = pending.pop(ref)
            busy[index] -= 1
            try:
                outputs = ray.get(ref)
            except RayActorError:
                failures += 1
                if failures > max_failures:
                    raise RuntimeError(
                        f"{failures} batches were lost to dead Ray workers (max_worker_failures="
                        f"{max_failures}); what was written stays written: rerun to resume"
                    ) from None
                queue.appendleft(batch)  # not written: sampled again, by a live worker
                if index in live:
                    live.discard(index)
                    probes[actors[index].pid.options(max_task_retries=-1).remote()] = index
                continue
            run.write(batch, prompts, outputs)
    finally:
        for ref in pending:
            ray.cancel(ref, force=False)
    return failures
