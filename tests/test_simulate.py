"""ReplaySummary of policies on labelled data: per-query actions agree with the engine, metrics are right."""

from __future__ import annotations

import itertools
import json
import math
from fractions import Fraction

import numpy as np
import pytest

from capgate import Estimate
from capgate.decision.analysis.simulate import ACTIONS, replay_policy, threshold_frontier
from capgate.policies import PRESETS, Policy, load_policy


def brute_pass_at_k(n: int, c: int, k: int) -> float:
    """Fraction of k-subsets of n responses (c correct) that contain a correct one."""
    items = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return float(Fraction(sum(any(items[i] for i in s) for s in subsets), len(subsets)))


MIXED = Policy.model_validate(
    {
        "name": "mixed",
        "bands": [
            {"below": 0.2, "action": "abstain"},
            {"below": 0.4, "action": "escalate"},
            {"below": 0.5, "action": "resample", "max_samples": 16, "batch_size": 4, "target_pass_at_k": 0.9},
            {"below": 0.6, "action": "resample", "max_samples": 6, "batch_size": 2},
            {"below": 0.7, "action": "clarify"},
            {"action": "answer"},
        ],
        "on_degraded": {"action": "resample", "max_samples": 5, "batch_size": 5},
        "steps": {"plan": 0.5},
        "tools": {"pay": {"bands": 0.9, "on_degraded": "escalate"}},
    }
)


