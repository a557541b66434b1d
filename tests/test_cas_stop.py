"""Stop rules: the algebra, the Beta consensus rule against numeric integration, the CAS rule."""

from __future__ import annotations

import math

import numpy as np
import pytest

from capgate import cas


def state(
    votes: dict[str, int], conf: dict[str, tuple[float | None, ...]] | None = None, **kw: object
) -> cas.SamplingState:
    return cas.SamplingState.build(votes=votes, confidences=conf, **kw)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- algebra


def test_simple_rules_fire_at_their_limits() -> None:
    s = state({"a": 3}, tokens=900, elapsed_s=2.5)
    assert cas.stop_after_samples(3)(s)
    assert not cas.stop_after_samples(4)(s)
    assert cas.stop_after_tokens(900)(s)
    assert not cas.stop_after_tokens(901)(s)
    assert cas.stop_after_delay(2.5)(s)
    assert not cas.stop_after_delay(3)(s)
    assert not cas.stop_never()(s)


def test_or_and_build_rules_that_compose_further() -> None:
    s = state({"a": 3}, tokens=100)
    yes, no = cas.stop_after_samples(2), cas.stop_after_tokens(1000)
    assert isinstance(yes | no, cas.stop_any)
    assert (yes | no)(s)
    assert isinstance(yes & no, cas.stop_all)
    assert not (yes & no)(s)
    # composites are rules themselves and flatten
    combo = (yes | no) | cas.stop_never()
    assert isinstance(combo, cas.stop_any)
    assert len(combo.rules) == 3
    assert ((yes & no) | yes)(s)
    assert not ((yes | no) & cas.stop_never())(s)


def test_plain_functions_are_accepted_on_either_side() -> None:
    def two_answers(st: cas.SamplingState) -> bool:
        return len(st.votes) >= 2

    s1, s2 = state({"a": 5}), state({"a": 1, "b": 1})
    left = two_answers | cas.stop_after_samples(5)
    right = cas.stop_after_samples(5) & two_answers
    assert isinstance(left, cas.stop_any)
    assert isinstance(right, cas.stop_all)
    assert left(s1)
    assert left(s2)
    assert not right(s1)
    assert not right(s2)
    assert right(state({"a": 4, "b": 1}))
    assert cas.stop_if(two_answers)(s2)
    assert not cas.stop_if(two_answers)(s1)
    assert cas.stop_any(two_answers, lambda st: st.tokens > 10)(s2)


def test_repr_shows_settings() -> None:
    rule = (cas.beta_consensus(0.9) | cas.stop_after_samples(40)) & cas.stop_after_tokens(8000)
    assert (
        repr(rule) == "stop_all(stop_any(beta_consensus(threshold=0.9), stop_after_samples(40)), "
        "stop_after_tokens(8000))"
    )
    assert repr(cas.cas_confidence_gap(scale=5, margin=0.2, mode="stochastic")) == (
        "cas_confidence_gap(scale=5, margin=0.2, mode='stochastic')"
    )
    assert (
        repr(cas.cas_confidence_gap())
        == "cas_confidence_gap(scale=10, margin=0.5, mode='threshold', level=0.5)"
    )


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (lambda: cas.stop_after_samples(0), "`n` must be a positive integer; got 0"),
        (lambda: cas.stop_after_tokens(-3), "`n` must be a positive integer; got -3"),
        (lambda: cas.stop_after_delay(0), "`seconds` must be a positive number; got 0"),
        (lambda: cas.beta_consensus(0.4), "`threshold` must be a number in (0.5, 1); got 0.4"),
        (lambda: cas.cas_confidence_gap(scale=0), "`scale`: input should be greater than 0; got 0"),
        (
            lambda: cas.cas_confidence_gap(mode="always"),  # type: ignore[arg-type]
            "`mode`: input should be 'threshold' or 'stochastic'",
        ),
        (lambda: cas.cas_confidence_gap(level=1.0), "`level`: input should be less than 1; got 1.0"),
        (lambda: cas.cas_frequency_gap(True), "`epsilon`: input should be a valid number; got True"),  # type: ignore[arg-type]
        (lambda: cas.cas_frequency_gap(math.inf), "`epsilon`: input should be a finite number; got inf"),
    ],
)
def test_bad_settings_are_rejected_naming_the_value(factory: object, message: str) -> None:
    with pytest.raises(ValueError, match=r".*") as info:
        factory()  # type: ignore[operator]
    assert message in str(info.value)


def test_non_callables_are_rejected() -> None:
    with pytest.raises(TypeError, match="stop rules or functions"):
        cas.stop_any(cas.stop_never(), 3)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- Beta


