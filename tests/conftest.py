"""Shared fixtures.

Every test session gets its own capgate cache (``CAPGATE_CACHE_DIR`` in a temporary folder), so
tests never read or write the user's cache. Model fixtures are session-scoped and built once:

- ``default_model_dir``: the embedded SmolLM2-135M-Instruct, converted from its GGUF into that
  cache (the real conversion, once per session).
- ``tiny_model_dir`` / ``tiny_model``: a 2-layer, 32-wide random-weight Llama with SmolLM2's real
  tokenizer and chat template, for fast unit tests of loading, sampling and features.
- ``demo_run``: ``capgate demo`` run once, as a user runs it, for the tests that read what it
  printed, the JSON figures it wrote and its plots (the live, verbalized and replay parts).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from capgate.local.models import LoadedModel


@pytest.fixture(scope="session", autouse=True)
def capgate_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh capgate cache directory for the whole session."""
    root = tmp_path_factory.mktemp("capgate-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CAPGATE_CACHE_DIR", str(root))
        yield root


def _single_thread_torch() -> None:
    # The test models are tiny: thread hand-offs cost more than they save, and on a shared
    # 2-core machine two spinning threads per process slow small matmuls down ~20x.
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def default_model_dir(capgate_cache: Path) -> Path:
    """The default model converted (for real) into the session's cache."""
    from capgate.local.models import prepare_model

    _single_thread_torch()
    return prepare_model("default")


@pytest.fixture(scope="session")
def tiny_model_dir(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight 2-layer Llama saved as a transformers folder with SmolLM2's tokenizer."""
    from capgate.local.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"), tokenizer_from=default_model_dir)


@dataclass(frozen=True)
class DemoRun:
    """What one ``capgate demo --questions 4 --plot DIR --json-out FILE`` printed and wrote."""

    text: str
    figures: dict[str, Any]
    plots: Path


@pytest.fixture(scope="session")
def demo_run(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """``capgate demo`` in a fresh process, every part on (the model runs it needs are minutes)."""
    folder = tmp_path_factory.mktemp("demo")
    command = [sys.executable, "-m", "capgate.cli", "demo", "--questions", "4"]
    command += ["--plot", str(folder / "plots")]
    command += ["--json-out", str(folder / "demo.json")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads((folder / "demo.json").read_text(encoding="utf-8"))
    return DemoRun(done.stdout, figures, folder / "plots")


@pytest.fixture(scope="module")
def real_backend(default_model_dir: Path) -> Any:
    """The embedded model's transformers backend (loaded once per test module that asks)."""
    from capgate.adapters.backends.transformers import load_backend

    return load_backend("default")


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir: Path) -> LoadedModel:
    """The tiny Llama, loaded on the CPU in float32."""
    from capgate.local.models import load_model

    _single_thread_torch()
    return load_model(tiny_model_dir, device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """The real PostgreSQL test server (see tests/_postgres.py): fails under CI when missing."""
    from _postgres import server_url, stop_started_server

    yield server_url()
    stop_started_server()


@pytest.fixture(params=["sqlite", "postgres"])
def new_log_location(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], str | Path]:
    """Makes fresh decision-log locations of one store kind: SQLite files, or empty schemas on the
    PostgreSQL test server (each test runs once per store)."""
    if request.param == "sqlite":
        names = iter(range(1_000_000))
        return lambda: tmp_path / "logs" / f"decisions{next(names) or ''}.sqlite3"
    from _postgres import fresh_url

    base = request.getfixturevalue("postgres_url")
    return lambda: fresh_url(base)


@pytest.fixture
def log_location(new_log_location: Callable[[], str | Path]) -> str | Path:
    """Where a fresh decision log lives (a SQLite file, or a schema on the PostgreSQL server)."""
    return new_log_location()
