"""The CAS paper's stop rule (cas_frequency_gap), the rule that fired, and the settings that name them."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pydantic import ValidationError

from capgate import PaperConfidenceGap, StopSettings
from capgate.cas import (
    SamplingState,
    beta_consensus,
    cas_confidence_gap,
    cas_frequency_gap,
    fired_rule,
    replay,
    stop_after_samples,
    stop_rule,
)


def sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


def state(
    votes: dict[str, int], confidences: dict[str, tuple[float | None, ...]], seed: int = 0
) -> SamplingState:
    return SamplingState.build(votes=votes, confidences=confidences, rng=np.random.default_rng(seed))


def test_frequent_but_unsure_leader_against_a_confident_runner_up() -> None:
    # A x3 at 0.3 vs B x1 at 0.95: the paper ranks by frequency, so a1 = A, a2 = B.
    s = state({"A": 3, "B": 1}, {"A": (0.3, 0.3, 0.3), "B": (0.95,)})
    for eps in (0.0, 0.1, -0.5):
        rule = cas_frequency_gap(epsilon=eps)
        assert rule.leaders(s) == ["A", "B"]
        assert rule.gap(s) == pytest.approx(0.3 - 0.95)
        assert rule.stop_probability(s) == pytest.approx(sigmoid(0.3 - 0.95 - eps))
    # capgate's variant ranks by weighted vote: 0.9 (A) vs 0.95 (B), so B leads and the gap flips.
    assert cas_confidence_gap().gap(s) == pytest.approx(0.95 - 0.3)


def test_lone_answer_uses_c2_zero_and_means_of_known_confidences() -> None:
    s = state({"7": 3}, {"7": (0.8, None, 0.6)})
    assert cas_frequency_gap(epsilon=0.2).stop_probability(s) == pytest.approx(sigmoid(0.7 - 0.2))


def test_frequency_ties_break_by_mean_confidence_then_text() -> None:
    s = state({"b": 2, "a": 2, "c": 1}, {"b": (0.9, 0.7), "a": (0.5, 0.5), "c": (1.0,)})
    assert cas_frequency_gap().leaders(s) == ["b", "a", "c"]
    assert cas_frequency_gap().gap(s) == pytest.approx(0.8 - 0.5)
    tied = state({"y": 1, "x": 1}, {"y": (0.5,), "x": (0.5,)})
    assert cas_frequency_gap().leaders(tied) == ["x", "y"]


def test_unknown_confidence_never_stops() -> None:
    rule = cas_frequency_gap(epsilon=-100.0)  # would stop with certainty on any known gap
    assert rule(state({"A": 2}, {"A": (None, None)})) is False
    assert rule(state({"A": 2, "B": 1}, {"A": (0.9, 0.9), "B": (None,)})) is False
    assert rule(state({}, {})) is False
    assert rule(state({"A": 2, "B": 1}, {"A": (0.9, 0.9), "B": (0.1,)})) is True


def test_the_stop_is_a_seeded_draw_with_probability_p_stop() -> None:
    s_conf = {"A": (0.6, 0.6, 0.6), "B": (0.4,)}
    rule = cas_frequency_gap(epsilon=0.0)
    p = sigmoid(0.2)
    draws = [rule(state({"A": 3, "B": 1}, s_conf, seed=seed)) for seed in range(4000)]
    assert abs(np.mean(draws) - p) < 3 * math.sqrt(p * (1 - p) / 4000)
    # the same generator state gives the same decision: one draw of rng.random() per call
    for seed in range(50):
        expected = np.random.default_rng(seed).random() < p
        assert rule(state({"A": 3, "B": 1}, s_conf, seed=seed)) is bool(expected)


def test_seeded_replay_reproduces_its_stops() -> None:
    rng = np.random.default_rng(3)
    pool = [(str(rng.integers(3)), bool(rng.random() < 0.5), float(rng.random()), 5) for _ in range(40)]
    rule = cas_frequency_gap(epsilon=0.5) | stop_after_samples(40)
    runs = [replay(pool, stop=rule, batch_size=1, seed=11) for _ in range(3)]
    assert len({(r.samples_used, r.answer) for r in runs}) == 1
    others = {replay(pool, stop=rule, batch_size=1, seed=s).samples_used for s in range(20)}
    assert len(others) > 1  # it is stochastic: other seeds stop elsewhere


def test_epsilon_is_validated() -> None:
    for bad in (float("nan"), float("inf"), "0.1", True):
        with pytest.raises(ValueError, match="epsilon"):
            cas_frequency_gap(epsilon=bad)  # type: ignore[arg-type]


def test_fired_rule_names_the_part_of_a_composite_that_stopped() -> None:
    unanimous_unknown = SamplingState.build(votes={"4": 4})
    which = fired_rule(cas_confidence_gap() | beta_consensus(0.95), unanimous_unknown)
    assert isinstance(which, beta_consensus)
    confident = SamplingState.build(votes={"4": 1}, confidences={"4": (0.95,)})
    assert isinstance(fired_rule(cas_confidence_gap() | beta_consensus(0.95), confident), cas_confidence_gap)
    assert (
        fired_rule(cas_confidence_gap() | beta_consensus(0.95), SamplingState.build(votes={"4": 1})) is None
    )

    def plain(s: SamplingState) -> bool:
        return s.n_samples >= 1

    assert fired_rule(plain, confident) is plain
    assert fired_rule(stop_after_samples(1) & plain, confident) is plain
    gated = stop_after_samples(2) & (cas_confidence_gap() | beta_consensus(0.95))
    assert fired_rule(gated, confident) is None  # one sample: the count part has not fired
    assert isinstance(fired_rule(gated, unanimous_unknown), beta_consensus)


def test_replay_reports_the_rule_that_fired_not_the_composite() -> None:
    pool = [("4", True, None, 3)] * 10
    result = replay(pool, stop=cas_confidence_gap() | beta_consensus(0.95), batch_size=1)
    assert result.samples_used == 4
    assert result.stopped_by == "beta_consensus(threshold=0.95)"


def test_stop_settings_name_the_rule() -> None:
    paper = StopSettings.model_validate({"confidence_gap": {"rule": "paper", "epsilon": 0.25}})
    assert paper.confidence_gap == PaperConfidenceGap(rule="paper", epsilon=0.25)
    assert (
        repr(stop_rule(paper)) == "stop_any(cas_frequency_gap(epsilon=0.25), beta_consensus(threshold=0.95))"
    )
    assert StopSettings.model_validate_json(paper.model_dump_json()) == paper
    variant = StopSettings.model_validate({"confidence_gap": {"rule": "capgate", "scale": 5}})
    assert "cas_confidence_gap(scale=5" in repr(stop_rule(variant))
    default_gap = StopSettings().confidence_gap
    assert default_gap is not None
    assert default_gap == PaperConfidenceGap(rule="paper", epsilon=-1.0)  # the tuning pools' winner
    assert StopSettings.model_validate({"confidence_gap": {}}).confidence_gap.rule == "capgate"  # type: ignore[union-attr]
    with pytest.raises(ValidationError, match=r"confidence_gap\.paper\.scale"):
        StopSettings.model_validate({"confidence_gap": {"rule": "paper", "scale": 5}})
    with pytest.raises(ValidationError, match="papr"):
        StopSettings.model_validate({"confidence_gap": {"rule": "papr"}})
