"""Graded synthetic questions: arithmetic from one-digit sums to three-digit products.

Most benchmark questions sit at accuracy 0 for a 135M model, which gives a calibration reward
nothing to separate. Arithmetic of graded difficulty spreads such a model's accuracy over the
whole range (one-digit sums nearly always right, three-digit products nearly never), so its
labels hold all three reference classes (see :func:`capgate.train.rewards.reference_class`).

Questions are split two ways for a fair evaluation:

- by operands: every operand pair is assigned to ``"train"`` or ``"test"`` by a hash (about one
  pair in five is ``"test"``), so test questions are never trained on;
- by family: :data:`HELD_OUT_FAMILY` is meant to stay out of training entirely (pass
  ``families=TRAIN_FAMILIES``), so the evaluation also sees a kind of question never trained on.

Examples:
    >>> items = arithmetic_items(2, families=["add_1d"], seed=0)
    >>> [(i.kind, i.metadata["family"]) for i in items]
    [('numeric', 'add_1d'), ('numeric', 'add_1d')]
    >>> arithmetic_prompt(items[0]).endswith("Answer with just the number.")
    True
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

from capgate.cas.confidence import with_confidence_instruction
from capgate.core.backend import ChatMessage
from capgate.datasets import DatasetItem

__all__ = [
    "FAMILIES",
    "HELD_OUT_FAMILY",
    "TRAIN_FAMILIES",
    "ArithmeticFamily",
    "Split",
    "arithmetic_items",
    "arithmetic_prompt",
    "operand_split",
    "tagged_arithmetic_prompt",
]

Split: TypeAlias = Literal["train", "test"]


@dataclass(frozen=True)
class ArithmeticFamily:
    """One kind of question: an operation on two operands drawn from inclusive ranges.

    Attributes:
        name: Its id (``"mul_2d"``).
        symbol: ``"+"``, ``"-"`` or ``"*"``.
        left: Range of the first operand.
        right: Range of the second operand.
        level: Rough difficulty rank (1 easiest).
    """

    name: str
    symbol: Literal["+", "-", "*"]
    left: tuple[int, int]
    right: tuple[int, int]
    level: int

    def answer(self, a: int, b: int) -> int:
        """The exact result."""
        if self.symbol == "+":
            return a + b
        if self.symbol == "-":
            return a - b
        return a * b


FAMILIES: dict[str, ArithmeticFamily] = {
    f.name: f
    for f in (
        ArithmeticFamily("add_1d", "+", (0, 9), (0, 9), 1),
        ArithmeticFamily("mul_1d", "*", (2, 9), (2, 9), 2),
        ArithmeticFamily("add_2d", "+", (10, 99), (10, 99), 3),
        ArithmeticFamily("sub_2d", "-", (50, 99), (10, 49), 3),
        ArithmeticFamily("mul_2d1d", "*", (11, 99), (3, 9), 4),
        ArithmeticFamily("add_3d", "+", (100, 999), (100, 999), 4),
        ArithmeticFamily("mul_2d", "*", (11, 99), (11, 99), 5),
        ArithmeticFamily("mul_3d", "*", (100, 999), (11, 99), 6),
    )
}
"""The families, easiest first."""

HELD_OUT_FAMILY = "sub_2d"
"""The family kept out of training entirely (its difficulty sits mid-range)."""

TRAIN_FAMILIES: tuple[str, ...] = tuple(name for name in FAMILIES if name != HELD_OUT_FAMILY)

TEST_SHARE = 5
"""One operand pair in ``TEST_SHARE`` is a test pair."""


def operand_split(family: str, a: int, b: int) -> Split:
    """Whether an operand pair of a family belongs to the training or the test questions.

    Examples:
        >>> operand_split("add_2d", 12, 34) in ("train", "test")
        True
    """
    digest = hashlib.sha256(f"{family}:{a}:{b}".encode()).digest()
    return "test" if digest[0] % TEST_SHARE == 0 else "train"


def arithmetic_items(
    n_per_family: int,
    *,
    families: Sequence[str] | None = None,
    split: Split = "train",
    seed: int = 0,
) -> list[DatasetItem]:
    """``n_per_family`` distinct questions of each family, from the operand pairs of ``split``.

    Args:
        n_per_family: Questions per family (fewer where a family has fewer pairs in the split).
        families: Family names (see :data:`FAMILIES`); default all of them.
        split: ``"train"`` or ``"test"`` operand pairs (see :func:`operand_split`).
        seed: Seed of the draw; the same arguments give the same questions.

    Returns:
        ``numeric`` items with ids ``<split>-<family>-<a>-<b>`` and the family and level in
        ``metadata``.

    Raises:
        ValueError: An unknown family, a negative count, or an unknown split.

    Examples:
        >>> [i.question for i in arithmetic_items(1, families=["mul_2d"], split="test", seed=3)]
        ['What is 86 * 28?']
    """
    if n_per_family < 0:
        raise ValueError(f"n_per_family must be >= 0; got {n_per_family}")
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test'; got {split!r}")
    names = list(FAMILIES) if families is None else list(families)
    unknown = [name for name in names if name not in FAMILIES]
    if unknown:
        raise ValueError(f"unknown arithmetic families {unknown}; known: {sorted(FAMILIES)}")
    items: list[DatasetItem] = []
    for name in names:
        family = FAMILIES[name]
        rng = random.Random(f"{seed}:{name}:{split}")
        pool = (family.right[1] - family.right[0] + 1) * (family.left[1] - family.left[0] + 1)
        seen: set[tuple[int, int]] = set()
        tries = 0
        while len(seen) < n_per_family and tries < 50 * max(n_per_family, 1) and len(seen) < pool:
            tries += 1
            a, b = rng.randint(*family.left), rng.randint(*family.right)
            if (a, b) in seen or operand_split(name, a, b) != split:
                continue
            seen.add((a, b))
            items.append(
                DatasetItem(
                    id=f"{split}-{name}-{a}-{b}",
                    question=f"What is {a} {family.symbol} {b}?",
                    references=[str(family.answer(a, b))],
                    kind="numeric",
                    metadata={"family": name, "level": family.level, "split": split},
                )
            )
    return items


def arithmetic_prompt(item: DatasetItem) -> str:
    """The prompt the synthetic questions are asked with: the question and "Answer with just the
    number." (short answers keep completions, and so GRPO steps, short).

    Examples:
        >>> item = DatasetItem(id="q", question="What is 2 + 2?", references=["4"], kind="numeric")
        >>> arithmetic_prompt(item)
        'What is 2 + 2? Answer with just the number.'
    """
    return f"{item.question} Answer with just the number."


def tagged_arithmetic_prompt(item: DatasetItem) -> list[ChatMessage]:
    """:func:`arithmetic_prompt` with the confidence instruction as the system turn: the prompt a
    C3RL-trained model is served with, so harvest the base model's labels with it too (the
    labels then describe the model under the very prompt it is trained on).

    Examples:
        >>> item = DatasetItem(id="q", question="What is 2 + 2?", references=["4"], kind="numeric")
        >>> [m["role"] for m in tagged_arithmetic_prompt(item)]
        ['system', 'user']
    """
    return with_confidence_instruction(arithmetic_prompt(item))
