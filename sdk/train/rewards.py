"""The C3RL reward terms, as TRL reward functions (and as one pure scoring function).

A TRL reward function is called as ``f(prompts=..., completions=..., completion_ids=..., **columns)``
where every dataset column other than the prompt arrives as a keyword list; it returns one float
per completion. The training dataset built by :func:`capgate.train.trainer.train_c3rl` carries two
columns these functions read: ``item`` (the :class:`~capgate.datasets.DatasetItem` as JSON, for its
grader and references) and ``reference_class`` (see :data:`ReferenceClass`).

Only the completion is read: a tag quoted in the question (the prompt) counts for nothing, and of
the completion's tags only the last one counts.

Examples:
    >>> from capgate.datasets import DatasetItem
    >>> item = DatasetItem(id="q", question="What is 2 + 3?", references=["5"], kind="numeric")
    >>> score_completion("5 [confidence=90%]", item, "partly").total
    1.5
    >>> score_completion("6 [confidence=90%]", item, "all_right").total
    -1.0
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from capgate.cas.confidence import TAG_DIGIT, strip_confidence_tag
from capgate.datasets import DatasetItem
from capgate.grading import grader_for
from capgate.train.config import C3RLRewardConfig

__all__ = [
    "REFERENCE_CLASSES",
    "C3RLReward",
    "ReferenceClass",
    "RewardBreakdown",
    "TagStatus",
    "c3rl_reward_functions",
    "completion_text",
    "read_tag",
    "reference_class",
    "score_completion",
]

ReferenceClass: TypeAlias = Literal["all_right", "partly", "all_wrong"]
"""How the base model did on a question in its k labelled samples: every one right, some, none."""

REFERENCE_CLASSES: tuple[ReferenceClass, ...] = ("all_right", "partly", "all_wrong")

TagStatus: TypeAlias = Literal["ok", "missing", "malformed"]
"""A completion's tag: well formed, absent, or present but not ``[confidence=X%]`` with X in 0..100
step 5 as the completion's last words."""

TAG_STEP = 5
"""Stated confidences are whole percentages in steps of 5 (0, 5, ..., 100)."""

_ANY_TAG = re.compile(r"\[\s*confidence\s*[=:]", re.IGNORECASE)
_LAST_WORDS_TAG = re.compile(rf"\[confidence=({TAG_DIGIT}{{1,3}})%\]\s*\Z")  # ASCII digits, as served
_CUT_TAG = re.compile(r"\[\s*confidence[^\]]*\Z", re.IGNORECASE)  # a tag cut off by the length limit


def reference_class(correct: int, k: int) -> ReferenceClass:
    """The reference class of a question the base model got ``correct`` of ``k`` samples right.

    Examples:
        >>> reference_class(10, 10), reference_class(3, 10), reference_class(0, 10)
        ('all_right', 'partly', 'all_wrong')
    """
    if k < 1 or not 0 <= correct <= k:
        raise ValueError(f"need 0 <= correct <= k and k >= 1; got correct={correct}, k={k}")
    if correct == k:
        return "all_right"
    return "all_wrong" if correct == 0 else "partly"


def read_tag(text: str) -> tuple[float | None, TagStatus]:
    """The confidence a completion states, and whether its tag is well formed.

    Well formed means the completion ends (trailing whitespace aside) with exactly
    ``[confidence=X%]``, X a whole number from 0 to 100 in steps of 5. A completion with no
    ``[confidence...`` at all is ``"missing"``; any other is ``"malformed"`` (a tag followed by
    more text, ``[confidence=0.8]``, ``[confidence=83%]``, ``[confidence=high]``, 120%...).

    Examples:
        >>> read_tag("42 [confidence=85%]")
        (0.85, 'ok')
        >>> read_tag("42 [confidence=83%]"), read_tag("42")
        ((None, 'malformed'), (None, 'missing'))
    """
    if not _ANY_TAG.search(text):
        return None, "missing"
    match = _LAST_WORDS_TAG.search(text)
    if match is None:
        return None, "malformed"
    percent = int(match.group(1))
    if percent > 100 or percent % TAG_STEP:
        return None, "malformed"
    return percent / 100.0, "ok"


