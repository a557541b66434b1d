"""``capgate demo``, verbalized part: the embedded model taught by C3RL to say how sure it is, beside
the probe.

capgate ships a LoRA adapter that ``capgate train c3rl`` trained on the embedded SmolLM2-135M-Instruct
(``bench/c3rl.py``; its figures in bench/RESULTS.md). Merged in (``load_estimator("default-c3rl",
method="verbalized")``), the model ends each answer with ``[confidence=X%]``, and
:class:`~capgate.estimators.VerbalizedConfidence` reads that tag: an estimate for models whose hidden
states nobody can read. This part asks it graded arithmetic it never trained on (test operand pairs
of :mod:`capgate.train.synthetic`, the ``sub_2d`` family held out of training entirely) and shows,
per question, what it states and whether its answer was right, beside the shipped probe's estimate
(which reads the *base* model's hidden states and predicts the base model's capability).

What to expect, measured in the bench: the stated value tracks the *kind* of question (sure of
one-digit sums, unsure of three-digit products), not whether a given answer of a kind it half
masters is right.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from capgate.core.backend import SamplingParams
from capgate.estimators import CapabilityEstimator, VerbalizedConfidence
from capgate.grading import NumericGrader
from capgate.train.synthetic import HELD_OUT_FAMILY, arithmetic_items, arithmetic_prompt

FAMILIES = ("add_1d", "mul_1d", "add_2d", "mul_2d", HELD_OUT_FAMILY)
"""The question families shown: easy to impossible for a 135M model, and the held-out one."""

SAMPLING = SamplingParams(temperature=0.3, max_tokens=24)
"""The bench's sampling (seeded per run)."""


@dataclass(frozen=True)
class VerbalizedRow:
    """One question: the trained model's answer, what it stated, and the probe's estimate."""

    question: str
    family: str
    answer: str | None
    correct: bool | None
    """Whether its answer was right; None when no answer could be read (no tag to end it)."""
    stated: float | None
    """The ``[confidence=X%]`` the trained model ended its answer with (None: no readable tag)."""
    probe: float | None
    """The probe's capability estimate for the base model (None when it had none)."""
    reason: str | None = None


@dataclass(frozen=True)
class VerbalizedReport:
    """The verbalized part's rows and what they took."""

    model_id: str
    rows: list[VerbalizedRow] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def tag_rate(self) -> float:
        """The share of its answers that ended with a readable tag (one answer a row: the model is
        asked once, never again until it tags)."""
        return sum(r.stated is not None for r in self.rows) / len(self.rows) if self.rows else 0.0

    def mean_stated(self, *, correct: bool) -> float | None:
        """The mean stated confidence over the tagged answers that were right (or wrong)."""
        values = [r.stated for r in self.rows if r.stated is not None and r.correct is correct]
        # an untagged answer has neither a stated value nor a grade: it counts in tag_rate only
        return sum(values) / len(values) if values else None

    def to_dict(self) -> dict[str, object]:
        return {
            "model_id": self.model_id,
            "seconds": self.seconds,
            "tag_rate": self.tag_rate,
            "mean_stated_right": self.mean_stated(correct=True),
            "mean_stated_wrong": self.mean_stated(correct=False),
            "rows": [vars(row) for row in self.rows],
        }


def run_verbalized(
    trained: VerbalizedConfidence,
    probe: CapabilityEstimator | None = None,
    *,
    per_family: int = 2,
    seed: int = 0,
    on_row: Callable[[int, VerbalizedRow], None] | None = None,
) -> VerbalizedReport:
    """Ask the trained model ``per_family`` test questions of each of :data:`FAMILIES`.

    Args:
        trained: The estimator reading a C3RL-trained model's tag
            (``capgate.load_estimator("default-c3rl", method="verbalized")``); its sampling is
            set to :data:`SAMPLING` with ``seed``, and it asks once a question (``max_tries=1``),
            so each row is one answer as the model gave it and the tag rate counts its answers.
        probe: An estimator to show beside it (the shipped probe), or None.
        per_family: Questions per family.
        seed: Seed of the question draw and of the sampling.
        on_row: Called with each row as it is done.
    """
    trained.set_params(params=SAMPLING.model_copy(update={"seed": seed}), max_tries=1)
    grader = NumericGrader()
    items = arithmetic_items(per_family, families=list(FAMILIES), split="test", seed=seed)
    started = time.perf_counter()
    rows: list[VerbalizedRow] = []
    for index, item in enumerate(items):
        prompt = arithmetic_prompt(item)
        estimate = trained.estimate_one(prompt)
        answer = estimate.details.get("answer")
        beside = probe.estimate_one(prompt) if probe is not None else None
        row = VerbalizedRow(
            question=item.question,
            family=str(item.metadata["family"]),
            answer=grader.extract(answer) if isinstance(answer, str) else None,
            correct=grader.grade(answer, item) if isinstance(answer, str) else None,
            stated=estimate.p if estimate.usable else None,
            probe=beside.p if beside is not None and beside.usable else None,
            reason=estimate.reason,
        )
        rows.append(row)
        if on_row is not None:
            on_row(index, row)
    seconds = time.perf_counter() - started
    return VerbalizedReport(model_id=str(trained.backend.model_id), rows=rows, seconds=seconds)
