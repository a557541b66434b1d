"""Core value types shared by every layer of capgate (pydantic, and the plans of :mod:`capgate.core.plans`).

``Estimate`` is what every capability estimator returns; ``LabelledQuery`` is one query with the
outcome of sampling the model k times on it (µ̂ = correct / k), the training and evaluation target;
``Decision`` is what a policy decided for one query, self-contained (see its docstring); ``Outcome``
is what happened afterwards.
"""

from __future__ import annotations

import math
import os
import random
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, TypeAlias

import numpy as np
import numpy.typing as npt
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from capgate.core.plans import (
    CASMode,
    ConfidenceGap,
    PaperConfidenceGap,
    Probability,
    RoutePlan,
    SamplingPlan,
    StopSettings,
)

__all__ = [
    "Action",
    "CASMode",
    "ConfidenceGap",
    "Cost",
    "Decision",
    "Estimate",
    "Extractor",
    "LabelledQuery",
    "Mode",
    "Outcome",
    "PaperConfidenceGap",
    "ReaderFeatures",
    "RoutePlan",
    "Sample",
    "SamplingPlan",
    "Speculation",
    "StopSettings",
]


class Cost(BaseModel):
    """What producing an estimate (or an answer) cost.

    Attributes:
        prompt_tokens: Tokens read (prefill) across all calls.
        completion_tokens: Tokens generated across all calls.
        forward_passes: Model forward passes (a prefill counts as one per sequence).
        calls: Requests made to a backend (remote or local).
        latency_s: Wall-clock seconds spent.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    prompt_tokens: int = Field(default=0, ge=0)
    completion_tokens: int = Field(default=0, ge=0)
    forward_passes: int = Field(default=0, ge=0)
    calls: int = Field(default=0, ge=0)
    latency_s: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)

    def __add__(self, other: Cost) -> Cost:
        return Cost(**{name: getattr(self, name) + getattr(other, name) for name in Cost.model_fields})


class ReaderFeatures:
    """The features an estimator's reader computed for one query, carried beside its estimate.

    Never serialized and never compared: two estimates with the same fields are equal whatever
    features they carry (a gate with ``log_features`` writes them to its log without a second pass).

    Attributes:
        vector: The query's feature vector (float32, shape ``(dim,)``).
        spec: The reader's feature spec, as a JSON-able dict (model, fingerprint, layers, dim...).
    """

    __slots__ = ("spec", "vector")

    def __init__(self, vector: npt.NDArray[np.float32], spec: dict[str, Any]) -> None:
        self.vector = vector
        self.spec = spec

    def __eq__(self, other: object) -> bool:
        return True  # features ride along; they never make two estimates differ

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"ReaderFeatures(dim={self.vector.shape[-1]}, model_id={self.spec.get('model_id')!r})"


class Estimate(BaseModel):
    """A predicted capability µ(x): the probability that a sampled response is correct.

    ``p`` is ``None`` exactly when no estimate could be had (server down, unparsable answer);
    then ``degraded`` is true and ``reason`` says why. A usable but weakened estimate (say, a
    fallback estimator answered) may carry a value *and* ``degraded=True``. capgate never
    substitutes a silent 0.5: policies act on ``degraded`` through their declared fallback.

    Attributes:
        p: Predicted capability in [0, 1], or ``None`` if unavailable.
        method: Name of the estimator that produced it (``"probe"``, ``"verbalized"``...).
        degraded: Whether the estimate is missing or weakened.
        reason: Why it is degraded; required when ``degraded`` is true.
        cost: What the estimate cost.
        details: Free-form, JSON-serialisable diagnostics (raw model text, parsed tokens...).

    Examples:
        >>> Estimate(p=0.8, method="probe").usable
        True
        >>> Estimate.unavailable("verbalized", "no \\\\boxed{} after 3 tries").usable
        False
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    p: Probability | None
    method: str = Field(min_length=1)
    degraded: bool = False
    reason: str | None = None
    cost: Cost = Field(default_factory=Cost)
    details: dict[str, Any] = Field(default_factory=dict)
    _features: ReaderFeatures | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _check_degraded(self) -> Estimate:
        if self.p is None and not self.degraded:
            raise ValueError("an Estimate without a value (p=None) must be degraded=True with a reason")
        if self.degraded and not self.reason:
            raise ValueError("a degraded Estimate needs a non-empty reason")
        return self

    @property
    def usable(self) -> bool:
        """True when the estimate carries a value a policy may threshold on."""
        return self.p is not None

    @classmethod
    def unavailable(cls, method: str, reason: str, *, cost: Cost | None = None, **details: Any) -> Estimate:
        """An estimate that could not be had; policies route it to their ``on_degraded`` action."""
        return cls(p=None, method=method, degraded=True, reason=reason, cost=cost or Cost(), details=details)

    def with_features(self, vector: npt.ArrayLike, spec: dict[str, Any]) -> Estimate:
        """A copy carrying the reader features the estimate was made from (:meth:`features`); the
        vector is copied (float32), so the estimate never keeps a whole batch alive."""
        copy = self.model_copy()
        copy._features = ReaderFeatures(np.array(vector, dtype=np.float32, copy=True), dict(spec))
        return copy

    def features(self) -> ReaderFeatures | None:
        """The reader features this estimate was made from, when its estimator kept them (a
        probe does); ``None`` otherwise. Kept in memory only: never serialized or compared.

        Examples:
            >>> plain = Estimate(p=0.7, method="probe")
            >>> e = plain.with_features([1.0, 2.0], {"model_id": "m", "dim": 2})
            >>> e.features().vector.tolist(), e == plain, "1.0" in e.model_dump_json()
            ([1.0, 2.0], True, False)
        """
        return self._features


