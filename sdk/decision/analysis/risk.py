"""Risk-controlled answer thresholds by Learn-then-Test (LTT).

Given calibration queries (a confidence p_i and an empirical capability µ̂_i = c_i / k_i from k_i
graded responses), pick the lowest threshold λ̂ such that answering the queries with p >= λ̂
keeps the *selective risk*

    R(λ) = P(a response sampled for an answered query is wrong | p >= λ) = E[1 - µ(X) | p(X) >= λ]

at or below ``alpha`` with probability at least ``1 - delta`` over the calibration draw.

Procedure (Angelopoulos, Bates, Candès, Jordan & Lei, "Learn then Test", 2021): walking a fixed
grid of λ from high to low, test H_λ: R(λ) > alpha with a p-value from the n_λ queries λ answers,
and return the lowest λ rejected. Controlling the family-wise error rate at delta gives
P(R(λ̂) > alpha) <= delta. Two procedures:

* ``"fixed-sequence"``: reject while p_λ <= delta, stop at the first failure (no multiplicity
  correction, but one chance error among the most confident queries stops everything).
* ``"fallback"`` (default; Wiens, 2003; Wiens & Dmitrienko, 2005): delta is split over J
  checkpoints; a hypothesis is tested at its share plus the previous one's whole level if that was
  rejected, so after a failure the walk resumes at the next checkpoint, and while it rejects its
  level grows back towards delta. Valid under any dependence between the p-values.

The loss of an answered query, and how µ̂ enters
------------------------------------------------
Deployed, a query is answered with one sampled response, wrong with probability 1 - µ(x): the loss
is the Bernoulli "this sampled response is wrong", and R(λ) its mean over answered queries. Two
valid tests follow:

* ``loss="sampled"`` (default with the binomial p-value): draw ONE of each query's k graded
  responses at random (seeded): given n_λ, the answered losses are i.i.d. Bernoulli(R(λ)) and the
  exact binomial tail P(Binomial(n_λ, alpha) <= errors) is a valid p-value. Pooling all k
  responses into one binomial count would NOT be valid: responses to one query share µ(x) and are
  over-dispersed, which makes that test anti-conservative.
* ``loss="expected"``: 1 - µ̂_i, an unbiased estimate of 1 - µ(x_i) from all k responses (less
  noise, no randomness). Bounded but not Bernoulli, it needs the Hoeffding–Bentkus p-value
  (``pvalue="hoeffding-bentkus"``, which also accepts sampled losses); the binomial refuses it.

Where the tests start
---------------------
With fewer answered queries than n_min, the smallest n with (1 - alpha)^n <= level, no p-value
can reach the level even with zero errors. So the fixed sequence (``start="auto"``) begins at the
highest grid threshold answering n_min queries, and the fallback checkpoints sit where the
answered count first reaches n_min, 2 n_min, 4 n_min, ... (n_min for the share delta / J). These
positions depend on the confidences (never the labels), unlike the textbook procedures': for the
fixed sequence this errs on the safe side when the queries above the start are no riskier than
those just below it; in general the departure is small (checked in the tests, including a case
whose most confident queries are its worst, and in ``bench/risk_control_bench.py``).
``procedure="fixed-sequence", start=<λ0>`` keeps the guarantee unconditionally.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

import numpy as np
from numpy.typing import ArrayLike, NDArray

from capgate._util.validate import check_choice, check_int_at_least, check_positive_int, check_unit_interval

__all__ = [
    "Loss",
    "PValue",
    "Procedure",
    "RiskControl",
    "ThresholdTest",
    "binomial_cdf",
    "binomial_tail_pvalue",
    "calibrate_threshold",
    "hoeffding_bentkus_pvalue",
    "min_answered_to_reject",
]

PValue: TypeAlias = Literal["binomial", "hoeffding-bentkus"]
"""Which p-value tests H_λ: R(λ) > alpha."""

Procedure: TypeAlias = Literal["fallback", "fixed-sequence"]
"""How the thresholds are tested in sequence (see the module docstring)."""

Loss: TypeAlias = Literal["auto", "sampled", "expected"]
"""The loss of an answered query: one sampled response's error, or the expected error 1 - µ̂.
``auto`` is ``sampled`` for the binomial p-value and ``expected`` for Hoeffding–Bentkus."""


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(Binomial(n, p) <= k), computed in log space (exact up to float rounding).

    Examples:
        >>> round(binomial_cdf(1, 3, 0.5), 6)
        0.5
    """
    if n < 0:
        raise ValueError(f"`n` must be a non-negative integer; got {n}")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"`p` must be in [0, 1]; got {p}")
    if k < 0:
        return 0.0
    if k >= n or p == 0.0:
        return 1.0
    if p == 1.0:
        return 0.0
    i = np.arange(k + 1, dtype=np.float64)
    log_fact = np.concatenate(([0.0], np.cumsum(np.log(np.arange(1, n + 1, dtype=np.float64)))))
    ks = np.arange(k + 1)
    log_pmf = log_fact[n] - log_fact[ks] - log_fact[n - ks] + i * math.log(p) + (n - i) * math.log1p(-p)
    top = float(log_pmf.max())
    return float(min(1.0, math.exp(top) * float(np.exp(log_pmf - top).sum())))


