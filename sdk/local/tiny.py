"""A tiny random-weights causal LM built offline from a config: for tests, smoke runs and a
user's own CI, where no model may be downloaded."""

from __future__ import annotations

import os
from pathlib import Path


def build_tiny_model(
    out: str | os.PathLike[str],
    *,
    tokenizer_from: str | os.PathLike[str] = "default",
    hidden_size: int = 32,
    layers: int = 2,
    seed: int = 1234,
    initializer_range: float = 0.2,
    lm_head_std: float | None = 0.3,
) -> Path:
    """Save a random-weights Llama with a real tokenizer as a transformers folder at ``out``
    (kept as it is if ``out`` already holds one); capgate's backends, featurizer and trainer load
    it like any model folder.

    Args:
        out: The folder to write.
        tokenizer_from: The model whose tokenizer it reuses (:func:`capgate.local.models.prepare_model`
            resolves it; ``"default"``: the embedded SmolLM2, offline).
        hidden_size: Width of the model (heads: 4, key-value heads: 2, MLP: twice the width).
        layers: Decoder layers.
        seed: Seed of the random weights (the same seed, the same model).
        initializer_range: Standard deviation of the initial weights: larger than the usual 0.02
            so that outputs depend on the prompt and greedy decoding does not repeat one token.
        lm_head_std: Re-draw the output layer with this standard deviation (``None``: keep it).

    Returns:
        ``out`` as a path.
    """
    folder = Path(out)
    if (folder / "config.json").is_file():
        return folder
    import torch
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    from capgate.local.models import prepare_model

    tokenizer = AutoTokenizer.from_pretrained(str(prepare_model(tokenizer_from)))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        tie_word_embeddings=False,
        initializer_range=initializer_range,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    if lm_head_std is not None:
        with torch.no_grad():
            model.lm_head.weight.normal_(0.0, lm_head_std)
    model.generation_config = GenerationConfig.from_model_config(config)
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder
