"""Core value types shared by every layer of capgate.

``Estimate`` is what every capability estimator returns; ``LabelledQuery`` is one query with the
outcome of sampling the model k times on it (µ̂ = correct / k), the training and evaluation target.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

__all__ = ["Cost", "Estimate", "LabelledQuery", "Sample"]

Probability = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]


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
        return Cost(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            forward_passes=self.forward_passes + other.forward_passes,
            calls=self.calls + other.calls,
            latency_s=self.latency_s + other.latency_s,
        )


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

    Example:
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
    metadata) are kept in ``extra``-allowed storage and are reachable via ``model_extra``.

    Attributes:
        id: Unique id of the query within its dataset.
        question: The query text, if kept.
        references: Accepted reference answers (aliases).
        k: Responses sampled.
        correct: How many were graded correct (0 <= correct <= k).
        samples: Optional per-sample records; when given, their count is k and their
            correct flags sum to ``correct``.

    Example:
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
                declared is not None
                and isinstance(k, int)
                and isinstance(c, int)
                and k > 0
                and isinstance(declared, int | float)
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
