"""The plans a decision carries: how a ``resample`` samples and stops, how a ``route`` picks a model.

Value types only (pydantic, nothing of capgate), re-exported by :mod:`capgate.core.types` and ``capgate``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeAlias

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag, model_validator

Probability = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]


def _plain_int(value: Any) -> Any:
    return int(value) if isinstance(value, np.integer) else value


Count = Annotated[int, BeforeValidator(_plain_int), Field(strict=True)]
"""A policy's count: an integer (a numpy one too), never a boolean, a float or a quoted number."""

CASMode: TypeAlias = Literal["threshold", "stochastic"]
"""How CAS's confidence-gap rule uses P_stop: stop once it reaches a level, or stop with that
probability."""


class ConfidenceGap(BaseModel):
    """Settings of capgate's confidence-gap stop rule (:class:`capgate.cas.cas_confidence_gap`).

    Stop when σ(scale · (c1 − c2 − margin)) reaches ``level`` (``mode: threshold``), or with that
    probability (``mode: stochastic``); c1, c2 are the mean confidences of the two answers leading
    the confidence-weighted vote. ``rule: capgate`` names it (the default when ``rule`` is absent).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    rule: Literal["capgate"] = "capgate"

    scale: float = Field(default=10.0, gt=0.0, allow_inf_nan=False, strict=True)
    margin: float = Field(default=0.5, ge=-1.0, le=1.0, strict=True)
    mode: CASMode = "threshold"
    level: float = Field(default=0.5, gt=0.0, lt=1.0, strict=True)


DEFAULT_EPSILON = -1.0
"""ε of the paper's stop rule (σ(c1 − c2 − ε)) wherever it is not given: a policy's ``{rule: paper}``,
the default :class:`StopSettings`, :class:`capgate.cas.cas_frequency_gap`. Chosen on the tuning pools
of ``bench/cas_bench.py``: the fewest samples within 0.5 points of weighted fixed-N = 40, in batches
of 4 (the policies' default). ε = 0, the rule read literally, stops later: its stop probability is at
most σ(1) ≈ 0.73 per batch even at a full gap (σ(2) ≈ 0.88 at ε = −1)."""


class PaperConfidenceGap(BaseModel):
    """Settings of the CAS paper's stop rule (:class:`capgate.cas.cas_frequency_gap`), ``rule: paper``.

    Stop with probability σ(c1 − c2 − epsilon), c1, c2 the mean confidences of the two most
    frequent answers; the draw is seeded, so a decision's sampling is reproducible.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    rule: Literal["paper"] = "paper"
    epsilon: float = Field(default=DEFAULT_EPSILON, allow_inf_nan=False, strict=True)


def _gap_rule(value: Any) -> str:
    rule = value.get("rule", "capgate") if isinstance(value, dict) else getattr(value, "rule", "capgate")
    return str(rule)


GapSettings: TypeAlias = Annotated[
    Annotated[ConfidenceGap, Tag("capgate")] | Annotated[PaperConfidenceGap, Tag("paper")],
    Discriminator(_gap_rule),
]
"""A confidence-gap rule's settings, chosen by ``rule`` (``capgate``, the default, or ``paper``)."""


class StopSettings(BaseModel):
    """When confidence-based adaptive sampling (CAS) may stop before ``max_samples``.

    Sampling stops as soon as any enabled rule fires (and never after ``max_samples``); the
    defaults are CAS's own :data:`capgate.cas.DEFAULT_STOP`. :func:`capgate.cas.stop_rule` turns
    the settings into a composed stop rule.

    Attributes:
        confidence_gap: The CAS confidence-gap rule, or ``null`` to disable it: by default the
            paper's rule with ε = −1 (:data:`DEFAULT_EPSILON`; see ``bench/RESULTS.md``);
            ``{rule: capgate, ...}`` is capgate's deterministic variant.
        consensus: Stop once P(the leading answer is the majority) >= this under a Beta posterior
            on the two top vote counts (:class:`capgate.cas.beta_consensus`), or ``null``.
        futility: Give up once P(the leading answer holds a majority of all responses) < this
            (:class:`capgate.cas.beta_futility`; 0.05 mirrors a 0.95 consensus), or ``null``
            (the default) to keep sampling queries on which no majority forms.
        min_samples: Never stop before this many samples.
        max_tokens: A cost cap: stop once the responses drawn hold this many tokens in all, even
            before ``min_samples`` (:class:`capgate.cas.stop_after_tokens`), or ``null`` (the default).
        max_seconds: A latency cap, like ``max_tokens``: stop once sampling has run this long
            (:class:`capgate.cas.stop_after_delay`), or ``null`` (the default).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    confidence_gap: GapSettings | None = Field(default_factory=PaperConfidenceGap)
    consensus: float | None = Field(default=0.95, gt=0.5, lt=1.0, strict=True)
    futility: float | None = Field(default=None, gt=0.0, lt=0.5, strict=True)
    min_samples: Count = Field(default=1, ge=1)
    max_tokens: Count | None = Field(default=None, ge=1)
    max_seconds: float | None = Field(default=None, gt=0.0, allow_inf_nan=False, strict=True)


class SamplingPlan(BaseModel):
    """How a ``resample`` decision samples: budget, batch size and early-stop settings.

    Attributes:
        max_samples: The budget: responses drawn at most.
        batch_size: Responses drawn per round before the stop rule is consulted.
        stop: When sampling may stop early (:func:`capgate.cas.stop_rule` builds the rule).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_samples: int = Field(ge=1)
    batch_size: int = Field(ge=1)
    stop: StopSettings = Field(default_factory=StopSettings)

    @model_validator(mode="after")
    def _batch_within_budget(self) -> SamplingPlan:
        if self.batch_size > self.max_samples:
            raise ValueError(f"batch_size must be <= max_samples ({self.max_samples}); got {self.batch_size}")
        return self


class RoutePlan(BaseModel):
    """How a ``route`` decision picks a model: the cheapest choice predicted to clear ``edge``.

    Attributes:
        choices: The model choices, cheapest first; the last is the strongest (the fallback).
        edge: The predicted capability a choice must reach to be picked.
        p: Each estimated choice's predicted capability (``None``: no estimate could be had),
            filled in when the route is chosen.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    choices: tuple[str, ...] = Field(min_length=1)
    edge: Probability
    p: dict[str, Probability | None] = Field(default_factory=dict)
