"""The supervised warm start: a few steps on well-formed answers, so GRPO sees the tag at all.

Measured before this module: SmolLM2-135M-Instruct, asked for ``[confidence=X%]``, wrote it in none
of 48 sampled completions, so every completion got the same format reward and GRPO's advantages
(rewards minus the group mean) were zero. A short supervised pass on the model's *own* answers
ending with a tag (:func:`capgate.train.data.warm_start_rows`) makes the format likely enough to
be learned from. The loss covers the answer and the end-of-turn token only, never the prompt.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

__all__ = ["encode_pair", "warm_start"]


def encode_pair(tokenizer: Any, messages: list[dict[str, str]], answer: str) -> tuple[list[int], list[int]]:
    """Token ids of a chat prompt followed by the assistant's ``answer``, and the labels (the
    prompt's positions masked with -100).

    The answer is rendered by the chat template, so the end-of-turn token it adds is learned too
    (the model learns to stop after the tag).
    """
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(
        [*messages, {"role": "assistant", "content": answer}], tokenize=False
    )
    if not full.startswith(prompt):  # a template that rewrites earlier turns: append by hand
        full = prompt + answer + (tokenizer.eos_token or "")
    prompt_ids = list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    full_ids = list(tokenizer(full, add_special_tokens=False)["input_ids"])
    labels = [-100] * len(prompt_ids) + full_ids[len(prompt_ids) :]
    return full_ids, labels


def warm_start(
    model: Any,
    tokenizer: Any,
    rows: list[tuple[list[dict[str, str]], str]],
    *,
    steps: int,
    lr: float,
    batch_size: int,
    seed: int,
    on_step: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Train ``model`` (a PEFT model: only its adapter's parameters learn) on ``rows``.

    Args:
        model: The model, on its device, in float32 (or the dtype it trains in).
        tokenizer: Its tokenizer (with a chat template).
        rows: ``(messages, answer)`` pairs (:func:`capgate.train.data.warm_start_rows`).
        steps: Optimizer steps; each draws ``batch_size`` rows (cycling through a seeded order).
        lr: AdamW learning rate.
        batch_size: Rows per step.
        seed: Seed of the row order.
        on_step: Called with ``(step, loss)`` after each step (a progress bar).

    Returns:
        The loss of each step.

    Raises:
        ValueError: No rows to train on.
    """
    import torch

    if not rows:
        raise ValueError("the warm start has no answers to train on (no sampled answer was extracted)")
    encoded = [encode_pair(tokenizer, messages, answer) for messages, answer in rows]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    device = next(model.parameters()).device
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    order: list[int] = []
    rng = random.Random(seed)
    losses: list[float] = []
    model.train()
    for step in range(1, steps + 1):
        batch: list[tuple[list[int], list[int]]] = []
        while len(batch) < batch_size:
            if not order:
                order = list(range(len(encoded)))
                rng.shuffle(order)
            batch.append(encoded[order.pop()])
        width = max(len(ids) for ids, _ in batch)
        input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in batch], device=device)
        labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in batch], device=device)
        mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in batch], device=device)
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(step, losses[-1])
    model.eval()
    return losses