class Sample(BaseModel):
    """One sampled response to a labelled query, graded.

    Attributes:
        text: The raw response (may be omitted to save space).
        answer: The extracted, normalized final answer (``None`` if none was found).
        correct: Whether the grader accepted it.
        n_tokens: Generated tokens.
        mean_logprob: Mean token log-probability of the response.
        confidence: A per-response confidence (verbalized or from logprobs), if any.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    text: str | None = None
    answer: str | None = None
    correct: bool
    n_tokens: int | None = Field(default=None, ge=0)
    mean_logprob: float | None = Field(default=None, le=0.0, allow_inf_nan=False)
    confidence: Probability | None = None


class LabelledQuery(BaseModel):
    """A query labelled by sampling: k responses, ``correct`` of them right, µ̂ = correct / k.

    Field aliases accept the column names of the paper's released data (``example_id``,
    ``num_samples``, ``num_correct``, ``expected_accuracy``). Extra keys (confidence columns,
    metadata) are kept, in ``model_extra``.

    Attributes:
        id: Unique id of the query within its dataset.
        question: The query text, if kept.
        references: Accepted reference answers (aliases).
        k: Responses sampled.
        correct: How many were graded correct (0 <= correct <= k).
        samples: Optional per-sample records; when given, their count is k and their
            correct flags sum to ``correct``.

    Examples:
        >>> LabelledQuery(id="q1", k=4, correct=3).mu_hat
        0.75
    """

    model_config = ConfigDict(frozen=True, extra="allow", populate_by_name=True)

    id: str = Field(validation_alias=AliasChoices("id", "example_id"), min_length=1)
    question: str | None = None
    references: list[str] = Field(default_factory=list)
    k: int = Field(validation_alias=AliasChoices("k", "num_samples"), ge=1)
    correct: int = Field(validation_alias=AliasChoices("correct", "num_correct"), ge=0)
    samples: list[Sample] | None = None

    @model_validator(mode="before")
    @classmethod
    def _check_declared_mu(cls, data: Any) -> Any:
        if isinstance(data, dict):
            declared = data.get("mu_hat", data.get("expected_accuracy"))
            k = data.get("k", data.get("num_samples"))
            c = data.get("correct", data.get("num_correct"))
            if (
                isinstance(declared, int | float)
                and isinstance(k, int)
                and isinstance(c, int)
                and k > 0
                and not math.isclose(float(declared), c / k, abs_tol=1e-9)
            ):
                raise ValueError(f"declared µ̂ {declared!r} disagrees with correct/k = {c}/{k}")
        return data

    @field_validator("correct")
    @classmethod
    def _correct_within_k(cls, correct: int, info: ValidationInfo) -> int:
        k = info.data.get("k")
        if k is not None and correct > k:
            raise ValueError(f"correct must be <= k; got correct={correct}, k={k}")
        return correct

    @field_validator("samples")
    @classmethod
    def _samples_match_counts(cls, samples: list[Sample] | None, info: ValidationInfo) -> list[Sample] | None:
        k, correct = info.data.get("k"), info.data.get("correct")
        if samples is None or k is None or correct is None:
            return samples
        if len(samples) != k:
            raise ValueError(f"samples has {len(samples)} entries but k={k}")
        n_ok = sum(s.correct for s in samples)
        if n_ok != correct:
            raise ValueError(f"samples mark {n_ok} correct but correct={correct}")
        return samples

    @property
    def mu_hat(self) -> float:
        """Empirical capability µ̂ = correct / k."""
        return self.correct / self.k


Action: TypeAlias = Literal["answer", "abstain", "clarify", "escalate", "resample", "route"]
"""What a policy can do with a query: answer it, abstain, ask the user, hand to a human,
spend more samples (CAS), or send it to another model (the cheapest predicted to be capable)."""

Mode: TypeAlias = Literal["enforce", "shadow"]
"""How a gate uses its decisions: act on them, or (shadow) make and log them beside the call, which
proceeds as if answered, so a team sees what the gate would have done before it lets it act."""

Extractor: TypeAlias = Callable[[str], str | None]
"""Maps a response text to its normalized answer (``None``: no answer); CAS votes by it. A
grader's ``extract`` method is one."""


