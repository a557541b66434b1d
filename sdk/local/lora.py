"""A LoRA adapter (PEFT's saved format) merged into a model folder, without PEFT.

``merge_lora(base, adapter, out)`` writes ``out``: the base folder's config and tokenizer files and
one ``model.safetensors`` holding ``W + scale * B @ A`` for every adapted layer (scale
``lora_alpha / r``, or ``lora_alpha / sqrt(r)`` for rsLoRA). What capgate cannot merge exactly
(DoRA, trained biases, extra saved modules, per-layer ranks, PiSSA-style initialisations, aLoRA)
is refused, never approximated.

capgate ships one adapter, :data:`capgate.assets.C3RL_SMOLLM2_ADAPTER`: SmolLM2-135M-Instruct taught
by ``capgate train c3rl`` to end its answers with ``[confidence=X%]`` (``bench/c3rl.py``).
``prepare_model("default-c3rl")`` merges it into the embedded model once and caches the folder.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from capgate._util.atomic import atomic_folder, atomic_write_json
from capgate._util.saved import read_saved
from capgate.errors import DataError
from capgate.local.weights import MODEL_METADATA_FILE, cached_file_sha256, weights_fingerprint

__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_PROVENANCE",
    "ADAPTER_WEIGHTS",
    "DEFAULT_C3RL_MODEL",
    "AdapterProvenance",
    "LoraConfigFile",
    "adapter_digest",
    "merge_lora",
    "read_provenance",
]

DEFAULT_C3RL_MODEL = "default-c3rl"
"""The name :func:`capgate.local.models.prepare_model` knows for the embedded model with the shipped
C3RL adapter merged in."""

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_PROVENANCE = "capgate_adapter.json"
"""Optional, written by ``capgate train c3rl``: the base weights' fingerprint the adapter was trained
on (checked before merging) and the run it came from."""

_PREFIX = "base_model.model."
_WEIGHT_FILES = (".safetensors", ".safetensors.index.json", ".bin", ".pt")


class LoraConfigFile(BaseModel):
    """The fields of PEFT's ``adapter_config.json`` that decide a merge (others are ignored)."""

    model_config = ConfigDict(extra="ignore")

    peft_type: Literal["LORA"] = "LORA"
    r: int = Field(ge=1)
    lora_alpha: float = Field(gt=0)
    use_rslora: bool = False
    use_dora: Literal[False] = False
    fan_in_fan_out: Literal[False] = False
    bias: Literal["none"] = "none"
    modules_to_save: list[str] | None = Field(default=None, max_length=0)
    rank_pattern: dict[str, Any] = Field(default_factory=dict, max_length=0)
    alpha_pattern: dict[str, Any] = Field(default_factory=dict, max_length=0)
    lora_bias: Literal[False] = False
    use_qalora: Literal[False] = False
    layer_replication: None = None
    trainable_token_indices: None = None
    target_parameters: None = None
    # Not a plain W + scale * B @ A: PiSSA, OLoRA, CorDA, LoftQ, LoRA-GA initialisations (unless PEFT
    # converted them back: then this reads True); aLoRA and Arrow (they apply the adapter in part).
    init_lora_weights: Literal[True, False, "gaussian"] = True
    alora_invocation_tokens: None = None
    arrow_config: None = None

    @property
    def scale(self) -> float:
        return self.lora_alpha / (math.sqrt(self.r) if self.use_rslora else self.r)


class AdapterProvenance(BaseModel):
    """``capgate_adapter.json``: where an adapter came from."""

    model_config = ConfigDict(extra="allow")

    base_weights_fingerprint: str
    model_id: str
    c3rl: bool = False
    """The adapter teaches the ``[confidence=X%]`` tag (``capgate train c3rl``): the merged folder
    says so too, so :func:`capgate.load_estimator` with ``method="verbalized"`` reads the tag."""


_MERGE_VERSION = "capgate-lora-merge/1"
"""Salts the digest: a change to how capgate merges makes every cached merge a new folder."""


def adapter_digest(adapter: str | os.PathLike[str]) -> str:
    """The sha256 over an adapter folder's config, weights and provenance (if any), and capgate's
    merge version: what names and fingerprints a merged folder (file digests are cached by
    :func:`~capgate.local.weights.cached_file_sha256`, so resolving ``"default-c3rl"`` again is cheap).

    Raises:
        DataError: The config or the safetensors weights are missing (PEFT's older pickled
            ``adapter_model.bin`` is never loaded).
    """
    folder = Path(adapter)
    combined = hashlib.sha256(f"{_MERGE_VERSION}\n".encode())
    for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS, ADAPTER_PROVENANCE):
        path = folder / name
        if not path.is_file():
            if name == ADAPTER_PROVENANCE:
                continue
            hint = " (a pickled adapter_model.bin is never loaded: save it with safetensors)"
            raise DataError(
                f"missing from the adapter folder{hint if name == ADAPTER_WEIGHTS else ''}", path=path
            )
        combined.update(f"{name}\0{cached_file_sha256(path)}\n".encode())
    return combined.hexdigest()


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError("missing from the adapter folder", path=path) from None
    except (OSError, ValueError) as exc:
        raise DataError(f"unreadable JSON: {exc}", path=path) from None


def read_provenance(adapter: str | os.PathLike[str]) -> AdapterProvenance | None:
    """The adapter's ``capgate_adapter.json``, or None for an adapter trained elsewhere."""
    path = Path(adapter) / ADAPTER_PROVENANCE
    return read_saved(AdapterProvenance, _read_json(path), path) if path.is_file() else None