def binomial_tail_pvalue(errors: int, n: int, alpha: float) -> float:
    """Exact p-value of H: risk > alpha from ``errors`` wrong out of ``n`` i.i.d. Bernoulli losses:
    ``P(Binomial(n, alpha) <= errors)``; 1 when ``n`` is 0.

    Examples:
        >>> round(binomial_tail_pvalue(0, 29, 0.1), 4)
        0.0471
    """
    if n == 0:
        return 1.0
    return binomial_cdf(int(errors), int(n), alpha)


def hoeffding_bentkus_pvalue(risk: float, n: int, alpha: float) -> float:
    """Hoeffding–Bentkus p-value of H: mean loss > alpha, for i.i.d. losses in [0, 1].

    ``min(exp(-n h(min(risk, alpha), alpha)), e * P(Binomial(n, alpha) <= ceil(n risk)))`` with
    h(a, b) = a log(a/b) + (1-a) log((1-a)/(1-b)) (Bates et al. 2021, "Distribution-free,
    risk-controlling prediction sets"); 1 when ``n`` is 0.

    Examples:
        >>> round(hoeffding_bentkus_pvalue(0.0, 29, 0.1), 4)
        0.0471
    """
    if n == 0:
        return 1.0
    r = min(max(risk, 0.0), alpha)
    if r == 0.0:
        h = -math.log1p(-alpha)
    else:
        h = r * math.log(r / alpha) + (1.0 - r) * math.log((1.0 - r) / (1.0 - alpha))
    hoeffding = math.exp(-n * max(h, 0.0))
    bentkus = math.e * binomial_cdf(math.ceil(n * risk - 1e-9), n, alpha)
    return float(min(1.0, hoeffding, bentkus))


def min_answered_to_reject(alpha: float, delta: float) -> int:
    """The fewest answered queries with which a zero-error sample can reject R > alpha at delta:
    the smallest n with (1 - alpha)^n <= delta (both p-values' value at zero errors).

    Examples:
        >>> min_answered_to_reject(0.1, 0.05)
        29
    """
    check_unit_interval("alpha", alpha, open_ends=True)
    check_unit_interval("delta", delta, open_ends=True)
    return max(1, math.ceil(math.log(delta) / math.log1p(-alpha) - 1e-12))


@dataclass(frozen=True)
class ThresholdTest:
    """One hypothesis tested in the sequence.

    Attributes:
        threshold: λ (queries with p >= λ are answered).
        n_answered: Calibration queries answered at λ.
        risk: Mean loss among them.
        pvalue: p-value of H_λ: R(λ) > alpha.
        level: The level it was tested at (rejected when ``pvalue <= level``).
    """

    threshold: float
    n_answered: int
    risk: float
    pvalue: float
    level: float

    @property
    def rejected(self) -> bool:
        """Whether H_λ was rejected: λ is certified."""
        return self.pvalue <= self.level


@dataclass(frozen=True)
class RiskControl:
    """The outcome of :func:`calibrate_threshold`.

    Attributes:
        threshold: λ̂, the answer threshold (answer when p >= λ̂), or ``None`` when no grid
            threshold could be certified: then answering nothing is the only safe choice.
        alpha: Target selective risk.
        delta: Allowed probability that the risk exceeds ``alpha``.
        pvalue: The p-value used.
        loss: The loss used (``sampled`` or ``expected``).
        procedure: The multiple-testing procedure used.
        n: Calibration queries with a usable confidence.
        n_unusable: Queries skipped because their confidence is missing (NaN).
        n_answered: Calibration queries answered at λ̂ (0 when ``threshold`` is None).
        risk: Mean loss of those (NaN when none).
        mean_mu: Mean µ̂ of those: the expected accuracy of answering them (NaN when none).
        min_answered: The answered count at which testing begins (the first checkpoint).
        tests: Every hypothesis tested, in order.
    """

    threshold: float | None
    alpha: float
    delta: float
    pvalue: PValue
    loss: Literal["sampled", "expected"]
    procedure: Procedure
    n: int
    n_unusable: int
    n_answered: int
    risk: float
    mean_mu: float
    min_answered: int
    tests: tuple[ThresholdTest, ...]

    @property
    def coverage(self) -> float:
        """Fraction of usable calibration queries answered at λ̂."""
        return self.n_answered / self.n if self.n else 0.0


