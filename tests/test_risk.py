"""Risk-controlled thresholds (Learn-then-Test): p-values, the procedure, and its guarantee, checked
empirically over repeated calibration draws on synthetic data (exact population risk) and on MATH-500."""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray

from capgate.decision.analysis.risk import (
    binomial_cdf,
    binomial_tail_pvalue,
    calibrate_threshold,
    hoeffding_bentkus_pvalue,
    min_answered_to_reject,
)
from capgate.labels.labelled import read_labelled

MATH500 = Path(__file__).resolve().parents[1] / "sdk" / "assets" / "math500_gpt-oss-20b_probe-math.jsonl"
Array = NDArray[np.float64]


# ----------------------------------------------------------------------------- p-values


def exact_cdf(k: int, n: int, p: Fraction) -> Fraction:
    return sum((math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1)), Fraction(0))


@pytest.mark.parametrize("n", [1, 7, 40, 150])
@pytest.mark.parametrize("p", ["1/100", "1/10", "1/2", "19/20"])
def test_binomial_cdf_matches_exact_rational_arithmetic(n: int, p: str) -> None:
    q = Fraction(p)
    for k in range(-1, n + 1, max(1, n // 9)):
        assert binomial_cdf(k, n, float(q)) == pytest.approx(float(exact_cdf(k, n, q)), rel=1e-10, abs=1e-300)


def test_binomial_cdf_edges_and_errors() -> None:
    assert binomial_cdf(-1, 10, 0.3) == 0.0
    assert binomial_cdf(10, 10, 0.3) == 1.0
    assert binomial_cdf(3, 10, 0.0) == 1.0
    assert binomial_cdf(3, 10, 1.0) == 0.0
    assert binomial_tail_pvalue(0, 0, 0.1) == 1.0
    with pytest.raises(ValueError, match="`p` must be in"):
        binomial_cdf(1, 3, 1.5)
    with pytest.raises(ValueError, match="`n` must be"):
        binomial_cdf(1, -3, 0.5)


def test_hoeffding_bentkus_formula() -> None:
    n, r, a = 200, 0.03, 0.1
    h = r * math.log(r / a) + (1 - r) * math.log((1 - r) / (1 - a))
    hoeffding = math.exp(-n * h)
    bentkus = math.e * float(exact_cdf(6, n, Fraction(1, 10)))
    assert hoeffding_bentkus_pvalue(r, n, a) == pytest.approx(min(hoeffding, bentkus), rel=1e-9)
    assert hoeffding_bentkus_pvalue(0.2, 50, 0.1) == 1.0  # observed risk above alpha: no evidence
    assert hoeffding_bentkus_pvalue(0.0, 0, 0.1) == 1.0


@pytest.mark.parametrize("loss_kind", ["bernoulli", "beta"])
def test_hoeffding_bentkus_pvalue_is_valid_at_the_null_boundary(loss_kind: str) -> None:
    """Losses in [0, 1] with mean exactly alpha: P(p <= delta) <= delta (the e factor of Bentkus is
    what makes this hold for non-Bernoulli losses too)."""
    rng = np.random.default_rng(11)
    alpha, delta, n, reps = 0.1, 0.1, 60, 3000
    hits = 0
    for _ in range(reps):
        if loss_kind == "bernoulli":
            losses = (rng.random(n) < alpha).astype(float)
        else:
            losses = rng.beta(0.5, 4.5, size=n)  # mean 0.1
        hits += hoeffding_bentkus_pvalue(float(losses.mean()), n, alpha) <= delta
    assert hits / reps <= delta + 0.015


def test_min_answered_to_reject() -> None:
    for alpha, delta in [(0.1, 0.05), (0.05, 0.1), (0.01, 0.05), (0.3, 0.01)]:
        n = min_answered_to_reject(alpha, delta)
        assert (1 - alpha) ** n <= delta < (1 - alpha) ** (n - 1)
        assert binomial_tail_pvalue(0, n, alpha) <= delta < binomial_tail_pvalue(0, n - 1, alpha)
    with pytest.raises(ValueError, match="`alpha` must be a number in"):
        min_answered_to_reject(0.0, 0.1)


# ----------------------------------------------------------------------------- the procedure


def test_threshold_is_the_last_rejection_of_a_fixed_sequence() -> None:
    rng = np.random.default_rng(3)
    conf = rng.beta(5, 1.5, size=3000)
    mu = conf
    result = calibrate_threshold(conf, mu, alpha=0.1, delta=0.1, seed=4, procedure="fixed-sequence")
    tests = result.tests
    assert result.threshold is not None
    assert [t.threshold for t in tests] == sorted((t.threshold for t in tests), reverse=True)
    assert all(t.level == 0.1 for t in tests)
    assert all(t.rejected for t in tests[:-1])
    assert not tests[-1].rejected
    assert tests[-1].pvalue > 0.1
    assert result.threshold == tests[-2].threshold
    assert tests[0].n_answered >= result.min_answered == min_answered_to_reject(0.1, 0.1)
    answered = conf >= result.threshold
    assert result.n_answered == int(answered.sum())
    assert result.coverage == pytest.approx(answered.mean())
    assert result.mean_mu == pytest.approx(mu[answered].mean())
    # what it certifies is close to what an oracle with the true risk would pick
    lam = result.threshold
    assert 0.5 < lam < 0.85
    assert (1 - conf[answered]).mean() <= 0.1


def test_fallback_splits_delta_over_checkpoints_and_carries_it_down() -> None:
    rng = np.random.default_rng(8)
    conf = rng.beta(5, 1.5, size=3000)
    mu_hat = rng.binomial(10, conf) / 10
    result = calibrate_threshold(conf, mu_hat, alpha=0.1, delta=0.1, seed=1)
    assert result.procedure == "fallback"
    first = result.min_answered
    checkpoints = [first * 2**j for j in range(20) if first * 2**j <= 3000]
    share = 0.1 / len(checkpoints)
    assert min_answered_to_reject(0.1, share) <= first  # the first checkpoint can be certified at its share
    previous = None
    for test in result.tests:
        # a checkpoint adds a fresh share; otherwise the level is carried only after a rejection
        before = previous.n_answered if previous is not None else 0
        fresh = sum(share for m in checkpoints if before < m <= test.n_answered)
        carried = previous.level if previous is not None and previous.rejected else 0.0
        assert test.level == pytest.approx(fresh + carried)
        assert test.level <= 0.1 + 1e-12
        previous = test
    assert result.threshold == min(t.threshold for t in result.tests if t.rejected)


def test_fallback_recovers_from_an_early_failure_where_fixed_sequence_stops() -> None:
    """The most confident queries are the worst: the fixed sequence fails at once, the fallback
    procedure resumes at the next checkpoint and certifies a useful threshold."""
    rng = np.random.default_rng(9)
    conf = rng.beta(5, 1.5, size=2000)
    mu = np.where(conf > 0.97, 0.5, np.minimum(1.0, conf + 0.1))
    fixed = calibrate_threshold(conf, mu, alpha=0.1, delta=0.1, procedure="fixed-sequence", seed=2)
    fallback = calibrate_threshold(conf, mu, alpha=0.1, delta=0.1, seed=2)
    assert fixed.threshold is None
    assert fallback.threshold is not None
    assert fallback.coverage > 0.3
    assert not fallback.tests[0].rejected


def test_loss_choices_and_their_checks() -> None:
    conf = np.linspace(0.5, 1, 400)
    mu = np.clip(conf + 0.05, 0, 1)
    assert calibrate_threshold(conf, mu, alpha=0.2, delta=0.1).loss == "sampled"
    hb = calibrate_threshold(conf, mu, alpha=0.2, delta=0.1, pvalue="hoeffding-bentkus")
    assert hb.loss == "expected"
    assert hb.risk == pytest.approx(float((1 - mu[conf >= hb.threshold]).mean()))
    sampled_hb = calibrate_threshold(
        conf, mu, alpha=0.2, delta=0.1, pvalue="hoeffding-bentkus", loss="sampled"
    )
    assert sampled_hb.loss == "sampled"
    with pytest.raises(ValueError, match="binomial p-value needs 0/1 losses"):
        calibrate_threshold(conf, mu, alpha=0.2, delta=0.1, loss="expected")


def test_sampled_loss_is_seeded_and_draws_one_response_per_query() -> None:
    rng = np.random.default_rng(0)
    conf = rng.uniform(0.5, 1, size=2000)
    mu = np.full(2000, 0.8)
    a = calibrate_threshold(conf, mu, alpha=0.3, delta=0.1, seed=1)
    b = calibrate_threshold(conf, mu, alpha=0.3, delta=0.1, seed=1)
    c = calibrate_threshold(conf, mu, alpha=0.3, delta=0.1, seed=2)
    assert a == b
    assert a.tests != c.tests
    # one Bernoulli(1 - µ̂) draw per query: the sampled risk of all queries is near 0.2
    assert a.threshold == 0.0
    assert a.risk == pytest.approx(0.2, abs=0.03)


def test_missing_confidences_are_left_out() -> None:
    conf = np.array([0.9] * 50 + [math.nan] * 10)
    mu = np.ones(60)
    result = calibrate_threshold(conf, mu, alpha=0.1, delta=0.1)
    assert (result.n, result.n_unusable) == (50, 10)
    assert result.threshold == 0.0
    assert result.coverage == 1.0


def test_nothing_certifiable_returns_none() -> None:
    conf = np.linspace(0, 1, 500)
    mu = np.full(500, 0.5)  # every answer is wrong half the time
    result = calibrate_threshold(conf, mu, alpha=0.1, delta=0.05)
    assert result.threshold is None
    assert result.n_answered == 0
    assert math.isnan(result.risk)
    assert result.tests
    assert not any(t.rejected for t in result.tests)
    assert len(calibrate_threshold(conf, mu, alpha=0.1, delta=0.05, procedure="fixed-sequence").tests) == 1
    tiny = calibrate_threshold([0.9] * 5, [1.0] * 5, alpha=0.1, delta=0.05)
    assert tiny.threshold is None
    assert tiny.tests == ()  # never answers the 29 queries needed to certify anything


def test_larger_alpha_never_raises_the_threshold() -> None:
    """With a fixed start and the same draw, each p-value falls as alpha grows, so the rejected prefix
    of the fixed sequence can only lengthen."""
    rng = np.random.default_rng(5)
    conf = rng.beta(4, 2, size=2000)
    mu = conf
    lams = [
        calibrate_threshold(
            conf, mu, alpha=a, delta=0.1, seed=1, procedure="fixed-sequence", start=0.9
        ).threshold
        for a in (0.15, 0.2, 0.25, 0.3)
    ]
    assert None not in lams
    assert lams == sorted(lams, reverse=True)  # type: ignore[type-var]


def test_fixed_start_and_custom_grid() -> None:
    rng = np.random.default_rng(6)
    conf = rng.beta(5, 1.5, size=2000)
    fixed = calibrate_threshold(conf, conf, alpha=0.1, delta=0.1, start=0.9, procedure="fixed-sequence")
    assert fixed.tests[0].threshold == 0.9
    too_high = calibrate_threshold(conf, conf, alpha=0.1, delta=0.1, start=1.0, procedure="fixed-sequence")
    assert too_high.threshold is None  # nothing has p >= 1: a fixed start there certifies nothing
    grid = calibrate_threshold(conf, conf, alpha=0.1, delta=0.1, grid=[0.9, 0.8, 0.7, 0.6, 0.5])
    assert grid.threshold in {0.9, 0.8, 0.7, 0.6, 0.5}
    later = calibrate_threshold(conf, conf, alpha=0.1, delta=0.1, min_answered=500)
    assert later.tests[0].n_answered >= 500


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"alpha": 1.0}, "`alpha` must be a number in"),
        ({"delta": 0.0}, "`delta` must be a number in"),
        ({"pvalue": "t-test"}, "`pvalue` must be"),
        ({"loss": "mean"}, "`loss` must be"),
        ({"grid": 1}, "`grid` must be at least 2"),
        ({"grid": [1.5]}, "`grid` must be an integer"),
        ({"start": 2.0, "procedure": "fixed-sequence"}, "`start` must be"),
        ({"start": 0.5}, "needs procedure='fixed-sequence'"),
        ({"procedure": "bonferroni"}, "`procedure` must be"),
        ({"min_answered": 0}, "`min_answered` must be a positive integer"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {"alpha": 0.1, "delta": 0.1, **kwargs}
    with pytest.raises(ValueError, match=match):
        calibrate_threshold([0.5, 0.6], [1.0, 1.0], **args)  # type: ignore[arg-type]


def test_bad_arrays_are_named() -> None:
    with pytest.raises(ValueError, match="same length"):
        calibrate_threshold([0.5, 0.6], [1.0], alpha=0.1, delta=0.1)
    with pytest.raises(ValueError, match="`p` must be in"):
        calibrate_threshold([1.5], [1.0], alpha=0.1, delta=0.1)
    with pytest.raises(ValueError, match="`mu_hat` must be in"):
        calibrate_threshold([0.5], [math.nan], alpha=0.1, delta=0.1)
    with pytest.raises(ValueError, match="one-dimensional"):
        calibrate_threshold([[0.5]], [[1.0]], alpha=0.1, delta=0.1)


# ----------------------------------------------------------------------------- the guarantee, empirically


class Synthetic:
    """Confidence C ~ Beta(a, b) and capability µ(C); the population selective risk
    R(λ) = E[1 - µ(C) | C >= λ] is computed by quadrature (error < 1e-6)."""

    def __init__(self, a: float, b: float, mu: Callable[[Array], Array], k: int = 10) -> None:
        self.a, self.b, self.mu, self.k = a, b, mu, k
        grid = (np.arange(400_000) + 0.5) / 400_000
        dens = grid ** (a - 1) * (1 - grid) ** (b - 1)
        self._grid = grid
        self._mass = np.cumsum((dens)[::-1])[::-1]
        self._loss = np.cumsum((dens * (1 - mu(grid)))[::-1])[::-1]

    def risk(self, lam: float) -> float:
        i = int(np.searchsorted(self._grid, lam))
        return 0.0 if i >= self._grid.size else float(self._loss[i] / self._mass[i])

    def coverage(self, lam: float) -> float:
        i = int(np.searchsorted(self._grid, lam))
        return 0.0 if i >= self._grid.size else float(self._mass[i] / self._mass[0])

    def draw(self, n: int, rng: np.random.Generator) -> tuple[Array, Array]:
        conf = rng.beta(self.a, self.b, size=n)
        mu_hat = rng.binomial(self.k, self.mu(conf)) / self.k
        return conf, mu_hat

    def oracle(self, alpha: float) -> float:
        lams = np.linspace(0, 1, 1001)
        return float(min(lam for lam in lams if self.risk(lam) <= alpha))


SCENARIOS = {
    "calibrated": Synthetic(5, 1.5, lambda c: c),
    "overconfident": Synthetic(5, 1.5, lambda c: c**2),
    # the most confident queries are the worst: risk is not monotone in the confidence
    "inverted top": Synthetic(5, 1.5, lambda c: np.where(c > 0.97, 0.75, np.minimum(1.0, c + 0.08))),
}


ALPHA = {"calibrated": 0.1, "overconfident": 0.15, "inverted top": 0.1}


@pytest.mark.parametrize(
    ("scenario", "pvalue", "loss", "procedure"),
    [
        (scenario, pvalue, loss, procedure)
        for scenario in SCENARIOS
        for pvalue, loss, procedure in [
            ("binomial", "sampled", "fallback"),
            ("binomial", "sampled", "fixed-sequence"),
            ("hoeffding-bentkus", "expected", "fallback"),
        ]
        if not (scenario == "inverted top" and procedure == "fixed-sequence")  # never certifies: see above
    ],
)
def test_guarantee_holds_over_repeated_calibration_draws(
    scenario: str, pvalue: str, loss: str, procedure: str
) -> None:
    """P(R(λ̂) > alpha) <= delta: over 200 independent calibration sets of 2000 queries, the frequency
    of a population risk above alpha stays within delta plus sampling slack (3 standard errors)."""
    model, alpha = SCENARIOS[scenario], ALPHA[scenario]
    delta, reps, n = 0.1, 200, 2000
    rng = np.random.default_rng(2024)
    violations, found, coverage = 0, 0, 0.0
    for rep in range(reps):
        conf, mu_hat = model.draw(n, rng)
        result = calibrate_threshold(
            conf,
            mu_hat,
            alpha=alpha,
            delta=delta,
            pvalue=pvalue,  # type: ignore[arg-type]
            loss=loss,  # type: ignore[arg-type]
            procedure=procedure,  # type: ignore[arg-type]
            seed=rep,
        )
        if result.threshold is None:
            continue
        found += 1
        violations += model.risk(result.threshold) > alpha
        coverage += model.coverage(result.threshold)
    slack = 3 * math.sqrt(delta * (1 - delta) / reps)
    assert violations / reps <= delta + slack
    # not vacuous: it usually certifies a threshold answering a good share of what an oracle would
    oracle = model.coverage(model.oracle(alpha))
    if procedure == "fallback":
        assert found >= 0.95 * reps
        assert coverage / reps >= 0.6 * oracle
    else:
        assert found >= 0.7 * reps
        assert coverage / reps >= 0.4 * oracle


def test_naive_threshold_violates_often_so_the_check_can_fail() -> None:
    """Negative control: the lowest threshold whose *empirical* risk is <= alpha exceeds alpha in
    the population about half the time; the same check as above catches it."""
    model = SCENARIOS["calibrated"]
    alpha, reps = 0.1, 200
    rng = np.random.default_rng(7)
    violations = 0
    for _ in range(reps):
        conf, mu_hat = model.draw(2000, rng)
        order = np.argsort(-conf)
        risks = np.cumsum(1 - mu_hat[order]) / np.arange(1, conf.size + 1)
        ok = np.nonzero(risks <= alpha)[0]
        naive = float(conf[order][ok.max()])
        violations += model.risk(naive) > alpha
    assert violations / reps > 0.3


def math500() -> tuple[Array, Array]:
    data = read_labelled(MATH500, confidence=["probe_conf_raw"])
    return data.confidences["probe_conf_raw"], data.mu_hat


@pytest.mark.parametrize(
    ("pvalue", "alpha"), [("binomial", 0.05), ("binomial", 0.03), ("hoeffding-bentkus", 0.05)]
)
def test_guarantee_on_math500_random_splits(pvalue: str, alpha: float) -> None:
    """200 random calibration/test halves of MATH-500: the test half's error rate among answered
    queries (mean 1 - µ̂, µ̂ from 100 samples) exceeds alpha in at most delta + slack of the splits."""
    conf, mu = math500()
    assert conf.size == 500
    delta, reps = 0.1, 200
    rng = np.random.default_rng(500)
    violations, certified = 0, 0
    for rep in range(reps):
        perm = rng.permutation(conf.size)
        cal, test = perm[:250], perm[250:]
        result = calibrate_threshold(conf[cal], mu[cal], alpha=alpha, delta=delta, pvalue=pvalue, seed=rep)  # type: ignore[arg-type]
        if result.threshold is None:
            continue
        certified += 1
        answered = conf[test] >= result.threshold
        violations += bool(answered.any()) and float((1 - mu[test][answered]).mean()) > alpha
    assert violations / reps <= delta + 3 * math.sqrt(delta * (1 - delta) / reps)
    assert certified >= 0.3 * reps  # 250 queries do not always suffice for a 3-5% risk


def test_guarantee_on_math500_as_a_population() -> None:
    """The 500 queries as the population: calibration sets drawn from it with replacement, the risk
    of λ̂ computed exactly over all 500 (with µ̂ as each query's capability)."""
    conf, mu = math500()
    alpha, delta, reps = 0.05, 0.1, 200
    rng = np.random.default_rng(501)
    violations = 0
    for rep in range(reps):
        idx = rng.integers(0, conf.size, size=300)
        result = calibrate_threshold(conf[idx], mu[idx], alpha=alpha, delta=delta, seed=rep)
        if result.threshold is not None:
            violations += float((1 - mu[conf >= result.threshold]).mean()) > alpha
    assert violations / reps <= delta + 3 * math.sqrt(delta * (1 - delta) / reps)


def test_numpy_integer_settings_are_taken_as_ints() -> None:
    """``grid`` and ``min_answered`` take numpy integers, as every other integer setting does."""
    p = np.linspace(0.0, 1.0, 50)
    mu = (p > 0.3).astype(np.float64)
    for setting, value in (("grid", 11), ("min_answered", 5)):
        got = calibrate_threshold(p, mu, alpha=0.2, delta=0.1, **{setting: np.int64(value)})  # type: ignore[arg-type]
        assert got == calibrate_threshold(p, mu, alpha=0.2, delta=0.1, **{setting: value})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`grid` must be at least 2 thresholds; got np.int64\(1\)"):
        calibrate_threshold(p, mu, alpha=0.2, delta=0.1, grid=np.int64(1))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`min_answered` must be a positive integer; got True"):
        calibrate_threshold(p, mu, alpha=0.2, delta=0.1, min_answered=True)
