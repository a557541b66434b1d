"""``capgate demo``: a small gated agent on the embedded model, end to end, offline.

The demo loads the embedded SmolLM2-135M-Instruct and the probe shipped for it, wraps a plain
"ask the model" function with :func:`capgate.guard`, runs it over real held-out questions (the
probe never saw them in training), and reports each decision and a final table: accuracy among
answered questions, coverage, samples spent, and the probe's calibration against µ̂ measured
from 20 or 40 sampled answers per question.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from capgate._types import LabelledQuery
from capgate.backend import Backend
from capgate.datasets import DatasetItem
from capgate.labels import iter_labelled
from capgate.policies import load_policy

__all__ = [
    "DEMO_POLICY",
    "DemoQuestion",
    "DemoReport",
    "DemoRow",
    "demo_questions",
    "labelled_item",
    "run_demo",
]

DEMO_POLICY = "demo-smollm2"
"""The demo's policy: the shipped preset tuned for the embedded model (``policies/demo-smollm2.yaml``;
its edges sit at the 71st and 94th percentiles of the shipped probe's predictions on the *training*
split, never chosen from the demo questions)."""


@dataclass(frozen=True)
class DemoQuestion:
    """A held-out question with its prompt and measured capability."""

    item: DatasetItem
    prompt: str
    k: int
    correct: int

    @property
    def mu_hat(self) -> float:
        """Measured capability: correct / k."""
        return self.correct / self.k


@dataclass(frozen=True)
class DemoRow:
    """What happened to one question."""

    question: DemoQuestion
    p: float | None
    action: str
    answer: str | None  # the extracted, normalized answer
    correct: bool | None
    samples: int
    message: str | None
    text: str | None = None


@dataclass
class DemoReport:
    """The whole run."""

    rows: list[DemoRow] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> dict[str, float]:
        """Coverage, accuracy among answered, samples spent, calibration on the demo questions."""
        from capgate.metrics import auroc, capability_brier

        answered = [r for r in self.rows if r.answer is not None]
        scored = [r for r in self.rows if r.p is not None]
        p = [r.p for r in scored if r.p is not None]
        mu = [r.question.mu_hat for r in scored]
        out = {
            "questions": float(len(self.rows)),
            "coverage": len(answered) / len(self.rows) if self.rows else float("nan"),
            "accuracy_answered": (
                sum(bool(r.correct) for r in answered) / len(answered) if answered else float("nan")
            ),
            "samples": float(sum(r.samples for r in self.rows)),
            "mean_mu_hat": sum(mu) / len(mu) if mu else float("nan"),
            "mean_p": sum(p) / len(p) if p else float("nan"),
        }
        if p:
            out["capability_brier"] = capability_brier(p, mu)
            out["auroc"] = auroc(p, [r.question.correct for r in scored], k=[r.question.k for r in scored])
        return out


def _asset(name: str) -> Path:
    return Path(str(resources.files("capgate.assets") / name))


def demo_questions(n: int, *, seed: int = 0) -> list[DemoQuestion]:
    """``n`` held-out questions from the shipped labels, drawn across the datasets (seeded)."""
    split = json.loads(_asset("default_split.json").read_text(encoding="utf-8"))
    held_out = set(split["test"])
    records: list[LabelledQuery] = [
        r for _, r in iter_labelled(_asset("default_labels.jsonl")) if r.id in held_out
    ]
    random.Random(seed).shuffle(records)
    chosen = records[:n]
    questions = []
    for record in chosen:
        extra: dict[str, Any] = record.model_extra or {}
        questions.append(
            DemoQuestion(
                item=labelled_item(record), prompt=str(extra["prompt"]), k=record.k, correct=record.correct
            )
        )
    return questions


def labelled_item(record: LabelledQuery) -> DatasetItem:
    """The query a harvested label record was sampled for, as a :class:`DatasetItem` to grade against.

    ``kind`` and ``choices`` come from the record's extra fields, as the harvest writes them
    (``kind`` defaults to ``alias``).
    """
    extra: dict[str, Any] = record.model_extra or {}
    return DatasetItem(
        id=record.id,
        question=record.question or "",
        references=record.references,
        kind=extra.get("kind", "alias"),
        choices=extra.get("choices"),
    )


def _counting_ask(backend: Backend, seed: int) -> tuple[Callable[[str], str], list[int]]:
    """A plain "ask the model once" function, and a counter of its calls (the samples spent)."""
    from capgate.backend import SamplingParams

    calls = [0]

    def ask(prompt: str) -> str:
        calls[0] += 1
        params = SamplingParams(n=1, temperature=0.7, max_tokens=24, seed=seed * 1000 + calls[0])
        return backend.generate([prompt], params)[0][0].text

    return ask, calls


def run_demo(
    *,
    n_questions: int = 12,
    seed: int = 0,
    on_row: Callable[[int, DemoRow], None] | None = None,
) -> DemoReport:
    """Run the gated agent over ``n_questions`` held-out questions.

    Args:
        n_questions: How many questions.
        seed: Seed of the question draw and of sampling.
        on_row: Called after each question with its index and row (progress, printing).
    """
    from capgate import guard
    from capgate.adapters.backends.transformers import load_backend
    from capgate.gate import Gated
    from capgate.grading import grader_for
    from capgate.loading import load_estimator

    policy = load_policy(DEMO_POLICY)
    estimator = load_estimator("default", device="cpu")
    backend = load_backend("default", device="cpu")
    report = DemoReport()
    start = time.perf_counter()
    for index, question in enumerate(demo_questions(n_questions, seed=seed)):
        grader = grader_for(question.item)
        ask, calls = _counting_ask(backend, seed)
        gated_ask = guard(policy=policy, estimator=estimator, extract=grader.extract)(ask)
        result = gated_ask(question.prompt)
        decision = gated_ask.stats.last_decision
        assert decision is not None
        if isinstance(result, Gated):
            row = DemoRow(
                question, decision.estimate.p, decision.action, None, None, calls[0], result.message
            )
        else:
            judgement = grader.judge(result, question.item)
            row = DemoRow(
                question,
                decision.estimate.p,
                decision.action,
                judgement.answer if judgement.answer is not None else "(no answer found)",
                judgement.correct,
                calls[0],
                None,
                text=result.strip(),
            )
        report.rows.append(row)
        if on_row is not None:
            on_row(index, row)
    report.seconds = time.perf_counter() - start
    return report
