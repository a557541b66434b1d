"""Merging a LoRA adapter without PEFT: the arithmetic, the merged folder's identity, and the refusals
(DoRA and the rest a plain merge cannot reproduce, another base, tensors that do not fit)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from capgate.errors import DataError
from capgate.local.lora import ADAPTER_CONFIG, ADAPTER_PROVENANCE, ADAPTER_WEIGHTS, merge_lora
from capgate.local.models import weights_fingerprint
from capgate.local.weights import MODEL_METADATA_FILE

TARGETS = ("model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj")


def write_adapter(folder: Path, base: Path, *, r: int = 2, alpha: float = 6.0, **config: object) -> Path:
    """A PEFT-format LoRA adapter over ``TARGETS`` of ``base``, with seeded random A and B."""
    folder.mkdir(parents=True, exist_ok=True)
    weights = load_file(str(base / "model.safetensors"))
    generator = torch.Generator().manual_seed(0)
    tensors = {}
    for module in TARGETS:
        out_features, in_features = weights[f"{module}.weight"].shape
        prefix = f"base_model.model.{module}"
        tensors[f"{prefix}.lora_A.weight"] = torch.randn(r, in_features, generator=generator)
        tensors[f"{prefix}.lora_B.weight"] = torch.randn(out_features, r, generator=generator).half()
    save_file(tensors, str(folder / ADAPTER_WEIGHTS))
    settings = {"peft_type": "LORA", "r": r, "lora_alpha": alpha, "target_modules": list(TARGETS),
                "base_model_name_or_path": str(base), "task_type": "CAUSAL_LM"} | config  # fmt: skip
    (folder / ADAPTER_CONFIG).write_text(json.dumps(settings), encoding="utf-8")
    return folder


def test_the_merge_adds_scaled_b_times_a_to_the_adapted_weights_only(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    adapter = write_adapter(tmp_path / "adapter", tiny_model_dir)
    merged = merge_lora(tiny_model_dir, adapter, tmp_path / "merged")
    before = load_file(str(tiny_model_dir / "model.safetensors"))
    after = load_file(str(merged / "model.safetensors"))
    lora = load_file(str(adapter / ADAPTER_WEIGHTS))
    assert set(after) == set(before)
    for name, tensor in before.items():
        module = name.removesuffix(".weight")
        if module in TARGETS:
            a = lora[f"base_model.model.{module}.lora_A.weight"]
            b = lora[f"base_model.model.{module}.lora_B.weight"].float()
            torch.testing.assert_close(after[name], tensor + 3.0 * b @ a)  # alpha 6 / r 2
        else:
            assert torch.equal(after[name], tensor), name
    assert (merged / "config.json").read_text() == (tiny_model_dir / "config.json").read_text()
    assert (merged / "tokenizer.json").is_file()
    meta = json.loads((merged / MODEL_METADATA_FILE).read_text())
    assert meta["source"]["c3rl"] is False  # no provenance: nothing says it states a confidence
    assert meta["model_id"].endswith(f"+lora-{meta['source']['adapter_sha256'][:12]}")
    assert weights_fingerprint(merged).startswith("lora-merge-sha256:")
    assert weights_fingerprint(merged) != weights_fingerprint(tiny_model_dir)


def test_rslora_scales_by_the_square_root_of_the_rank(tiny_model_dir: Path, tmp_path: Path) -> None:
    adapter = write_adapter(tmp_path / "adapter", tiny_model_dir, r=4, alpha=6.0, use_rslora=True)
    merged = merge_lora(tiny_model_dir, adapter, tmp_path / "merged")
    name = f"{TARGETS[0]}.weight"
    lora = load_file(str(adapter / ADAPTER_WEIGHTS))
    a, b = (lora[f"base_model.model.{TARGETS[0]}.lora_{x}.weight"].float() for x in "AB")
    expected = (
        load_file(str(tiny_model_dir / "model.safetensors"))[name] + 3.0 * b @ a
    )  # 6 / sqrt(4), not 6 / 4
    torch.testing.assert_close(load_file(str(merged / "model.safetensors"))[name], expected)


def test_a_finished_merge_is_returned_as_is(tiny_model_dir: Path, tmp_path: Path) -> None:
    adapter = write_adapter(tmp_path / "adapter", tiny_model_dir)
    merged = merge_lora(tiny_model_dir, adapter, tmp_path / "merged")
    stamp = (merged / "model.safetensors").stat().st_mtime_ns
    assert merge_lora(tiny_model_dir, adapter, tmp_path / "merged") == merged
    assert (merged / "model.safetensors").stat().st_mtime_ns == stamp
    other = write_adapter(tmp_path / "other", tiny_model_dir, alpha=2.0)  # another merge: refused, kept
    with pytest.raises(DataError, match="holds another model or merge") as info:
        merge_lora(tiny_model_dir, other, tmp_path / "merged")
    assert info.value.path == str(merged)
    assert (merged / "model.safetensors").stat().st_mtime_ns == stamp
    with pytest.raises(DataError, match="holds another model or merge"):
        merge_lora(tiny_model_dir, adapter, tiny_model_dir)  # never over the base itself


def test_provenance_names_the_model_and_must_match_the_base(tiny_model_dir: Path, tmp_path: Path) -> None:
    adapter = write_adapter(tmp_path / "adapter", tiny_model_dir)
    fingerprint = weights_fingerprint(tiny_model_dir)
    provenance = {"model_id": "tiny+c3rl-test", "base_weights_fingerprint": fingerprint, "c3rl": True}
    (adapter / ADAPTER_PROVENANCE).write_text(json.dumps(provenance))
    merged = merge_lora(tiny_model_dir, adapter, tmp_path / "merged")
    meta = json.loads((merged / MODEL_METADATA_FILE).read_text())
    assert meta["model_id"] == "tiny+c3rl-test"
    assert meta["source"]["c3rl"] is True
    (adapter / ADAPTER_PROVENANCE).write_text(
        json.dumps(provenance | {"base_weights_fingerprint": "gguf-sha256:0"})
    )
    with pytest.raises(DataError, match=r"trained on weights gguf-sha256:0, not on this base") as info:
        merge_lora(tiny_model_dir, adapter, tmp_path / "other")
    assert info.value.path == str(adapter / ADAPTER_PROVENANCE)
    assert info.value.field == "base_weights_fingerprint"
    assert not (tmp_path / "other").exists()


@pytest.mark.parametrize(
    ("setting", "field"),
    [({"use_dora": True}, "use_dora"), ({"bias": "all"}, "bias"), ({"r": 0}, "r"),
     ({"modules_to_save": ["lm_head"]}, "modules_to_save"), ({"rank_pattern": {"q": 8}}, "rank_pattern"),
     ({"lora_bias": True}, "lora_bias"), ({"trainable_token_indices": [5]}, "trainable_token_indices"),
     ({"init_lora_weights": "pissa"}, "init_lora_weights"),
     ({"alora_invocation_tokens": [7]}, "alora_invocation_tokens")],
)  # fmt: skip
def test_what_a_plain_merge_cannot_reproduce_is_refused_by_field(
    tiny_model_dir: Path, tmp_path: Path, setting: dict[str, object], field: str
) -> None:
    adapter = write_adapter(tmp_path / "adapter", tiny_model_dir, **setting)
    with pytest.raises(DataError, match=rf"adapter_config\.json: field '{field}'"):
        merge_lora(tiny_model_dir, adapter, tmp_path / "merged")
    assert not (tmp_path / "merged").exists()


def test_an_adapter_for_another_shape_or_module_is_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    adapter = write_adapter(tmp_path / "adapter", tiny_model_dir)
    config = json.loads((adapter / ADAPTER_CONFIG).read_text())
    (adapter / ADAPTER_CONFIG).write_text(json.dumps(config | {"r": 3}))
    with pytest.raises(DataError, match=r"does not fit the base model: .* at rank 2 \(config r=3\)"):
        merge_lora(tiny_model_dir, adapter, tmp_path / "merged")
    tensors = load_file(str(write_adapter(tmp_path / "other", tiny_model_dir) / ADAPTER_WEIGHTS))
    renamed = {k.replace("layers.1.", "layers.7."): v for k, v in tensors.items()}
    save_file(renamed, str(tmp_path / "other" / ADAPTER_WEIGHTS))
    with pytest.raises(DataError, match=r"no tensor 'model\.layers\.7\.mlp\.down_proj\.weight'"):
        merge_lora(tiny_model_dir, tmp_path / "other", tmp_path / "merged")
    shutil.rmtree(tmp_path / "other")
    (tmp_path / "other").mkdir()
    with pytest.raises(DataError, match="missing from the adapter folder") as info:
        merge_lora(tiny_model_dir, tmp_path / "other", tmp_path / "merged")
    assert info.value.path == str(tmp_path / "other" / ADAPTER_CONFIG)


def test_tensors_a_plain_merge_cannot_use_and_missing_weights_are_refused(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    adapter = write_adapter(tmp_path / "adapter", tiny_model_dir)
    tensors = load_file(str(adapter / ADAPTER_WEIGHTS))
    tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector"] = torch.ones(32)
    save_file(tensors, str(adapter / ADAPTER_WEIGHTS))
    with pytest.raises(DataError, match=r"tensors it cannot merge: \['base_model.*lora_magnitude_vector'\]"):
        merge_lora(tiny_model_dir, adapter, tmp_path / "merged")
    (adapter / ADAPTER_WEIGHTS).rename(adapter / "adapter_model.bin")
    with pytest.raises(DataError, match=r"adapter_model\.bin is never loaded") as info:
        merge_lora(tiny_model_dir, adapter, tmp_path / "merged")
    assert info.value.path == str(adapter / ADAPTER_WEIGHTS)
    assert not (tmp_path / "merged").exists()