def _beta_cdf_numeric(x: float, a: int, b: int, n_grid: int = 200_001) -> float:
    """P(X <= x) by composite Simpson integration of the Beta density (independent of the code)."""
    t = np.linspace(0.0, x, n_grid)
    log_norm = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    with np.errstate(divide="ignore", invalid="ignore"):
        dens = np.exp(log_norm + (a - 1) * np.log(t) + (b - 1) * np.log1p(-t))
    dens = np.nan_to_num(dens, nan=0.0, posinf=0.0)
    if a == 1:
        dens[0] = math.exp(log_norm)  # density at 0 is finite for a = 1
    h = x / (n_grid - 1)
    return float(h / 3 * (dens[0] + dens[-1] + 4 * dens[1:-1:2].sum() + 2 * dens[2:-1:2].sum()))


@pytest.mark.parametrize(
    ("a", "b"), [(1, 1), (2, 1), (5, 1), (3, 2), (4, 4), (7, 3), (12, 5), (30, 28), (2, 9)]
)
def test_beta_tail_matches_numeric_integration(a: int, b: int) -> None:
    numeric = 1.0 - _beta_cdf_numeric(0.5, a, b)
    assert cas.beta_prob_above_half(a, b) == pytest.approx(numeric, abs=1e-9)


def test_beta_tail_is_exact_for_large_counts() -> None:
    # symmetric posterior: exactly one half, however large
    assert cas.beta_prob_above_half(400, 400) == 0.5
    assert cas.beta_prob_above_half(600, 500) > 0.99


def test_beta_consensus_decisions() -> None:
    rule = cas.beta_consensus(0.95)
    assert not rule(state({}))  # nothing extracted yet
    assert not rule(state({"a": 3}))  # Beta(4,1): 0.9375
    assert rule(state({"a": 4}))  # Beta(5,1): 0.96875
    assert rule.posterior(state({"a": 4})) == 0.96875
    # the runner-up matters; third answers do not
    assert not rule(state({"a": 6, "b": 3}))
    assert rule.posterior(state({"a": 6, "b": 3, "c": 3})) == rule.posterior(state({"a": 6, "b": 3}))
    assert rule(state({"a": 12, "b": 2}))
    # unanswered samples do not count as votes
    assert not rule(state({"a": 3}, n_unanswered=10))


# --------------------------------------------------------------------------- CAS


def test_cas_single_answer_uses_c2_zero() -> None:
    rule = cas.cas_confidence_gap(scale=10, margin=0.5)
    s = state({"7": 2}, {"7": (0.9, 0.7)})
    assert rule.gap(s) == pytest.approx(0.8)
    assert rule.stop_probability(s) == pytest.approx(1 / (1 + math.exp(-10 * 0.3)))
    assert rule(s)
    assert not rule(state({"7": 1}, {"7": (0.45,)}))


def test_cas_ranks_by_confidence_weighted_vote() -> None:
    # "a" has more votes but less weight (3 x 0.2 = 0.6) than "b" (1 x 0.95): "b" leads.
    s = state({"a": 3, "b": 1}, {"a": (0.2, 0.2, 0.2), "b": (0.95,)})
    assert s.leader == "b"
    rule = cas.cas_confidence_gap(scale=10, margin=0.5)
    assert rule.gap(s) == pytest.approx(0.75)
    assert rule(s)
    # two rivals close in confidence: no stop
    close = state({"a": 2, "b": 2}, {"a": (0.8, 0.7), "b": (0.6, 0.6)})
    assert rule.gap(close) == pytest.approx(0.15)
    assert not rule(close)


def test_cas_threshold_level_shifts_the_required_gap() -> None:
    s = state({"a": 1, "b": 1}, {"a": (0.9,), "b": (0.3,)})  # gap 0.6
    assert cas.cas_confidence_gap(margin=0.5, level=0.5)(s)
    assert cas.cas_confidence_gap(margin=0.5, level=0.7)(s)  # needs gap >= 0.5 + logit(0.7)/10 = 0.585
    assert not cas.cas_confidence_gap(margin=0.5, level=0.8)(s)  # needs 0.639


def test_cas_never_stops_on_unknown_confidence() -> None:
    rule = cas.cas_confidence_gap(margin=-1.0, level=0.01)  # as eager as it can be
    assert not rule(state({}))
    assert not rule(state({"a": 3}, {"a": (None, None, None)}))
    assert not rule(state({"a": 2, "b": 1}, {"a": (0.9, 0.9), "b": (None,)}))
    # unknowns are skipped in means, not read as 0.5
    s = state({"a": 3}, {"a": (0.9, None, 0.7)})
    assert s.mean_confidence("a") == pytest.approx(0.8)
    assert s.weighted_votes()["a"] == pytest.approx(0.9 + 0.5 + 0.7)


