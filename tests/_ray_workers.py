"""Backend factories for Ray workers in tests/test_harvest_ray.py (imported by the workers, which
get this folder on their PYTHONPATH): each notes its worker's pid, so a test can kill it."""

from __future__ import annotations

import os
from pathlib import Path

from capgate.adapters.backends.openai import OpenAIBackend


def vllm_worker(url: str, model: str, pid_dir: str, index: int) -> OpenAIBackend:
    """Worker ``index``'s backend: the CI vLLM server; writes ``<pid_dir>/<index>.<pid>``."""
    (Path(pid_dir) / f"{index}.{os.getpid()}").touch()
    return OpenAIBackend(model, base_url=url, timeout=180.0, max_retries=2)
