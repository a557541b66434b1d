"""Core value types: Estimate's fail-closed contract, Cost arithmetic, LabelledQuery checks."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from capgate import Cost, Estimate, LabelledQuery
from capgate.decision import Decision


def test_estimate_without_value_must_be_degraded_with_reason() -> None:
    with pytest.raises(ValidationError, match="must be degraded=True"):
        Estimate(p=None, method="verbalized")
    with pytest.raises(ValidationError, match="needs a non-empty reason"):
        Estimate(p=0.4, method="verbalized", degraded=True)
    missing = Estimate.unavailable("verbalized", "server down", attempt=3)
    assert not missing.usable
    assert missing.degraded
    assert missing.details == {"attempt": 3}


@pytest.mark.parametrize("p", [-0.1, 1.1, float("nan")])
def test_estimate_value_is_a_probability(p: float) -> None:
    with pytest.raises(ValidationError):
        Estimate(p=p, method="probe")


def test_estimate_is_frozen_and_round_trips_json() -> None:
    estimate = Estimate(p=0.7, method="probe", cost=Cost(forward_passes=1, latency_s=0.01))
    with pytest.raises(ValidationError):
        estimate.p = 0.1  # type: ignore[misc]
    assert Estimate.model_validate_json(estimate.model_dump_json()) == estimate


def test_cost_adds_up() -> None:
    total = Cost(prompt_tokens=3, calls=1) + Cost(completion_tokens=2, calls=1, latency_s=0.5)
    assert (total.prompt_tokens, total.completion_tokens, total.calls, total.latency_s) == (3, 2, 2, 0.5)


def test_labelled_query_mu_hat_and_extras() -> None:
    record = LabelledQuery.model_validate(
        {"example_id": "x", "num_samples": 10, "num_correct": 7, "probe": 0.6}
    )
    assert record.mu_hat == 0.7
    assert record.model_extra == {"probe": 0.6}


def test_decision_requires_known_action() -> None:
    estimate = Estimate(p=0.2, method="probe")
    decision = Decision(action="abstain", estimate=estimate, reason="p < 0.3")
    assert len(decision.id) == 32
    with pytest.raises(ValidationError):
        Decision(action="guess", estimate=estimate, reason="x")  # type: ignore[arg-type]
