"""``capgate demo``, live part: a small gated agent on the embedded model, end to end, offline.

The embedded SmolLM2-135M-Instruct and its shipped probe gate a plain "ask the model once"
function (:func:`capgate.guard`, policy ``demo-smollm2``) over real held-out questions (the probe
never saw them in training). Each question's *ungated* answer (the same function, called once, no
gate) is recorded too, for the comparison :func:`capgate.demo.comparison.compare` computes.

**Which questions.** The shipped labels' held-out split (``sdk/assets/default_split.json``: 356
questions from basic_arithmetic, GSM8K, TriviaQA, ARC and MMLU, each with a measured capability
µ̂, the share of its 20 or 40 sampled answers graded correct) is mostly beyond a 135M model (µ̂ = 0
on 57%): a plain random draw gives the gate almost nothing to decide. So :func:`demo_questions`
draws evenly, seeded, from the four strata of µ̂ in :data:`STRATA`, taking from the next stratum
where one runs out; ``n`` up to the whole split returns every held-out question. The rates
describe the drawn questions (richer in answerable ones), not the split.

**The ungated answer** is the function's first sample, with the seed the gated call's first
sample uses: seeded sampling reproduces (``tests/test_transformers_backend.py``), so the demo
generates it once and hands it to the gated call, which returns exactly that text when the policy
answers (a resample draws its further samples live). Time is counted as if both ran: the ungated
agent spends that sample's time, the gated one its own call's plus that sample's when it used it.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any

from capgate.core.types import LabelledQuery
from capgate.datasets import DatasetItem
from capgate.demo.comparison import Comparison, compare
from capgate.labels.labelled import iter_labelled
from capgate.policies import load_policy

if TYPE_CHECKING:
    from capgate.core.backend import Backend
    from capgate.policies import Policy

__all__ = [
    "DEMO_POLICY",
    "STRATA",
    "DemoQuestion",
    "DemoReport",
    "DemoRow",
    "demo_header",
    "demo_questions",
    "describe_policy",
    "held_out_size",
    "labelled_item",
    "question_source",
    "run_demo",
]

DEMO_POLICY = "demo-smollm2"
"""The demo's policy: the shipped preset tuned for the embedded model (``policies/demo-smollm2.yaml``;
its edges sit at the 71st and 94th percentiles of the shipped probe's predictions on the *training*
split, never chosen from the demo questions)."""

STRATA: tuple[tuple[str, float, float], ...] = (
    ("µ̂ = 0", 0.0, 0.0),
    ("0 < µ̂ < 0.2", 0.0, 0.2),
    ("0.2 <= µ̂ < 0.5", 0.2, 0.5),
    ("µ̂ >= 0.5", 0.5, 1.0),
)
"""The strata of measured µ̂ the questions are drawn from evenly: (name, lower, upper); the first
holds µ̂ = 0 exactly, the others ``lower <= µ̂ < upper`` (the last includes 1; the second
excludes 0)."""

MODEL_NAME = "SmolLM2-135M-Instruct (embedded)"


@dataclass(frozen=True)
class DemoQuestion:
    """A held-out question with its prompt, measured capability, source and stratum."""

    item: DatasetItem
    prompt: str
    k: int
    correct: int
    source: str = ""
    stratum: str = ""

    @property
    def mu_hat(self) -> float:
        """Measured capability: correct / k."""
        return self.correct / self.k


@dataclass(frozen=True)
class DemoRow:
    """What happened to one question, with and without the gate.

    Attributes:
        question: The question.
        p: The probe's estimate (``None`` when unavailable).
        action: The policy's action.
        answer: The gated agent's extracted answer, ``None`` when the gate stopped the call.
        correct: Whether that answer is right (``None`` when stopped).
        samples: Calls of the model the gated agent made.
        message: The gate's message when it stopped the call.
        text: The gated agent's raw response.
        ungated_answer: The ungated agent's extracted answer (``None``: no answer found).
        ungated_correct: Whether the ungated agent was right.
        ungated_text: The ungated agent's raw response.
        ungated_seconds: Time the ungated agent spent (one sample).
        gated_seconds: Time the gated agent spent (estimate, samples).
    """

    question: DemoQuestion
    p: float | None
    action: str
    answer: str | None
    correct: bool | None
    samples: int
    message: str | None
    text: str | None = None
    ungated_answer: str | None = None
    ungated_correct: bool = False
    ungated_text: str = ""
    ungated_seconds: float = 0.0
    gated_seconds: float = 0.0

    @property
    def answered(self) -> bool:
        """Whether the gated agent returned an answer (``answer``, or a resample that found one)."""
        return self.correct is not None


@dataclass
class DemoReport:
    """The whole live run."""

    rows: list[DemoRow] = field(default_factory=list)
    seconds: float = 0.0
    header: str = ""
    policy: str = DEMO_POLICY
    seed: int = 0

    def comparison(self) -> Comparison:
        """Without the gate against with the gate, over these rows
        (:func:`capgate.demo.comparison.compare`)."""
        return compare(self.rows)

    def summary(self) -> dict[str, float]:
        """Calibration of the probe on the demo questions: mean p, mean µ̂, capability Brier, AUROC."""
        from capgate.metrics import auroc, capability_brier

        scored = [r for r in self.rows if r.p is not None]
        p = [r.p for r in scored if r.p is not None]
        mu = [r.question.mu_hat for r in scored]
        out = {
            "questions": float(len(self.rows)),
            "estimates": float(len(p)),
            "mean_mu_hat": sum(mu) / len(mu) if mu else float("nan"),
            "mean_p": sum(p) / len(p) if p else float("nan"),
        }
        if p:
            out["capability_brier"] = capability_brier(p, mu)
            correct = [r.question.correct for r in scored]
            k = [r.question.k for r in scored]
            if 0 < sum(correct) < sum(k):
                out["auroc"] = auroc(p, correct, k=k)
        return out


def question_source(record: LabelledQuery) -> str:
    """The benchmark a shipped label record comes from (``bench/probe_smollm2.py``,
    ``bench/default_probe_v2.py``), read from its kind and id: numeric items are GSM8K (ids
    ``gsm...``) or basic_arithmetic, alias items TriviaQA, choice items MMLU (ids ``mmlu_...``) or
    ARC (Easy and Challenge)."""
    kind = (record.model_extra or {}).get("kind", "alias")
    if kind == "numeric":
        return "GSM8K" if record.id.startswith("gsm") else "basic_arithmetic"
    if kind == "choice":
        return "MMLU" if record.id.startswith("mmlu_") else "ARC"
    return "TriviaQA"


def _held_out() -> list[LabelledQuery]:
    assets = resources.files("capgate.assets")
    held_out = set(json.loads((assets / "default_split.json").read_text(encoding="utf-8"))["test"])
    return [r for _, r in iter_labelled(str(assets / "default_labels.jsonl")) if r.id in held_out]


def held_out_size() -> int:
    """How many questions the held-out split has (the most ``--questions`` can ask for)."""
    return len(_held_out())


def _stratum(mu_hat: float) -> str:
    if mu_hat == 0.0:
        return STRATA[0][0]
    for name, lower, upper in STRATA[1:]:
        if lower <= mu_hat < upper or (upper == 1.0 and mu_hat == 1.0):
            return name
    raise ValueError(f"µ̂ must be in [0, 1]; got {mu_hat}")  # pragma: no cover - labels are checked


def demo_questions(n: int, *, seed: int = 0) -> list[DemoQuestion]:
    """``n`` held-out questions drawn evenly from the strata of measured µ̂ (seeded; see the module).

    Raises:
        ValueError: ``n`` is not between 1 and the held-out split's size.
    """
    records = _held_out()
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= len(records):
        raise ValueError(f"`n` must be an integer from 1 to {len(records)} (the held-out split); got {n!r}")
    rng = random.Random(seed)
    pools: dict[str, list[LabelledQuery]] = {name: [] for name, _, _ in STRATA}
    for record in sorted(records, key=lambda r: r.id):
        pools[_stratum(record.correct / record.k)].append(record)
    for pool in pools.values():
        rng.shuffle(pool)
    chosen: list[tuple[str, LabelledQuery]] = []
    while len(chosen) < n:  # round robin over the strata that still have questions
        for name, pool in pools.items():
            if pool and len(chosen) < n:
                chosen.append((name, pool.pop()))
    rng.shuffle(chosen)
    return [
        DemoQuestion(
            item=labelled_item(record),
            prompt=str((record.model_extra or {})["prompt"]),
            k=record.k,
            correct=record.correct,
            source=question_source(record),
            stratum=name,
        )
        for name, record in chosen
    ]


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


def describe_policy(policy: Policy) -> str:
    """The policy's bands in words, from the loaded policy (never a literal).

    Examples:
        >>> print(describe_policy(load_policy("demo-smollm2")).replace("; ", "\\n"))
        abstain p < 0.13
        resample (CAS, <= 6 samples) 0.13 <= p < 0.26
        answer p >= 0.26
        no estimate: abstain
    """
    rule = policy.rule()
    parts = []
    last = len(rule.bands) - 1
    for i, (band, (lower, upper)) in enumerate(zip(rule.bands, rule.edges, strict=True)):
        what = f"resample (CAS, <= {band.max_samples} samples)" if band.action == "resample" else band.action
        if lower <= 0.0:
            where = f"p < {upper:g}" if i < last else "any p"
        elif i == last:
            where = f"p >= {lower:g}"
        else:
            where = f"{lower:g} <= p < {upper:g}"
        parts.append(f"{what} {where}")
    parts.append(f"no estimate: {rule.on_degraded.action}")
    return "; ".join(parts)


def demo_header(policy: Policy, questions: Sequence[DemoQuestion], *, seed: int) -> str:
    """The live part's header: model, policy (from the loaded policy), where the questions come from."""
    sources = Counter(q.source for q in questions)
    strata = Counter(q.stratum for q in questions)
    ks = sorted({q.k for q in questions})
    return "\n".join(
        [
            f"LIVE: {MODEL_NAME} + its shipped capability probe, answering now on this machine.",
            f"Policy '{policy.name}': {describe_policy(policy)}.",
            f"Questions: {len(questions)} held-out (never seen by the probe's fit) from "
            + ", ".join(f"{name} {count}" for name, count in sorted(sources.items()))
            + f"; drawn evenly over measured µ̂ (seed {seed}; not the split's mix): "
            + ", ".join(f"{name}: {strata[name]}" for name, _, _ in STRATA if strata[name])
            + f"; µ̂ = share of {' or '.join(map(str, ks))} sampled answers graded correct.",
        ]
    )