def completion_text(completion: Any) -> str:
    """The text of a TRL completion: a string, or the last message of a chat completion.

    Examples:
        >>> completion_text([{"role": "assistant", "content": "4 [confidence=80%]"}])
        '4 [confidence=80%]'
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and completion:
        last = completion[-1]
        if isinstance(last, dict):
            content = last.get("content")
            return content if isinstance(content, str) else str(content or "")
    return str(completion or "")


@functools.lru_cache(maxsize=4096)
def _item(item_json: str) -> DatasetItem:
    return DatasetItem.model_validate_json(item_json)


@functools.lru_cache(maxsize=16384)
def _is_correct(text: str, item_json: str) -> bool:
    item = _item(item_json)
    answer = _CUT_TAG.sub("", strip_confidence_tag(text))  # "[confidence=90" is no answer either
    return grader_for(item).grade(answer, item)


@dataclass(frozen=True)
class RewardBreakdown:
    """One completion's reward, term by term.

    Attributes:
        correct: Whether the answer (tag stripped) is right.
        stated: The well-formed tag's confidence, else ``None``.
        tag: The tag's status.
        correctness: +1 right, 0 wrong.
        calibration: ±beta (0 without a well-formed tag).
        reference: +alpha, -alpha or 0.
        format: 0, or -format_penalty.
        brier: ``brier * (1 - (c - x)^2)`` (0 when off or without a well-formed tag).
    """

    correct: bool
    stated: float | None
    tag: TagStatus
    correctness: float
    calibration: float
    reference: float
    format: float
    brier: float

    @property
    def total(self) -> float:
        """The sum of the terms: what GRPO maximizes."""
        return self.correctness + self.calibration + self.reference + self.format + self.brier


def score_completion(
    completion: str,
    item: DatasetItem,
    reference: ReferenceClass,
    config: C3RLRewardConfig | None = None,
) -> RewardBreakdown:
    """Score one completion to ``item`` with the C3RL reward (see :class:`C3RLRewardConfig`).

    Args:
        completion: The model's text only (never the prompt).
        item: The question, its references and kind (which picks the grader).
        reference: The question's :data:`ReferenceClass` from the base model's labels.
        config: The reward's weights; default :class:`C3RLRewardConfig`.

    Examples:
        >>> from capgate.datasets import DatasetItem
        >>> item = DatasetItem(id="q", question="7 * 8?", references=["56"], kind="numeric")
        >>> b = score_completion("54 [confidence=100%]", item, "partly")
        >>> b.correct, b.calibration, b.total
        (False, -0.5, -0.5)
    """
    config = config or C3RLRewardConfig()
    if reference not in REFERENCE_CLASSES:
        raise ValueError(f"reference must be one of {REFERENCE_CLASSES}; got {reference!r}")
    correct = _is_correct(completion, item.model_dump_json())
    stated, tag = read_tag(completion)
    calibration = brier = 0.0
    if stated is not None:
        sure = stated > config.threshold
        calibration = config.beta if sure == correct else -config.beta
        if config.brier:
            brier = config.brier * (1.0 - (float(correct) - stated) ** 2)
    ref = 0.0
    if correct and reference == "all_wrong":
        ref = config.alpha
    elif not correct and reference == "all_right":
        ref = -config.alpha
    return RewardBreakdown(
        correct=correct,
        stated=stated,
        tag=tag,
        correctness=1.0 if correct else 0.0,
        calibration=calibration,
        reference=ref,
        format=0.0 if tag == "ok" else -config.format_penalty,
        brier=brier,
    )


class C3RLReward:
    """One term of the C3RL reward as a TRL reward function (its ``__name__`` is what TRL logs:
    ``rewards/c3rl_<term>/mean``).

    Args:
        term: ``"correctness"``, ``"calibration"``, ``"reference"``, ``"format"`` or ``"brier"``.
        config: The reward's weights.

    Examples:
        >>> from capgate.datasets import DatasetItem
        >>> item = DatasetItem(id="q", question="2 + 2?", references=["4"], kind="numeric")
        >>> f = C3RLReward("calibration", C3RLRewardConfig())
        >>> f(prompts=["2 + 2? [confidence=100%]"], completions=["4 [confidence=10%]"],
        ...   item=[item.model_dump_json()], reference_class=["partly"])
        [-0.5]
    """

    TERMS = ("correctness", "calibration", "reference", "format", "brier")

    def __init__(self, term: str, config: C3RLRewardConfig) -> None:
        if term not in self.TERMS:
            raise ValueError(f"term must be one of {self.TERMS}; got {term!r}")
        self.term = term
        self.config = config
        self.__name__ = f"c3rl_{term}"

    def __call__(
        self,
        prompts: Sequence[Any] | None = None,
        completions: Sequence[Any] = (),
        *,
        item: Sequence[str] = (),
        reference_class: Sequence[str] = (),
        **kwargs: Any,
    ) -> list[float]:
        del prompts, kwargs  # the prompt is never read: a tag planted there counts for nothing
        if not len(completions) == len(item) == len(reference_class):
            raise ValueError(
                f"{self.__name__}: got {len(completions)} completions, {len(item)} items and "
                f"{len(reference_class)} reference classes; the dataset needs 'item' and "
                "'reference_class' columns"
            )
        scores: list[float] = []
        for completion, item_json, ref in zip(completions, item, reference_class, strict=True):
            breakdown = score_completion(completion_text(completion), _item(item_json), ref, self.config)  # type: ignore[arg-type]
            scores.append(float(getattr(breakdown, self.term)))
        return scores

    def __repr__(self) -> str:
        return f"C3RLReward({self.term!r}, {self.config!r})"


def c3rl_reward_functions(config: C3RLRewardConfig | None = None) -> list[Callable[..., list[float]]]:
    """The reward functions to hand TRL: correctness, calibration, reference, format, and brier
    when ``config.brier > 0``. Their sum is :attr:`RewardBreakdown.total`.

    Examples:
        >>> [f.__name__ for f in c3rl_reward_functions(C3RLRewardConfig(brier=1.0))][-1]
        'c3rl_brier'
    """
    config = config or C3RLRewardConfig()
    terms = ["correctness", "calibration", "reference", "format"] + (["brier"] if config.brier else [])
    return [C3RLReward(term, config) for term in terms]
