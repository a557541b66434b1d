"""The learn-from-traffic bench scores honestly (bench/learn_from_traffic.py): the next traffic is
never traffic the learner saw, no replayed query is one the shipped probe was fitted on, outcomes
are draws from each query's µ̂, and replays are reproducible from their seed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import learn_from_traffic as bench

ASSETS = Path(__file__).resolve().parents[1] / "sdk" / "assets"


@pytest.fixture(scope="module")
def queries() -> list[bench.Query]:
    return bench.load_traffic(ASSETS / "default_labels.jsonl", ASSETS / "default_split.json")


def test_the_traffic_is_the_held_out_split_apart_from_the_shipped_probes_training(
    queries: list[bench.Query],
) -> None:
    split = json.loads((ASSETS / "default_split.json").read_text())
    assert {q.id for q in queries} == set(split["test"])
    train_ids, train_prompts = bench.shipped_training()
    assert (
        len(train_ids) == json.loads((ASSETS / "default_probe" / "probe.json").read_text())["training"]["n"]
    )
    assert not {q.id for q in queries} & train_ids
    assert not {q.prompt for q in queries} & train_prompts


def test_a_label_file_replaying_a_training_query_is_refused(tmp_path: Path) -> None:
    split = json.loads((ASSETS / "default_split.json").read_text())
    trained = split["train"][0]
    split_file = tmp_path / "split.json"
    split_file.write_text(json.dumps({"train": [], "test": [trained, split["test"][0]]}))
    with pytest.raises(SystemExit, match=f"replayed query {trained!r} is one the shipped default probe"):
        bench.load_traffic(ASSETS / "default_labels.jsonl", split_file)


def test_the_next_traffic_is_never_seen_by_the_learner(queries: list[bench.Query]) -> None:
    for index in range(3):
        replay = bench.draw_replay(queries, index, seed=0, next_share=0.4, n=1000)
        assert not set(replay.stream.tolist()) & set(replay.next.tolist())
        assert len(replay.stream) == 1000
        assert abs(len(replay.next) - 0.4 * len(queries)) <= len({q.source for q in queries})
        # the learner's pool recurs in seeded rounds: each pool query at least n // pool times
        counts = np.bincount(replay.stream, minlength=len(queries))[replay.stream]
        assert counts.min() >= 1000 // (len(queries) - len(replay.next))


def test_replays_are_seeded_and_differ_from_one_another(queries: list[bench.Query]) -> None:
    a = bench.draw_replay(queries, 0, seed=0, next_share=0.4, n=300)
    b = bench.draw_replay(queries, 0, seed=0, next_share=0.4, n=300)
    c = bench.draw_replay(queries, 1, seed=0, next_share=0.4, n=300)
    assert np.array_equal(a.stream, b.stream)
    assert np.array_equal(a.outcomes, b.outcomes)
    assert not np.array_equal(a.next, c.next)


def test_outcomes_are_draws_from_each_querys_measured_capability(queries: list[bench.Query]) -> None:
    mu = np.array([q.mu for q in queries])
    drawn, expected = [], []
    for index in range(20):
        replay = bench.draw_replay(queries, index, seed=1, next_share=0.4, n=1000)
        drawn.append(replay.outcomes.mean())
        expected.append(mu[replay.stream].mean())
        assert not replay.outcomes[mu[replay.stream] == 0.0].any()  # never right where µ̂ = 0
    assert abs(np.mean(drawn) - np.mean(expected)) < 0.01


def test_the_two_stage_bootstrap_brackets_the_pooled_mean() -> None:
    rng = np.random.default_rng(0)
    per_replay = [(rng.uniform(0, 0.1, 50),) for _ in range(8)]
    point, lo, hi = bench.two_stage_bootstrap(per_replay, bench._mean_brier, seed=0, n_boot=300)
    assert lo < point < hi
    assert point == pytest.approx(np.mean(np.concatenate([c[0] for c in per_replay])))
    flat = [(np.full(10, 0.04),) for _ in range(4)]
    assert bench.two_stage_bootstrap(flat, bench._mean_brier, seed=0, n_boot=50) == pytest.approx((0.04,) * 3)
