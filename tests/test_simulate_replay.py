"""``replay_policy`` replays resample votes on per-sample pools; checked against a brute force.

The brute force below is written from the rules' definitions, not from capgate's loop: every
permutation of a small pool is stepped through one sample at a time, with the confidence-weighted
vote, capgate's gap rule (threshold mode: stop when c1 - c2 >= 0.5) and Beta consensus (stop when
P(X > 1/2) >= 0.95, X ~ Beta(v1 + 1, v2 + 1)), and the expected accuracy and samples are averaged.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from capgate import Sample
from capgate.cli import app
from capgate.decision import replay_policy
from capgate.policies import Policy

RESAMPLE_ALL = Policy.model_validate(
    {
        "name": "all-resample",
        "bands": [
            {
                "below": 0.99,
                "action": "resample",
                "max_samples": 4,
                "batch_size": 1,
                "stop": {"confidence_gap": {"rule": "capgate"}},  # deterministic, as the brute force
            },
            {"action": "answer"},
        ],
        "on_degraded": "abstain",
    }
)


def beta_above_half(a: int, b: int) -> float:
    n = a + b - 1
    return sum(math.comb(n, j) for j in range(a)) / 2**n


def mean_known(confidences: list[float | None]) -> float | None:
    known = [c for c in confidences if c is not None]
    return sum(known) / len(known) if known else None


def brute_force(pool: list[Sample]) -> tuple[float, float]:
    def conf(s: Sample) -> float | None:
        if s.confidence is not None:
            return s.confidence
        return None if s.mean_logprob is None else math.exp(s.mean_logprob)

    accuracy = spent = 0.0
    perms = list(itertools.permutations(range(len(pool))))
    for perm in perms:
        votes: dict[str, list[float | None]] = {}
        winner_correct = False
        used = 0
        for j in perm:
            s = pool[j]
            used += 1
            if s.answer is not None:
                votes.setdefault(s.answer, []).append(conf(s))
            weight = {a: sum(0.5 if c is None else c for c in cs) for a, cs in votes.items()}
            ranked = sorted(weight, key=lambda a: (-weight[a], -len(votes[a]), a))
            counts = [*sorted((len(cs) for cs in votes.values()), reverse=True), 0, 0]
            gap_stop = False
            if ranked and mean_known(votes[ranked[0]]) is not None:
                c1 = mean_known(votes[ranked[0]])
                c2 = 0.0 if len(ranked) == 1 else mean_known(votes[ranked[1]])
                gap_stop = c2 is not None and c1 - c2 >= 0.5  # type: ignore[operator]
            beta_stop = counts[0] > 0 and beta_above_half(counts[0] + 1, counts[1] + 1) >= 0.95
            if gap_stop or beta_stop or used == 4:
                if ranked:
                    winner_correct = next(p.correct for p in pool if p.answer == ranked[0])
                break
        accuracy += winner_correct
        spent += used
    return accuracy / len(perms), spent / len(perms)


def _pools() -> list[list[Sample]]:
    rng = np.random.default_rng(5)
    pools = []
    for _ in range(6):
        pool = []
        for _ in range(4):
            answer = str(rng.integers(3)) if rng.random() > 0.15 else None
            correct = answer == "0"
            kind = rng.integers(3)
            confidence = float(rng.choice([0.2, 0.6, 0.95])) if kind == 0 else None
            mean_logprob = float(-rng.random()) if kind == 1 else None
            pool.append(
                Sample(answer=answer, correct=correct, confidence=confidence, mean_logprob=mean_logprob)
            )
        pools.append(pool)
    return pools


def test_replayed_votes_match_a_brute_force_over_every_order() -> None:
    pools = _pools()
    expected = [brute_force(pool) for pool in pools]
    mu = [sum(s.correct for s in pool) / 4 for pool in pools]
    summary = replay_policy(RESAMPLE_ALL, [0.5] * len(pools), mu, pools=pools, orders=4000, seed=1)
    assert summary.resample_replayed == len(pools)
    assert summary.resample_from_mu == 0
    want_accuracy = sum(a for a, _ in expected) / len(pools)
    want_samples = sum(n for _, n in expected)
    assert summary.accuracy == pytest.approx(want_accuracy, abs=0.02)
    assert summary.samples == pytest.approx(want_samples, abs=0.1)
    assert summary.accuracy != pytest.approx(sum(mu) / len(mu), abs=0.02)  # not the µ̂ credit
    assert set(summary.stopped_by) <= {
        "cas_confidence_gap(scale=10, margin=0.5, mode='threshold', level=0.5)",
        "beta_consensus(threshold=0.95)",
        "max_samples=4",
    }
    assert sum(summary.stopped_by.values()) == pytest.approx(1.0)


def test_a_query_without_a_pool_is_credited_with_mu_and_counted() -> None:
    pools = _pools()
    mu = [0.25] * len(pools)
    summary = replay_policy(RESAMPLE_ALL, [0.5] * len(pools), mu, pools=[None, *pools[1:]], orders=50)
    assert (summary.resample_replayed, summary.resample_from_mu) == (len(pools) - 1, 1)
    none = replay_policy(RESAMPLE_ALL, [0.5] * len(pools), mu)
    assert (none.resample_replayed, none.resample_from_mu) == (0, len(pools))
    assert none.accuracy == pytest.approx(0.25)
    assert none.samples == 4 * len(pools)
    with pytest.raises(ValueError, match="one entry per query"):
        replay_policy(RESAMPLE_ALL, [0.5], [0.5], pools=pools)


def test_simulate_command_replays_pools_and_says_when_there_are_none(tmp_path: Path) -> None:
    with_pools = tmp_path / "pools.jsonl"
    without = tmp_path / "plain.jsonl"
    rows, plain = [], []
    for i, pool in enumerate(_pools()):
        correct = sum(s.correct for s in pool)
        rows.append(
            {"id": f"q{i}", "k": 4, "correct": correct, "p": 0.5, "samples": [s.model_dump() for s in pool]}
        )
        plain.append({"id": f"q{i}", "k": 4, "correct": correct, "p": 0.5})
    with_pools.write_text("".join(json.dumps(r) + "\n" for r in rows))
    without.write_text("".join(json.dumps(r) + "\n" for r in plain))
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "name: all-resample\nbands:\n  - below: 0.99\n    action: resample\n    max_samples: 4\n"
        "    batch_size: 1\n  - action: answer\non_degraded: abstain\n"
    )
    runner = CliRunner()
    args = ["simulate", "--policy", str(policy), "--confidence", "p", "--no-sweep"]
    replayed = runner.invoke(app, [*args, "--data", str(with_pools)])
    assert replayed.exit_code == 0, replayed.output
    assert "votes replayed on the sample pools of 6 queries, 20 orders each" in replayed.output
    assert "resample stopped by (policy as written):" in replayed.output
    credited = runner.invoke(app, [*args, "--data", str(without)])
    assert credited.exit_code == 0, credited.output
    assert "has no per-sample pools; a resample is credited with µ̂" in credited.output
    as_json = json.loads(runner.invoke(app, [*args, "--data", str(with_pools), "--json"]).output)
    assert as_json["queries_with_pools"] == 6
    assert as_json["as_written"]["resample_replayed"] == 6


def test_the_default_stochastic_rule_replays_reproducibly_under_a_seed() -> None:
    policy = Policy.model_validate(
        {
            "name": "default-stop",
            "bands": [{"below": 0.99, "action": "resample", "max_samples": 4}, {"action": "answer"}],
            "on_degraded": "abstain",
        }
    )
    pools = _pools()
    mu = [0.25] * len(pools)
    first = replay_policy(policy, [0.5] * len(pools), mu, pools=pools, orders=30, seed=3)
    again = replay_policy(policy, [0.5] * len(pools), mu, pools=pools, orders=30, seed=3)
    assert first == again
    assert any(name.startswith("cas_frequency_gap(") for name in first.stopped_by)