def _counting_ask(
    backend: Backend, seed: int, first: str | None = None
) -> tuple[Callable[[str], str], list[int]]:
    """A plain "ask the model once" function, and a counter of its calls (the samples spent).

    Call ``i`` samples with seed ``seed * 1000 + i``; ``first``, when given, is the text call 1
    generates (produced earlier with the same seed) and is returned without generating it again.
    """
    from capgate.core.backend import SamplingParams

    calls = [0]

    def ask(prompt: str) -> str:
        calls[0] += 1
        if calls[0] == 1 and first is not None:
            return first
        params = SamplingParams(n=1, temperature=0.7, max_tokens=24, seed=seed * 1000 + calls[0])
        return backend.generate([prompt], params)[0][0].text

    return ask, calls


def _warm_up(backend: Backend, estimator: Any, prompt: str) -> None:
    """One short generation and one estimate before the clock starts, so that loading the weights
    and the first call's set-up are not counted as the first question's time."""
    from capgate.core.backend import SamplingParams

    backend.generate([prompt], SamplingParams(n=1, max_tokens=1, seed=0))
    estimator.estimate_one(prompt)


def run_demo(
    *,
    n_questions: int = 12,
    seed: int = 0,
    on_row: Callable[[int, DemoRow], None] | None = None,
    on_start: Callable[[str], None] | None = None,
) -> DemoReport:
    """Run the ungated and the gated agent over ``n_questions`` held-out questions.

    Args:
        n_questions: How many questions (1 to :func:`held_out_size`).
        seed: Seed of the question draw and of sampling.
        on_row: Called after each question with its index and row (progress, printing).
        on_start: Called with the header once the questions are drawn (before the model loads).

    Raises:
        ValueError: ``n_questions`` out of range.
    """
    from capgate import guard
    from capgate.adapters.backends.transformers import load_backend
    from capgate.gate import Gated
    from capgate.grading import grader_for
    from capgate.loading import load_estimator

    policy = load_policy(DEMO_POLICY)
    questions = demo_questions(n_questions, seed=seed)
    report = DemoReport(header=demo_header(policy, questions, seed=seed), policy=policy.name, seed=seed)
    if on_start is not None:
        on_start(report.header)
    estimator = load_estimator("default", device="cpu")
    backend = load_backend("default", device="cpu")
    _warm_up(backend, estimator, questions[0].prompt)
    start = time.perf_counter()
    for index, question in enumerate(questions):
        grader = grader_for(question.item)
        plain, _ = _counting_ask(backend, seed)
        began = time.perf_counter()
        ungated_text = plain(question.prompt)
        ungated_seconds = time.perf_counter() - began
        ungated = grader.judge(ungated_text, question.item)
        ask, calls = _counting_ask(backend, seed, first=ungated_text)
        gated_ask = guard(policy=policy, estimator=estimator, extract=grader.extract)(ask)
        began = time.perf_counter()
        result = gated_ask(question.prompt)
        gated_seconds = time.perf_counter() - began + (ungated_seconds if calls[0] >= 1 else 0.0)
        decision = gated_ask.stats.last_decision
        if decision is None:  # pragma: no cover - a guarded call always decides
            raise RuntimeError("the guarded call recorded no decision")
        common: dict[str, Any] = {
            "ungated_answer": ungated.answer,
            "ungated_correct": ungated.correct,
            "ungated_text": ungated_text.strip(),
            "ungated_seconds": ungated_seconds,
            "gated_seconds": gated_seconds,
        }
        if isinstance(result, Gated):
            row = DemoRow(
                question, decision.estimate.p, decision.action, None, None, calls[0], result.message, **common
            )
        else:
            judgement = grader.judge(result, question.item)
            answer = judgement.answer if judgement.answer is not None else "(no answer found)"
            row = DemoRow(
                question,
                decision.estimate.p,
                decision.action,
                answer,
                judgement.correct,
                calls[0],
                None,
                text=result.strip(),
                **common,
            )
        report.rows.append(row)
        if on_row is not None:
            on_row(index, row)
    report.seconds = time.perf_counter() - start
    return report