def _merged_state(base: Path, adapter: Path, config: LoraConfigFile) -> dict[str, Any]:
    """The base folder's tensors with every adapted weight replaced by its merged value."""
    import torch
    from safetensors.torch import load_file

    files = sorted(base.glob("*.safetensors"))
    if not files:
        raise DataError("expected *.safetensors weights in the base model folder", path=base)
    state: dict[str, Any] = {}
    for file in files:
        state |= load_file(str(file))
    lora = load_file(str(adapter / ADAPTER_WEIGHTS))
    modules = sorted(key[: -len(".lora_A.weight")] for key in lora if key.endswith(".lora_A.weight"))
    unused = set(lora) - {f"{m}.lora_{ab}.weight" for m in modules for ab in "AB"}
    if not modules or unused:
        detail = f"tensors it cannot merge: {sorted(unused)[:3]}" if unused else "no lora_A tensors"
        raise DataError(f"not a LoRA adapter capgate can merge ({detail})", path=adapter / ADAPTER_WEIGHTS)
    for module in modules:
        name = module.removeprefix(_PREFIX) + ".weight"
        down, up = lora[f"{module}.lora_A.weight"], lora.get(f"{module}.lora_B.weight")
        weight = state.get(name)
        if weight is None or up is None:
            missing = name if weight is None else f"{module}.lora_B.weight"
            raise DataError(f"the adapter does not fit the base model: no tensor {missing!r}", path=adapter)
        fits_weight = (up.shape[0], down.shape[1]) == tuple(weight.shape)
        if not fits_weight or not up.shape[1] == down.shape[0] == config.r:
            raise DataError(
                f"the adapter does not fit the base model: {name} is {tuple(weight.shape)}, its update "
                f"{(up.shape[0], down.shape[1])} at rank {down.shape[0]} (config r={config.r})",
                path=adapter,
            )
        delta = config.scale * (up.to(torch.float32) @ down.to(torch.float32))
        state[name] = (weight.to(torch.float32) + delta).to(weight.dtype).contiguous()
    return state


def merge_lora(
    base: str | os.PathLike[str], adapter: str | os.PathLike[str], out: str | os.PathLike[str]
) -> Path:
    """Write ``out``: the model folder ``base`` with the LoRA ``adapter`` merged into its weights.

    ``out`` appears only when complete; an existing ``out`` holding this very merge is returned
    untouched. Its ``capgate_model.json`` names the model as the adapter's ``capgate_adapter.json``
    does (else ``<base id>+lora-<digest>``) and fingerprints it by the base's fingerprint and the
    adapter's digest, so the base's probes and harvests are never mistaken for the merged model's.

    Raises:
        DataError: The adapter folder is malformed; uses what a plain merge cannot reproduce
            (DoRA, biases, saved modules, per-layer ranks, PiSSA-style initialisations, aLoRA);
            was trained on other base weights (by its ``capgate_adapter.json``); does not fit
            the base's tensors; or ``out`` exists and holds another merge.
    """
    base_dir, adapter_dir, final = Path(base), Path(adapter), Path(out)
    config_path = adapter_dir / ADAPTER_CONFIG
    config = read_saved(LoraConfigFile, _read_json(config_path), config_path)
    provenance = read_provenance(adapter_dir)
    base_fingerprint = weights_fingerprint(base_dir)
    if provenance is not None and provenance.base_weights_fingerprint != base_fingerprint:
        raise DataError(
            f"the adapter was trained on weights {provenance.base_weights_fingerprint}, not on this "
            f"base ({base_fingerprint})",
            path=adapter_dir / ADAPTER_PROVENANCE,
            field="base_weights_fingerprint",
        )
    digest = adapter_digest(adapter_dir)
    fingerprint = "lora-merge-sha256:" + hashlib.sha256(f"{base_fingerprint}\0{digest}".encode()).hexdigest()
    if final.is_dir():
        held = _read_json(final / MODEL_METADATA_FILE) if (final / MODEL_METADATA_FILE).is_file() else None
        if not isinstance(held, dict) or held.get("weights_fingerprint") != fingerprint:
            raise DataError(
                "the folder exists and holds another model or merge; choose another out", path=final
            )
        return final
    meta_file = base_dir / MODEL_METADATA_FILE
    base_meta = _read_json(meta_file) if meta_file.is_file() else {}
    base_id = base_meta.get("model_id") if isinstance(base_meta, dict) else None
    base_name = base_id if isinstance(base_id, str) else str(base_dir.resolve())
    model_id = provenance.model_id if provenance else f"{base_name}+lora-{digest[:12]}"

    def build(tmp: Path) -> None:
        from safetensors.torch import save_file

        save_file(_merged_state(base_dir, adapter_dir, config), str(tmp / "model.safetensors"),
                  metadata={"format": "pt"})  # fmt: skip
        for file in base_dir.iterdir():
            if file.is_file() and file.name != MODEL_METADATA_FILE and not file.name.endswith(_WEIGHT_FILES):
                shutil.copy2(file, tmp / file.name)
        source = {
            "c3rl": bool(provenance and provenance.c3rl),
            "base_model_id": base_name,
            "base_weights_fingerprint": base_fingerprint,
            "adapter_sha256": digest,
            "adapter": provenance.model_dump() if provenance else None,
        }
        atomic_write_json(tmp / MODEL_METADATA_FILE, {
            "format": 1, "model_id": model_id, "weights_fingerprint": fingerprint, "source": source,
        })  # fmt: skip

    return atomic_folder(final, build)