def check_p_mu(conf: NDArray[np.float64], mu: NDArray[np.float64]) -> NDArray[np.bool_]:
    """Where ``conf`` has an estimate (not NaN); a ``ValueError`` unless every confidence is in
    [0, 1] or NaN and every µ̂ in [0, 1]."""
    usable = ~np.isnan(conf)
    if np.any((conf[usable] < 0.0) | (conf[usable] > 1.0)):
        raise ValueError("`p` must be in [0, 1] (NaN for a missing estimate)")
    if np.any(np.isnan(mu)) or np.any((mu < 0.0) | (mu > 1.0)):
        raise ValueError("`mu_hat` must be in [0, 1] with no NaN")
    return usable


def _as_array(name: str, values: ArrayLike) -> NDArray[np.float64]:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"`{name}` must be one-dimensional; got shape {arr.shape}")
    return arr


def calibrate_threshold(
    p: ArrayLike,
    mu_hat: ArrayLike,
    *,
    alpha: float,
    delta: float,
    pvalue: PValue = "binomial",
    loss: Loss = "auto",
    procedure: Procedure = "fallback",
    grid: int | Sequence[float] = 1001,
    start: float | Literal["auto"] = "auto",
    min_answered: int | None = None,
    seed: int = 0,
) -> RiskControl:
    """Pick the answer threshold whose selective risk is <= alpha with probability >= 1 - delta.

    See the module docstring for the procedure, the loss and the guarantee.

    Args:
        p: Confidence (predicted capability) per calibration query; NaN marks a missing estimate
            (such queries go to the policy's fail-safe and are left out).
        mu_hat: Empirical capability µ̂ = correct / k per query.
        alpha: Target selective risk, in (0, 1).
        delta: Allowed failure probability, in (0, 1).
        pvalue: ``"binomial"`` (exact, needs sampled 0/1 losses) or ``"hoeffding-bentkus"``.
        loss: ``"sampled"``, ``"expected"`` or ``"auto"`` (see :data:`Loss`).
        procedure: ``"fallback"`` or ``"fixed-sequence"`` (see the module docstring).
        grid: Number of evenly spaced thresholds in [0, 1], or the thresholds themselves.
        start: Fixed sequence only: ``"auto"`` begins at the highest threshold answering at least
            ``min_answered`` calibration queries; a number begins at that threshold.
        min_answered: The answered count where testing begins (the first fallback checkpoint, or
            the ``"auto"`` start); default n_min, the fewest that can be certified at the level
            there (:func:`min_answered_to_reject`).
        seed: Seed of the one-response draw of ``loss="sampled"``.

    Returns:
        The threshold and the evidence for it.

    Raises:
        ValueError: Mismatched or out-of-range inputs, or an invalid loss/p-value pair.

    Examples:
        >>> rng = np.random.default_rng(1)
        >>> conf = rng.beta(5, 1.5, size=3000)
        >>> mu_hat = rng.binomial(10, conf) / 10  # a calibrated estimator, 10 graded responses each
        >>> result = calibrate_threshold(conf, mu_hat, alpha=0.1, delta=0.1)
        >>> result.threshold, round(result.coverage, 2)
        (0.869, 0.32)
    """
    check_unit_interval("alpha", alpha, open_ends=True)
    check_unit_interval("delta", delta, open_ends=True)
    conf = _as_array("p", p)
    mu = _as_array("mu_hat", mu_hat)
    if conf.shape != mu.shape:
        raise ValueError(f"`p` and `mu_hat` must have the same length; got {conf.size} and {mu.size}")
    usable = check_p_mu(conf, mu)
    check_choice("pvalue", pvalue, ("binomial", "hoeffding-bentkus"))
    check_choice("loss", loss, ("auto", "sampled", "expected"))
    resolved: Literal["sampled", "expected"] = (
        ("sampled" if pvalue == "binomial" else "expected") if loss == "auto" else loss
    )
    if pvalue == "binomial" and resolved == "expected":
        raise ValueError(
            "the binomial p-value needs 0/1 losses: use loss='sampled' (one response per query) or "
            "pvalue='hoeffding-bentkus' for the expected loss 1 - µ̂"
        )
    check_choice("procedure", procedure, ("fallback", "fixed-sequence"))
    thresholds = _grid(grid)
    if start != "auto" and not (isinstance(start, int | float) and 0.0 <= start <= 1.0):
        raise ValueError(f"`start` must be 'auto' or a threshold in [0, 1]; got {start!r}")
    if start != "auto" and procedure != "fixed-sequence":
        raise ValueError("a fixed `start` needs procedure='fixed-sequence'")
    if min_answered is not None:
        min_answered = check_positive_int("min_answered", min_answered)

    conf_u, mu_u = conf[usable], mu[usable]
    if resolved == "sampled":
        losses = (np.random.default_rng(seed).random(mu_u.size) < 1.0 - mu_u).astype(np.float64)
    else:
        losses = 1.0 - mu_u
    order = np.argsort(-conf_u, kind="stable")
    neg_sorted = -conf_u[order]
    cum_loss = np.concatenate(([0.0], np.cumsum(losses[order])))
    cum_mu = np.concatenate(([0.0], np.cumsum(mu_u[order])))
    counts = np.searchsorted(neg_sorted, -thresholds, side="right")

    @functools.cache
    def pvalue_at(n_ans: int) -> float:
        total = float(cum_loss[n_ans])
        if n_ans == 0:
            return 1.0
        if pvalue == "binomial":
            return binomial_tail_pvalue(round(total), n_ans, alpha)
        return hoeffding_bentkus_pvalue(total / n_ans, n_ans, alpha)

    # fresh level granted at each grid threshold: all of delta at the start of a fixed sequence, or
    # delta / J at each fallback checkpoint (where the answered count first reaches m0 * 2^j)
    fresh = np.zeros(thresholds.size)
    if procedure == "fixed-sequence":
        n_first = min_answered if min_answered is not None else min_answered_to_reject(alpha, delta)
        eligible = counts >= n_first if start == "auto" else thresholds <= start
        if eligible.any():
            fresh[int(np.argmax(eligible))] = delta
        carry_after_failure = False
    else:
        checkpoints = _checkpoints(int(conf_u.size), alpha, delta, min_answered)
        n_first = checkpoints[0] if checkpoints else min_answered_to_reject(alpha, delta)
        share = delta / len(checkpoints) if checkpoints else 0.0
        for m in checkpoints:
            reached = counts >= m
            if reached.any():
                fresh[int(np.argmax(reached))] += share
        carry_after_failure = True

    tests: list[ThresholdTest] = []
    best: tuple[float, int] | None = None
    level, previous_rejected = 0.0, False
    for lam, n_ans, grant in zip(thresholds, counts, fresh, strict=True):
        level = grant + (level if previous_rejected else 0.0)
        if level <= 0.0:
            previous_rejected = False
            continue
        n_ans = int(n_ans)
        risk = float(cum_loss[n_ans]) / n_ans if n_ans else math.nan
        test = ThresholdTest(float(lam), n_ans, risk, pvalue_at(n_ans), float(level))
        tests.append(test)
        previous_rejected = test.rejected
        if test.rejected:
            best = (float(lam), n_ans)
        elif not carry_after_failure:
            break

    if best is None:
        threshold, n_ans, risk, mean_mu = None, 0, math.nan, math.nan
    else:
        threshold, n_ans = best
        risk = float(cum_loss[n_ans]) / n_ans
        mean_mu = float(cum_mu[n_ans]) / n_ans
    return RiskControl(
        threshold=threshold,
        alpha=float(alpha),
        delta=float(delta),
        pvalue=pvalue,
        loss=resolved,
        procedure=procedure,
        n=int(conf_u.size),
        n_unusable=int(conf.size - conf_u.size),
        n_answered=n_ans,
        risk=risk,
        mean_mu=mean_mu,
        min_answered=n_first,
        tests=tuple(tests),
    )


