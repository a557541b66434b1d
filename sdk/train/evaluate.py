"""Score a model's tagged answers: tag rate, accuracy, and how well the stated confidence separates
right from wrong (the manifest's ``evaluation``; ``bench/c3rl.py`` reports the same figures).

:func:`summarize` is pure (lists in, numbers out); :func:`sample_completions` samples a
``transformers`` model directly (capgate's core never imports its backends).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from capgate.datasets import DatasetItem
from capgate.metrics import auroc
from capgate.train.rewards import score_completion

__all__ = ["sample_completions", "summarize"]


def summarize(completions: Sequence[Sequence[str]], items: Sequence[DatasetItem]) -> dict[str, Any]:
    """Figures over ``completions[i]`` (each a list of samples) answering ``items[i]``.

    Returns:
        ``n_questions``, ``n_completions``; ``tag_rate`` (share with a well-formed tag);
        ``accuracy``; over tagged completions: ``mean_stated``, ``stated_std`` (how spread the
        stated values are), ``distinct_stated``, ``brier`` (stated vs 0/1 correctness),
        ``brier_constant`` (the tagged completions' own accuracy stated every time: the Brier
        score to beat), ``brier_skill`` (1 - brier / brier_constant) and ``auroc`` (``None``
        when undefined: no tags, or all right, or all wrong).

    Examples:
        >>> from capgate.datasets import DatasetItem
        >>> items = [DatasetItem(id="a", question="1+1?", references=["2"], kind="numeric")]
        >>> s = summarize([["2 [confidence=90%]", "3 [confidence=20%]", "2"]], items)
        >>> round(s["tag_rate"], 3), round(s["accuracy"], 3), s["auroc"]
        (0.667, 0.667, 1.0)
    """
    stated: list[float] = []
    right_tagged: list[bool] = []
    right_all: list[bool] = []
    for samples, item in zip(completions, items, strict=True):
        for text in samples:
            breakdown = score_completion(text, item, "partly")
            right_all.append(breakdown.correct)
            if breakdown.stated is not None:
                stated.append(breakdown.stated)
                right_tagged.append(breakdown.correct)
    n = len(right_all)
    summary: dict[str, Any] = {
        "n_questions": len(items),
        "n_completions": n,
        "tag_rate": len(stated) / n if n else math.nan,
        "accuracy": sum(right_all) / n if n else math.nan,
        "mean_stated": None,
        "stated_std": None,
        "distinct_stated": len(set(stated)),
        "brier": None,
        "brier_constant": None,
        "brier_skill": None,
        "auroc": None,
    }
    if not stated:
        return summary
    p = np.asarray(stated, dtype=np.float64)
    y = np.asarray(right_tagged, dtype=np.float64)
    brier = float(np.mean((p - y) ** 2))
    constant = float(np.mean((y.mean() - y) ** 2))
    summary |= {
        "mean_stated": float(p.mean()),
        "stated_std": float(p.std()),
        "brier": brier,
        "brier_constant": constant,
        "brier_skill": 1.0 - brier / constant if constant > 0 else None,
        "auroc": float(auroc(p, y.astype(np.int64))) if 0 < y.sum() < len(y) else None,
    }
    return summary


def sample_completions(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[list[dict[str, str]]],
    *,
    n: int,
    max_new_tokens: int,
    temperature: float,
    seed: int,
    batch_size: int = 16,
) -> list[list[str]]:
    """``n`` sampled completions per chat prompt (left-padded batches, the tokenizer's chat template).

    Args:
        model: A ``transformers`` causal LM (or PEFT model) on its device.
        tokenizer: Its tokenizer.
        prompts: Chat messages per question.
        n: Completions per prompt.
        max_new_tokens: Most tokens per completion.
        temperature: Sampling temperature (0: greedy, then ``n`` copies of one answer).
        seed: Seed of the sampling (the global torch RNG is restored after).
        batch_size: Most rows (prompts times ``n``) per ``generate`` call.
    """
    import torch

    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    rows = [
        tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        for messages in prompts
        for _ in range(n)
    ]
    texts: list[str] = []
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        for start in range(0, len(rows), batch_size):
            encoded = [
                tokenizer(r, add_special_tokens=False)["input_ids"] for r in rows[start : start + batch_size]
            ]
            width = max(len(ids) for ids in encoded)
            input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in encoded], device=device)
            mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in encoded], device=device)
            sampling = {"do_sample": True, "temperature": temperature, "top_p": 1.0, "top_k": 0}
            with torch.no_grad():
                out = model.generate(
                    input_ids=input_ids,
                    attention_mask=mask,
                    max_new_tokens=max_new_tokens,
                    pad_token_id=pad,
                    **(sampling if temperature > 0 else {"do_sample": False}),
                )
            texts += tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
    return [texts[i * n : (i + 1) * n] for i in range(len(prompts))]