def test_cas_stochastic_stops_with_probability_p_stop() -> None:
    rule = cas.cas_confidence_gap(scale=10, margin=0.5, mode="stochastic")
    rng = np.random.default_rng(1234)
    s = state({"a": 2, "b": 1}, {"a": (0.8, 0.8), "b": (0.2,)}, rng=rng)  # gap 0.6 -> σ(1) ≈ 0.731
    p = rule.stop_probability(s)
    assert p is not None
    assert p == pytest.approx(1 / (1 + math.exp(-1.0)))
    n = 4000
    hits = sum(rule(s) for _ in range(n))
    assert abs(hits / n - p) < 4 * math.sqrt(p * (1 - p) / n)

    # same seed, same decisions
    def decisions(seed: int) -> list[bool]:
        st = state({"a": 1}, {"a": (0.5,)}, rng=np.random.default_rng(seed))  # P_stop = 0.5
        return [rule(st) for _ in range(64)]

    assert decisions(7) == decisions(7)
    assert decisions(7) != decisions(8)


def test_state_is_frozen() -> None:
    s = state({"a": 1})
    with pytest.raises(AttributeError):
        s.n_samples = 5  # type: ignore[misc]
    with pytest.raises(TypeError):
        s.votes["a"] = 3  # type: ignore[index]


# --------------------------------------------------------------------------- futility


def _posterior_by_integration(a: int, b: int, steps: int = 20000) -> float:
    """P(X > 1/2) for X ~ Beta(a, b) by the midpoint rule (independent of the closed form)."""
    import math

    xs = [(i + 0.5) / steps for i in range(steps)]
    log_norm = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    density = [math.exp(log_norm + (a - 1) * math.log(x) + (b - 1) * math.log(1 - x)) for x in xs]
    return sum(d for x, d in zip(xs, density, strict=True) if x > 0.5) / steps


@pytest.mark.parametrize(
    ("votes", "unanswered"),
    [
        ({"a": 1, "b": 1, "c": 1}, 0),
        ({"a": 2, "b": 1}, 4),
        ({"a": 5}, 0),
        ({"a": 1}, 6),
        ({"a": 3, "b": 3}, 0),
    ],
)
def test_beta_futility_fires_exactly_when_a_majority_is_unlikely(
    votes: dict[str, int], unanswered: int
) -> None:
    from capgate.cas import beta_futility

    state = cas.SamplingState.build(votes=votes, n_unanswered=unanswered)
    leader, n = max(votes.values()), sum(votes.values()) + unanswered
    posterior = _posterior_by_integration(leader + 1, n - leader + 1)
    rule = beta_futility(0.05)
    assert rule.posterior(state) == pytest.approx(posterior, abs=1e-4)
    assert rule(state) == (posterior < 0.05)


def test_beta_futility_settings_and_composition() -> None:
    from capgate.cas import beta_futility, replay

    with pytest.raises(ValueError, match=r"`threshold` must be a number in \(0, 0.5\); got 0.5"):
        beta_futility(0.5)
    assert repr(beta_futility()) == "beta_futility(threshold=0.05)"
    assert not beta_futility()(cas.SamplingState.build(votes={}))
    # Seven different answers: no majority in sight, so the loop gives up at 7 of 20.
    pool = [(str(i), i == 0, None, 1) for i in range(20)]
    result = replay(pool, stop=cas.beta_consensus() | beta_futility(), batch_size=1)
    assert result.samples_used == 7


def test_the_paper_rules_epsilon_is_the_same_in_every_spelling() -> None:
    """A policy's ``{rule: paper}``, the default stop settings and the rule built bare all use
    :data:`capgate.cas.DEFAULT_EPSILON` (they disagreed: 0 for the first and the last, -1 for the
    default)."""
    from capgate import StopSettings
    from capgate.cas import DEFAULT_EPSILON, stop_rule
    from capgate.core.plans import PaperConfidenceGap

    spelled = StopSettings.model_validate({"confidence_gap": {"rule": "paper"}}).confidence_gap
    assert isinstance(spelled, PaperConfidenceGap)
    assert spelled.epsilon == DEFAULT_EPSILON == -1.0
    assert StopSettings().confidence_gap == spelled
    assert cas.cas_frequency_gap().epsilon == DEFAULT_EPSILON
    built = repr(stop_rule(StopSettings.model_validate({"confidence_gap": {"rule": "paper"}})))
    assert "cas_frequency_gap(epsilon=-1)" in built, built