def random_labels(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    p = rng.uniform(size=n)
    p[rng.random(n) < 0.1] = np.nan
    p[:6] = [0.0, 0.2, 0.4, 0.5, 0.6, 1.0]  # band edges exactly
    k = rng.integers(1, 12, size=n)
    correct = rng.binomial(k, 0.6)
    degraded = rng.random(n) < 0.05
    return p, correct / k, k, degraded


@pytest.mark.parametrize(("step", "tool"), [(None, None), ("plan", None), (None, "pay"), ("plan", "pay")])
@pytest.mark.parametrize("policy", [MIXED, *(load_policy(name) for name in PRESETS)], ids=lambda p: p.name)
def test_replay_takes_the_engines_decisions(policy: Policy, step: str | None, tool: str | None) -> None:
    p, mu, k, degraded = random_labels(400, seed=1)
    counts = dict.fromkeys(ACTIONS, 0)
    answered, correct_mass, samples = 0, 0.0, 0.0
    for i in range(p.size):
        if math.isnan(p[i]):
            estimate = Estimate.unavailable("probe", "missing")
        elif degraded[i]:
            estimate = Estimate(p=float(p[i]), method="probe", degraded=True, reason="weak")
        else:
            estimate = Estimate(p=float(p[i]), method="probe")
        decision = policy.decide(estimate, step=step, tool=tool)
        counts[decision.action] += 1
        if decision.action == "answer":
            answered += 1
            correct_mass += mu[i]
            samples += 1
        elif decision.action == "resample":
            assert decision.budget is not None
            answered += 1
            samples += decision.budget
            spec = policy.match(estimate, step=step, tool=tool).spec
            if getattr(spec, "target_pass_at_k", None) is None:
                correct_mass += mu[i]
            elif decision.budget <= k[i]:
                correct_mass += brute_pass_at_k(int(k[i]), round(mu[i] * k[i]), decision.budget)
            else:
                correct_mass += 1 - (1 - mu[i]) ** decision.budget
    result = replay_policy(policy, p, mu, n_samples=k, degraded=degraded, step=step, tool=tool)
    assert result.rates == {a: counts[a] / p.size for a in ACTIONS}
    assert sum(result.rates.values()) == pytest.approx(1.0)
    assert result.coverage == pytest.approx(answered / p.size)
    assert result.accuracy == pytest.approx(correct_mass / answered)
    assert result.samples == pytest.approx(samples)
    assert result.samples_per_query == pytest.approx(samples / p.size)
    assert result.n_degraded == int((np.isnan(p) | degraded).sum())
    assert result.threshold is None


def test_accuracy_is_mean_mu_of_answered_queries() -> None:
    p = np.array([0.1, 0.35, 0.55, 0.65, 0.9, 0.95])
    mu = np.array([0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
    result = replay_policy(load_policy("balanced"), p, mu)  # abstain < 0.3 <= clarify < 0.6 <= answer
    assert result.rates["abstain"] == pytest.approx(1 / 6)
    assert result.rates["clarify"] == pytest.approx(2 / 6)
    assert result.coverage == pytest.approx(3 / 6)
    assert result.accuracy == pytest.approx((0.6 + 0.8 + 1.0) / 3)
    assert result.risk == pytest.approx(1 - result.accuracy)
    assert result.samples == 3


def test_resample_samples_and_verified_accuracy() -> None:
    policy = Policy.model_validate(
        {
            "name": "r",
            "bands": [
                {
                    "below": 0.5,
                    "action": "resample",
                    "max_samples": 16,
                    "batch_size": 4,
                    "target_pass_at_k": 0.9,
                },
                {"action": "answer"},
            ],
            "on_degraded": "abstain",
        }
    )
    p = np.array([0.5 - 1e-9, 0.2, 0.9])
    mu = np.array([0.5, 0.2, 0.9])
    result = replay_policy(policy, p, mu, n_samples=[10, 10, 10])
    # budgets: smallest k with 1 - (1 - p)^k >= 0.9: p~0.5 -> 4, p=0.2 -> 11; answer -> 1
    assert result.samples == 4 + 11 + 1
    # the budget of 11 exceeds the 10 graded responses: the plug-in 1 - (1 - µ̂)^k
    expected = (brute_pass_at_k(10, 5, 4) + (1 - 0.8**11) + 0.9) / 3
    assert result.accuracy == pytest.approx(expected)
    # without graded counts the plug-in 1 - (1 - µ̂)^k is used throughout
    plug = replay_policy(policy, p, mu)
    assert plug.accuracy == pytest.approx(((1 - 0.5**4) + (1 - 0.8**11) + 0.9) / 3)


def test_unverified_resample_counts_one_response_accuracy_and_the_budget_cap() -> None:
    policy = load_policy("cost-saver")  # resample in [0.2, 0.4) with max_samples 4, no verifier
    result = replay_policy(policy, [0.3, 0.3, 0.8], [0.25, 0.75, 1.0])
    assert result.rates["resample"] == pytest.approx(2 / 3)
    assert result.samples == 4 + 4 + 1
    assert result.accuracy == pytest.approx((0.25 + 0.75 + 1.0) / 3)


def test_frontier_sweeps_the_answer_threshold() -> None:
    rng = np.random.default_rng(3)
    p = rng.uniform(size=1000)
    mu = np.clip(p + rng.normal(0, 0.1, size=1000), 0, 1)
    rows = threshold_frontier(load_policy("balanced"), p, mu, thresholds=21)
    assert [r.threshold for r in rows] == [round(t, 12) for t in np.linspace(0, 1, 21)]
    for row in rows:
        assert row.threshold is not None
        answered = p >= row.threshold
        assert row.coverage == pytest.approx(answered.mean())
        if answered.any():
            assert row.accuracy == pytest.approx(mu[answered].mean())
    coverages = [r.coverage for r in rows]
    assert coverages == sorted(coverages, reverse=True)
    # an informative confidence: accuracy rises as the threshold does
    accuracies = [r.accuracy for r in rows if r.coverage > 0.05]
    assert accuracies[-1] > accuracies[0] + 0.2
    # the non-answer bands follow the threshold: clarify fills [0.3, t) for t > 0.3
    at_08 = next(r for r in rows if r.threshold == 0.8)
    assert at_08.rates["clarify"] == pytest.approx(((p >= 0.3) & (p < 0.8)).mean())
    custom = threshold_frontier(load_policy("balanced"), p, mu, thresholds=[0.9, 0.5])
    assert [r.threshold for r in custom] == [0.9, 0.5]


def test_nothing_answered_gives_nan_accuracy_and_json_null() -> None:
    result = replay_policy(Policy(name="x", bands=0.9, on_degraded="abstain"), [0.1, 0.2], [1.0, 1.0])
    assert result.coverage == 0.0
    assert math.isnan(result.accuracy)
    data = result.to_dict()
    assert data["accuracy"] is None
    json.dumps(data)


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        (([0.1, 0.2], [1.0]), {}, "equal length"),
        (([], []), {}, "empty"),
        (([1.2], [1.0]), {}, "`p` must be in"),
        (([0.2], [1.2]), {}, "`mu_hat` must be in"),
        (([0.2], [1.0]), {"n_samples": [0]}, "`n_samples` must be positive"),
        (([0.2], [1.0]), {"degraded": [True, False]}, "one flag per query"),
    ],
)
def test_bad_inputs_are_named(
    args: tuple[list[float], list[float]], kwargs: dict[str, object], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        replay_policy(load_policy("balanced"), *args, **kwargs)  # type: ignore[arg-type]


def test_frontier_needs_an_answer_band_on_top_and_a_real_sweep() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        threshold_frontier(load_policy("balanced"), [0.5], [1.0], thresholds=1)
    upside_down = Policy.model_validate(
        {
            "name": "u",
            "bands": [{"below": 0.5, "action": "answer"}, {"action": "abstain"}],
            "on_degraded": "abstain",
        }
    )
    with pytest.raises(ValueError, match="must answer"):
        threshold_frontier(upside_down, [0.5], [1.0])


def test_a_numpy_integer_count_of_thresholds_is_a_count() -> None:
    p, mu = [0.2, 0.7, 0.9], [0.0, 1.0, 1.0]
    got = threshold_frontier(load_policy("balanced"), p, mu, thresholds=np.int64(3))  # type: ignore[arg-type]
    assert got == threshold_frontier(load_policy("balanced"), p, mu, thresholds=3)
    with pytest.raises(ValueError, match="at least 2 when given as a count"):
        threshold_frontier(load_policy("balanced"), p, mu, thresholds=np.int64(1))  # type: ignore[arg-type]