def _checkpoints(n: int, alpha: float, delta: float, first: int | None) -> list[int]:
    """Answered counts m0, 2 m0, 4 m0, ... (up to n), each given an equal share of delta.

    m0 is ``first`` or the fewest queries certifiable at the share delta / J, J the number of
    doublings of m0 that fit in n: a fixed point, found by raising J until it no longer grows.
    """
    parts = 1
    while True:
        m0 = first if first is not None else min_answered_to_reject(alpha, delta / parts)
        points: list[int] = []
        m = m0
        while m <= n:
            points.append(m)
            m *= 2
        if len(points) <= parts:
            return points
        parts = len(points)


def _grid(grid: int | Sequence[float]) -> NDArray[np.float64]:
    """Candidate thresholds, from high to low."""
    if isinstance(grid, int | np.integer) and not isinstance(grid, bool):
        count = check_int_at_least("grid", grid, 2, "at least 2 thresholds")
        return np.round(np.linspace(1.0, 0.0, count), 12)
    values = np.asarray(grid, dtype=np.float64)
    if (
        values.ndim != 1
        or values.size == 0
        or np.any((values < 0.0) | (values > 1.0))
        or np.any(np.isnan(values))
    ):
        raise ValueError("`grid` must be an integer >= 2 or a non-empty list of thresholds in [0, 1]")
    return np.sort(np.unique(values))[::-1]
