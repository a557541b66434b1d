"""A feature whose optional dependency is missing says which extra to install, through one error type
(:class:`capgate.MissingExtraError`, an ``ImportError``), at every place that imports one lazily."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from capgate import MissingExtraError
from capgate._util.extras import import_extra
from capgate.adapters.backends import OpenAIBackend, VLLMBackend
from capgate.cli import app
from capgate.datasets import DatasetItem, load_dataset
from capgate.estimators import LinearProbe
from capgate.grading import MathGrader
from capgate.labels.harvest_ray import ray_harvest


def _missing(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    """Make ``import module`` fail here as it does where the package is not installed."""
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)


def test_import_extra_names_the_top_level_package_and_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    _missing(monkeypatch, "safetensors.numpy")
    with pytest.raises(MissingExtraError, match=r"saving needs safetensors, which is not installed") as info:
        import_extra("safetensors.numpy", "local", "saving")
    assert "pip install 'capgate[local]'" in str(info.value)
    assert (info.value.extra, info.value.missing) == ("local", ["safetensors"])
    assert isinstance(info.value, ImportError)


def test_a_probe_saved_without_safetensors_names_the_local_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    rng = np.random.default_rng(0)
    probe = LinearProbe().fit(rng.normal(size=(40, 3)), rng.uniform(size=40))
    _missing(monkeypatch, "safetensors", "safetensors.numpy")
    with pytest.raises(MissingExtraError, match=r"capgate\[local\]"):
        probe.save(tmp_path / "probe")


def test_a_postgres_log_without_psycopg_is_a_cli_error_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _missing(monkeypatch, "psycopg")
    result = CliRunner().invoke(app, ["log", "show", "--db", "postgresql://capgate@127.0.0.1:1/capgate"])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: a PostgreSQL decision log needs psycopg")
    assert "pip install 'capgate[postgres]'" in result.stderr


def test_a_ray_harvest_without_ray_names_the_ray_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _missing(monkeypatch, "ray")
    with pytest.raises(MissingExtraError, match=r"a harvest on Ray needs ray.*capgate\[ray\]"):
        ray_harvest(lambda i: None, [], tmp_path / "labels.jsonl", k=2)
    assert not (tmp_path / "labels.jsonl").exists()


def test_an_arrow_dataset_without_pyarrow_names_the_data_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    _missing(monkeypatch, "pyarrow", "pyarrow.ipc")
    with pytest.raises(MissingExtraError, match=r"reading Arrow files needs pyarrow.*capgate\[data\]"):
        load_dataset("mmlu:anatomy", split="dev")


def test_a_symbolic_math_check_without_math_verify_names_the_data_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    item = DatasetItem(id="m", question="Half?", kind="math", references=["\\frac{1}{2}"])
    assert not MathGrader(symbolic=False).grade("\\boxed{0.5000001}", item)  # strings only: needs nothing
    _missing(monkeypatch, "math_verify")
    with pytest.raises(MissingExtraError, match=r"MathGrader\(symbolic=True\).*capgate\[data\]"):
        MathGrader().grade("\\boxed{0.5000001}", item)


def test_backends_without_their_client_library_name_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    _missing(monkeypatch, "openai", "vllm")
    with pytest.raises(MissingExtraError, match=r"OpenAIBackend needs openai.*capgate\[openai\]"):
        OpenAIBackend("my-model", base_url="http://127.0.0.1:1/v1")
    engine = VLLMBackend("some/model")  # the engine is built on first use
    with pytest.raises(MissingExtraError, match=r"VLLMBackend's engine needs vllm.*capgate\[vllm\]"):
        _ = engine.llm
