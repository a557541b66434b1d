"""What a policy decided for a query, and what happened afterwards."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field

from capgate._types import Estimate

__all__ = ["Action", "Decision", "Outcome"]

Action: TypeAlias = Literal["answer", "abstain", "clarify", "escalate", "resample"]
"""What a policy can do with a query: answer it, abstain, ask the user, hand to a human, or
spend more samples (CAS)."""


def _new_id() -> str:
    return uuid.uuid4().hex


def _now() -> datetime:
    return datetime.now(UTC)


class Decision(BaseModel):
    """A policy's verdict on one query.

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
        policy: Name of the policy that decided.
        step: Agent step (graph node) the query came from, if any.
        tool: Tool whose call is being gated, if any.
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
    policy: str | None = None
    step: str | None = None
    tool: str | None = None
    created_at: datetime = Field(default_factory=_now)


class Outcome(BaseModel):
    """What happened after a decision: attaches to it by ``decision_id``.

    Attributes:
        decision_id: The decision this outcome belongs to.
        correct: Whether the final answer was right (``None`` if unknown or not answered).
        mu_hat: A measured capability for the query (correct / k), when one was sampled.
        samples_used: Responses actually drawn.
        latency_s: Seconds from decision to outcome.
        recorded_at: When the outcome was recorded (UTC).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    decision_id: str = Field(min_length=1)
    correct: bool | None = None
    mu_hat: float | None = Field(default=None, ge=0.0, le=1.0)
    samples_used: int = Field(default=0, ge=0)
    latency_s: float | None = Field(default=None, ge=0.0)
    recorded_at: datetime = Field(default_factory=_now)