class Speculation(BaseModel):
    """What a speculatively gated call did: it was started together with its estimate.

    Attributes:
        discarded: The decision blocked, so the call's result was thrown away.
        cancelled: The call was cancelled before it finished (async calls only; a thread runs on).
        call_s: Seconds the call ran (until it finished, or was cancelled); ``None`` while a
            discarded sync call was still running.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    discarded: bool
    cancelled: bool = False
    call_s: float | None = Field(default=None, ge=0.0)


_IDS = random.Random()  # seeded from os.urandom; reseeded in a forked child (below)
os.register_at_fork(after_in_child=_IDS.seed)


def _new_id() -> str:
    """A random version-4 UUID, as hex, for a decision: unique (122 random bits), not secret.

    Not :func:`uuid.uuid4`: its ``os.urandom`` gives up the GIL, and an event loop beside 8 busy
    threads then took 0.7 s (median) for 256 ids, against 0.6 ms here (``bench/decision_ids_bench.py``).
    """
    return uuid.UUID(int=_IDS.getrandbits(128), version=4).hex


def _now() -> datetime:
    return datetime.now(UTC)


class Decision(BaseModel):
    """A policy's verdict on one query, with everything its action needs (the sampling plan, the
    hand-off target, the text for the user): stored as JSON (graph state, the decision log) it can
    be acted on after a restart without the policy that made it.

    Attributes:
        id: Unique id; outcomes attach to it later.
        action: What to do.
        estimate: The capability estimate the decision was made on.
        degraded: True when the estimate was unavailable or weakened and the policy's
            ``on_degraded`` fail-safe chose the action.
        reason: Human-readable account of the rule that fired (band, threshold, fallback).
        message: Text for the user or the human: abstain message, clarifying question,
            escalation summary.
        budget: Samples to spend, for ``resample`` (and the chosen k for verified sampling).
        plan: For ``resample``: how to sample (budget, batch size, stop settings).
        to: For ``escalate``: who takes over (a queue, team or channel), if the policy says.
        route: For ``route``, once chosen: the model choice the query goes to.
        route_plan: For ``route``: the choices, the edge, and each choice's predicted capability.
        policy: Name of the policy that decided.
        policy_version: Format version of the policy that decided.
        target: The model whose capability was estimated (the model the gated call goes to).
        target_override: True when the estimator predicts another model's capability than the
            one the call goes to, and the gate was told to allow it (``allow_other_target``).
        shadow: A shadow decision: made and logged beside the call, not acted on (``action`` is
            what the gate would have done; the call proceeded as if answered).
        calibration: The version of the calibration (``capgate calibrate``) the decision was made
            under; ``None`` when the gate ran uncalibrated.
        beside: For a candidate calibration's shadow decision: the id of the decision it was made
            beside (on the same query), so the two can be compared on that decision's outcome.
        speculation: For a speculatively gated call, started with its estimate: whether its result
            was discarded and what it cost.
        step: Agent step (graph node) the query came from, if any.
        tool: Tool whose call is being gated, if any.
        stopped_by: For ``resample``, once sampled: the stop rule (or cap) that ended sampling
            (as the decision log records it; ``None`` when the decision was made).
        created_at: When the decision was made (UTC).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(default_factory=_new_id)
    action: Action
    estimate: Estimate
    degraded: bool = False
    reason: str
    message: str | None = None
    budget: int | None = Field(default=None, ge=1)
    plan: SamplingPlan | None = None
    to: str | None = None
    route: str | None = None
    route_plan: RoutePlan | None = None
    policy: str | None = None
    policy_version: int | None = None
    target: str | None = None
    target_override: bool = False
    shadow: bool = False
    calibration: str | None = None
    beside: str | None = None
    speculation: Speculation | None = None
    step: str | None = None
    tool: str | None = None
    stopped_by: str | None = None
    created_at: datetime = Field(default_factory=_now)

    @model_validator(mode="after")
    def _plan_matches_action(self) -> Decision:
        if self.plan is not None and self.action != "resample":
            raise ValueError(f"only a resample decision has a sampling plan; this one is {self.action!r}")
        if self.plan is not None and self.budget is not None and self.plan.max_samples != self.budget:
            raise ValueError(f"plan.max_samples ({self.plan.max_samples}) must equal budget ({self.budget})")
        if (self.route is not None or self.route_plan is not None) and self.action != "route":
            raise ValueError(f"only a route decision has a route; this one is {self.action!r}")
        if self.action == "route" and self.route_plan is None:
            raise ValueError("a route decision needs its route_plan (choices and edge)")
        if (
            self.route is not None
            and self.route_plan is not None
            and self.route not in self.route_plan.choices
        ):
            raise ValueError(
                f"route {self.route!r} is not one of the choices {list(self.route_plan.choices)}"
            )
        return self

    @property
    def text(self) -> str:
        """The text to show for a blocking action: the message, else the reason."""
        return self.message or self.reason


