"""Backend factories for Ray workers in tests/test_harvest_ray.py (imported by the workers, which
get this folder on their PYTHONPATH): each notes its worker's pid, so a test can kill it."""

from __future__ import annotations

import os
import time
from pathlib import Path

from capgate.adapters.backends.openai import OpenAIBackend


def vllm_worker(url: str, model: str, pid_dir: str, index: int) -> OpenAIBackend:
    """Worker ``index``'s backend: the CI vLLM server; writes ``<pid_dir>/<index>.<pid>``."""
    (Path(pid_dir) / f"{index}.{os.getpid()}").touch()
    return OpenAIBackend(model, base_url=url, timeout=180.0, max_retries=2)


def slow_restart_worker(url: str, model: str, pid_dir: str, index: int) -> OpenAIBackend:
    """As :func:`vllm_worker`, but a restarted worker takes 5 s to come back (a model loading)."""
    import ray

    if ray.get_runtime_context().was_current_actor_reconstructed:
        time.sleep(5.0)
    return vllm_worker(url, model, pid_dir, index)


def broken_restart_worker(url: str, model: str, pid_dir: str, index: int) -> OpenAIBackend:
    """As :func:`vllm_worker`, but a restarted worker cannot build its backend (its model is gone)."""
    import ray

    if ray.get_runtime_context().was_current_actor_reconstructed:
        raise OSError("the model folder is gone")
    return vllm_worker(url, model, pid_dir, index)
