"""What every bench's ``--smoke`` run shares: a temporary output folder and a tiny model.

A smoke run takes the bench's own code path in seconds, on tiny or synthetic data, and writes
only under a temporary folder (never ``bench/RESULTS.md``, ``bench/RELIABILITY.md`` or the
committed caches in ``bench/data``). ``tests/test_bench_smoke.py`` runs every bench's smoke mode.

The tiny model is a random-weight 2-layer, 32-wide Llama with the embedded SmolLM2's tokenizer and
chat template, built from a config (the test suite's ``tiny_model_dir``, passed in through
``CAPGATE_BENCH_TINY_MODEL``; built here into the temporary folder when that is not set).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

TINY_MODEL_ENV = "CAPGATE_BENCH_TINY_MODEL"


def smoke_dir(bench: str) -> Path:
    """A fresh temporary folder for one smoke run's outputs (printed, so a reader can look)."""
    folder = Path(tempfile.mkdtemp(prefix=f"capgate-smoke-{bench}-"))
    print(f"smoke run: outputs under {folder}")
    return folder


def left_out(what: str) -> None:
    """Say what a smoke run could not exercise (an optional service it cannot reach)."""
    print(f"smoke run: left out {what}")


def tiny_model(folder: Path | None = None) -> Path:
    """The tiny random-weight model's folder: ``$CAPGATE_BENCH_TINY_MODEL``, else built into ``folder``."""
    given = os.environ.get(TINY_MODEL_ENV)
    if given:
        return Path(given)
    import torch
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    from capgate.local.models import prepare_model

    out = (folder or Path(tempfile.mkdtemp(prefix="capgate-smoke-"))) / "tiny-llama"
    if (out / "config.json").is_file():
        return out
    tokenizer = AutoTokenizer.from_pretrained(str(prepare_model("default")))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        tie_word_embeddings=False,
        initializer_range=0.2,
    )
    torch.manual_seed(1234)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig.from_model_config(config)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


def postgres_url(given: str | None = None) -> str | None:
    """The PostgreSQL server a smoke run may use (``given``, else the test suite's), or None.

    A smoke run never starts a server of its own; without one it says what it left out.
    """
    url = given or os.environ.get("CAPGATE_TEST_POSTGRES_URL")
    if not url:
        left_out("PostgreSQL (no --postgres and no $CAPGATE_TEST_POSTGRES_URL): SQLite only")
    return url