OutcomeSource: TypeAlias = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^\S(.*\S)?$")]
"""Who or what judged an answer: ``"user"`` (feedback), ``"grader"``, ``"test"``, ``"tool"`` (a tool
call's result), or any short label of your own (``"grader:math-verify"``); no surrounding spaces."""


class Outcome(BaseModel):
    """What happened after a decision: attaches to it by ``decision_id``, one per ``source``.

    An outcome says at least one of: ``correct`` (binary), ``mu_hat`` (a measured rate, with the
    ``k`` responses it was measured on), ``score`` (a graded score in [0, 1]).

    Attributes:
        decision_id: The decision this outcome belongs to.
        correct: Whether the final answer was right (``None`` if unknown or not answered).
        mu_hat: A measured capability for the query (correct / k), when one was sampled.
        k: Responses ``mu_hat`` was measured on (then ``mu_hat * k`` is a whole number).
        score: A graded score in [0, 1] (a partial-credit grader, a rating).
        source: Who or what judged it (:data:`OutcomeSource`); ``"unspecified"`` by default.
        note: Free text (a user's comment, a test's name, a tool's error).
        samples_used: Responses actually drawn.
        latency_s: Seconds from decision to outcome.
        recorded_at: When the outcome was recorded (UTC).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    decision_id: str = Field(min_length=1)
    correct: bool | None = None
    mu_hat: float | None = Field(default=None, ge=0.0, le=1.0)
    k: int | None = Field(default=None, ge=1)
    score: float | None = Field(default=None, ge=0.0, le=1.0)
    source: OutcomeSource = "unspecified"
    note: str | None = None
    samples_used: int = Field(default=0, ge=0)
    latency_s: float | None = Field(default=None, ge=0.0)
    recorded_at: datetime = Field(default_factory=_now)

    @model_validator(mode="after")
    def _rate_has_its_count(self) -> Outcome:
        if self.k is not None:
            if self.mu_hat is None:
                raise ValueError("`k` is the count `mu_hat` was measured on: give `mu_hat` with it")
            if abs(self.mu_hat * self.k - round(self.mu_hat * self.k)) > 1e-6:
                raise ValueError(
                    f"`mu_hat` * `k` must be a whole number of correct answers; got {self.mu_hat} * {self.k}"
                )
        return self

    @property
    def value(self) -> float | None:
        """The outcome as one number in [0, 1]: ``correct`` (1 or 0) when known, else ``mu_hat``
        (the chance one answer is right), else ``score``; ``None`` if it says none of them."""
        if self.correct is not None:
            return float(self.correct)
        return self.mu_hat if self.mu_hat is not None else self.score
