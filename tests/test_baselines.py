"""UniformRandom and ConstantPrior: the reference points every estimator must beat."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from _probe_helpers import random_queries

from capgate import DataError, NotFittedError
from capgate.estimators import ConstantPrior, UniformRandom
from capgate.metrics import capability_brier


def test_uniform_draws_are_uniform_over_distinct_queries() -> None:
    p = UniformRandom(random_state=0).predict(random_queries(5000, 1))
    counts = np.histogram(p, bins=10, range=(0.0, 1.0))[0]
    # 500 expected per decile; 5 sd of a binomial(5000, 0.1) is about 106
    assert np.all(np.abs(counts - 500) < 106), counts
    assert abs(p.mean() - 0.5) < 0.02
    assert len(np.unique(p)) == 5000


def test_uniform_matches_the_papers_expected_brier() -> None:
    # E[(U - µ)²] = 1/3 - µ + µ² for U ~ U(0, 1): 1/3 when µ is 0 or 1, 1/12 at µ = 0.5.
    p = UniformRandom(random_state=4).predict(random_queries(6000, 2))
    assert capability_brier(p, np.ones_like(p)) == pytest.approx(1 / 3, abs=0.01)
    assert capability_brier(p, np.full_like(p, 0.5)) == pytest.approx(1 / 12, abs=0.005)


def test_uniform_depends_on_the_seed_and_the_query_only() -> None:
    queries = random_queries(50, 3)
    a = UniformRandom(random_state=1).predict(queries)
    assert not np.array_equal(a, UniformRandom(random_state=2).predict(queries))
    np.testing.assert_array_equal(a[::-1], UniformRandom(random_state=1).predict(queries[::-1]))
    np.testing.assert_array_equal(a[:5], UniformRandom(random_state=1).predict(queries[:5]))


def test_uniform_treats_a_bare_question_and_its_one_turn_chat_alike() -> None:
    u = UniformRandom()
    chat = [{"role": "user", "content": "What is 2+2?"}]
    assert u.estimate_one("What is 2+2?").p == u.estimate_one(chat).p  # type: ignore[arg-type]
    with_system = [{"role": "system", "content": "Be brief."}, *chat]
    assert u.estimate_one(with_system).p != u.estimate_one(chat).p  # type: ignore[arg-type]


def test_uniform_accepts_feature_rows_and_ids() -> None:
    u = UniformRandom()
    X = np.arange(12.0).reshape(4, 3)
    p = u.predict(X)
    assert p.shape == (4,)
    np.testing.assert_array_equal(p[1:2], u.predict(X[1:2]))
    np.testing.assert_array_equal(u.predict(np.array(["a", "b"])), u.predict(["a", "b"]))


def test_uniform_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="`random_state` must be an integer"):
        UniformRandom(random_state="x").predict(["q"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sequence of queries or an array"):
        UniformRandom().predict("one string is not a batch")
    with pytest.raises(TypeError, match="expected a query"):
        UniformRandom().predict([3.5])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="`y` must have 2 entries"):
        UniformRandom().fit(["a", "b"], [0.5])


def test_constant_prior_is_the_weighted_mean() -> None:
    prior = ConstantPrior().fit(["a", "b", "c"], [1.0, 0.0, 0.5], sample_weight=[2.0, 1.0, 1.0])
    assert prior.prior_ == pytest.approx(0.625)
    assert prior.n_train_ == 3
    np.testing.assert_array_equal(prior.predict(np.zeros((4, 7))), np.full(4, 0.625))
    e = prior.estimate_one("anything")
    assert (e.p, e.method, e.degraded) == (0.625, "constant-prior", False)


def test_constant_prior_minimizes_brier_among_constants() -> None:
    rng = np.random.default_rng(5)
    mu = rng.beta(2, 3, size=400)
    prior = ConstantPrior().fit(np.zeros((400, 1)), mu)
    best = capability_brier(prior.predict(np.zeros((400, 1))), mu)
    for c in np.linspace(0, 1, 41):
        assert best <= capability_brier(np.full(400, c), mu) + 1e-12


def test_constant_prior_from_a_recorded_mean() -> None:
    prior = ConstantPrior.from_mean(0.42, n_train=100)
    assert prior.predict(["q"]).tolist() == [0.42]
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        ConstantPrior.from_mean(1.2, n_train=1)
    with pytest.raises(ValueError, match="`n_train` must be a positive integer"):
        ConstantPrior.from_mean(0.2, n_train=0)


def test_constant_prior_rejects_bad_weights_and_unfitted_use() -> None:
    with pytest.raises(ValueError, match="non-negative with a positive sum"):
        ConstantPrior().fit(["a", "b"], [0.1, 0.2], sample_weight=[0.0, 0.0])
    with pytest.raises(NotFittedError, match="This ConstantPrior instance is not fitted yet"):
        ConstantPrior().estimate(["q"])


def test_saved_baselines_are_plain_json_and_validated_on_load(tmp_path: Path) -> None:
    ConstantPrior().fit(["a", "b"], [0.25, 0.75]).save(tmp_path / "prior.json")
    assert json.loads((tmp_path / "prior.json").read_text()) == {
        "format": "capgate.constant_prior",
        "prior": 0.5,
        "n_train": 2,
    }
    (tmp_path / "bad.json").write_text('{"format": "capgate.constant_prior", "prior": 1.5, "n_train": 2}')
    with pytest.raises(DataError, match=r"bad\.json: field 'prior': .*less than or equal to 1; got 1\.5"):
        ConstantPrior.load(tmp_path / "bad.json")
    (tmp_path / "broken.json").write_text('{"format": "capgate.uniform_random",\n "random_state": }')
    with pytest.raises(DataError, match=r"broken.json:2: not valid JSON"):
        UniformRandom.load(tmp_path / "broken.json")
    with pytest.raises(DataError, match=r"expected a saved 'capgate\.uniform_random'; got format"):
        UniformRandom.load(tmp_path / "prior.json")
    (tmp_path / "seed.json").write_text('{"format": "capgate.uniform_random", "random_state": true}')
    with pytest.raises(DataError, match="field 'random_state': Input should be a valid integer; got True"):
        UniformRandom.load(tmp_path / "seed.json")
