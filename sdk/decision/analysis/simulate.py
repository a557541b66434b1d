"""Replay a policy on labelled data: what it would have done, and what that would have bought.

Pure functions on arrays. Each query's action is taken exactly as
:meth:`~capgate.policies.Policy.decide` would take it; the outcome is read off the labels:

* ``answer``: one response is drawn, correct with probability µ̂ (the query's accuracy).
* ``abstain`` / ``clarify`` / ``escalate``: nothing is answered or drawn.
* ``resample``: answered after drawing ``budget`` responses: the smallest k whose predicted
  pass@k, 1 - (1 - p)^k, reaches ``target_pass_at_k`` (a verifier picks a correct response if
  any), else ``max_samples``. With a verifier the accuracy is the query's pass@k, unbiased from its
  n graded responses when k <= n, else the plug-in 1 - (1 - µ̂)^k. Without one the answer is a
  vote: given the query's graded samples (``pools``, e.g. a harvest's), CAS is **replayed** over
  the pool in ``orders`` seeded random orders with the decision's own sampling plan, and the query
  is credited with the share of orders whose winner is correct, the samples spent and the rule
  that stopped each run (``stopped_by``; a pool shorter than the budget ends a run early:
  ``pool of N``). A query without a pool is credited with µ̂ and ``max_samples`` samples, and
  counted in ``resample_from_mu``.
* ``route``: another model answers; the labels are this model's, so it counts in the ``route``
  rate only.

Coverage is the fraction of queries answered (``answer`` or ``resample``); accuracy is the mean
accuracy over those.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from numpy.typing import ArrayLike, NDArray

from capgate._util.jsonl import json_ready
from capgate._util.validate import check_int_at_least, check_positive_int
from capgate.core.types import Action, Sample, SamplingPlan
from capgate.decision.analysis.risk import check_p_mu

if TYPE_CHECKING:
    from capgate.policies import Policy

PoolLike = Sequence[Sample] | None
"""A query's graded samples (``LabelledQuery.samples``), or ``None`` when it has none."""

__all__ = [
    "ACTIONS",
    "PoolLike",
    "ReplaySummary",
    "pool_items",
    "replay_policy",
    "replay_vote",
    "threshold_frontier",
]

ACTIONS: tuple[Action, ...] = ("answer", "abstain", "clarify", "escalate", "resample", "route")


@dataclass(frozen=True)
class ReplaySummary:
    """What a policy would have done on a labelled set.

    Attributes:
        threshold: The answer threshold this replay swept to, or ``None`` for the policy as written.
        n: Queries replayed.
        n_degraded: Queries whose estimate was missing or degraded (sent to ``on_degraded``).
        rates: Fraction of queries per action.
        coverage: Fraction of queries answered (answer or resample).
        accuracy: Mean accuracy of the answered queries (NaN when none is answered).
        samples: Responses drawn in all (answer: 1, resample: the replayed mean, or its budget).
        samples_per_query: ``samples / n``.
        resample_replayed: Resampled queries whose vote was replayed on their pools.
        resample_from_mu: Resampled queries without a pool (credited with µ̂; see the module doc).
        stopped_by: Share of the replayed runs each stop rule (or cap) ended.
    """

    threshold: float | None
    n: int
    n_degraded: int
    rates: dict[Action, float]
    coverage: float
    accuracy: float
    samples: float
    samples_per_query: float
    resample_replayed: int = 0
    resample_from_mu: int = 0
    stopped_by: dict[str, float] = field(default_factory=dict)

    @property
    def risk(self) -> float:
        """Error rate among answered queries, 1 - accuracy."""
        return 1.0 - self.accuracy

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (NaN becomes ``None``)."""
        return cast(dict[str, Any], json_ready(self))


def _arrays(
    p: ArrayLike, mu_hat: ArrayLike, n_samples: ArrayLike | None, degraded: ArrayLike | None
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.int64] | None, NDArray[np.bool_]]:
    conf = np.asarray(p, dtype=np.float64)
    mu = np.asarray(mu_hat, dtype=np.float64)
    if conf.ndim != 1 or conf.shape != mu.shape:
        raise ValueError(
            f"`p` and `mu_hat` must be 1-D of equal length; got shapes {conf.shape} and {mu.shape}"
        )
    if conf.size == 0:
        raise ValueError("nothing to replay: `p` is empty")
    usable = check_p_mu(conf, mu)
    ks: NDArray[np.int64] | None = None
    if n_samples is not None:
        ks = np.asarray(n_samples, dtype=np.int64)
        if ks.shape != conf.shape or np.any(ks < 1):
            raise ValueError("`n_samples` must be positive integers, one per query")
    flag = np.zeros(conf.shape, dtype=bool) if degraded is None else np.asarray(degraded, dtype=bool)
    if flag.shape != conf.shape:
        raise ValueError(f"`degraded` must have one flag per query; got shape {flag.shape}")
    return conf, mu, ks, flag | ~usable


def replay_policy(
    policy: Policy,
    p: ArrayLike,
    mu_hat: ArrayLike,
    *,
    n_samples: ArrayLike | None = None,
    degraded: ArrayLike | None = None,
    step: str | None = None,
    tool: str | None = None,
    threshold: float | None = None,
    pools: Sequence[PoolLike] | None = None,
    orders: int = 20,
    seed: int = 0,
) -> ReplaySummary:
    """Replay a policy on labelled queries.

    Args:
        policy: The policy.
        p: Predicted capability per query; NaN for an unavailable estimate.
        mu_hat: Empirical capability µ̂ = correct / k per query.
        n_samples: Graded responses k per query (for the unbiased pass@k of verified resampling).
        degraded: Per-query flag for estimates that carry a value but are degraded.
        step: Replay as if every query came from this agent step.
        tool: Replay as if every query gated this tool.
        threshold: Record this answer threshold in the result (set by :func:`threshold_frontier`).
        pools: Per query, its graded samples (or ``None``): unverified resamples replay their
            vote on them (see the module docstring).
        orders: Random orders each pool is replayed in.
        seed: Seed of the orders and of stochastic stop rules.

    Returns:
        Rates, coverage, accuracy among answered, samples spent, and how resamples were scored.

    Examples:
        >>> from capgate.policies import load_policy
        >>> r = replay_policy(load_policy("balanced"), [0.1, 0.5, 0.9, float("nan")], [0.0, 0.5, 1.0, 1.0])
        >>> r.rates["abstain"], r.coverage, r.accuracy
        (0.5, 0.25, 1.0)
    """
    from capgate.metrics import pass_at_k_predicted, pass_at_k_unbiased
    from capgate.policies import ResampleAction

    conf, mu, ks, is_degraded = _arrays(p, mu_hat, n_samples, degraded)
    if pools is not None and len(pools) != conf.size:
        raise ValueError(f"`pools` must have one entry per query ({conf.size}); got {len(pools)}")
    check_positive_int("orders", orders)
    rng = np.random.default_rng(seed)
    replayed = from_mu = 0
    stops: dict[str, int] = {}
    rule = policy.rule(step=step, tool=tool)
    uppers = np.asarray([upper for _, upper in rule.edges[:-1]], dtype=np.float64)
    band = np.searchsorted(uppers, np.nan_to_num(conf), side="right")
    answered = 0
    correct_mass = 0.0
    samples = 0.0
    counts: dict[Action, int] = dict.fromkeys(ACTIONS, 0)
    for i in range(conf.size):
        spec = rule.on_degraded if is_degraded[i] else rule.bands[int(band[i])]
        counts[spec.action] += 1
        if spec.action == "answer":
            answered += 1
            correct_mass += float(mu[i])
            samples += 1
        elif isinstance(spec, ResampleAction):
            p_i = None if math.isnan(conf[i]) else float(conf[i])
            k = spec.budget(p_i)
            answered += 1
            pool = pools[i] if pools is not None else None
            if spec.target_pass_at_k is None and pool:
                accuracy, spent = replay_vote(pool, spec.plan(p_i), orders=orders, rng=rng, stops=stops)
                replayed += 1
                correct_mass += accuracy
                samples += spent
                continue
            samples += k
            if spec.target_pass_at_k is None:
                from_mu += 1
                correct_mass += float(mu[i])
            elif ks is not None and k <= ks[i]:
                n_i = int(ks[i])
                correct_mass += float(pass_at_k_unbiased([n_i], [round(float(mu[i]) * n_i)], k)[0])
            else:
                correct_mass += float(pass_at_k_predicted([float(mu[i])], k)[0])
    n = int(conf.size)
    return ReplaySummary(
        threshold=threshold,
        n=n,
        n_degraded=int(is_degraded.sum()),
        rates={a: counts[a] / n for a in ACTIONS},
        coverage=answered / n,
        accuracy=correct_mass / answered if answered else math.nan,
        samples=samples,
        samples_per_query=samples / n,
        resample_replayed=replayed,
        resample_from_mu=from_mu,
        stopped_by={name: count / sum(stops.values()) for name, count in sorted(stops.items())},
    )


def pool_items(pool: Sequence[Sample]) -> list[tuple[str | None, bool, float | None, int]]:
    """A pool of graded samples as :func:`capgate.cas.replay` items (answer, correct, confidence,
    tokens). The confidence is :func:`capgate.cas.loop.sample_confidence`, as :func:`~capgate.cas.replay`
    takes it from a sample."""
    from capgate.cas.loop import sample_confidence

    return [(s.answer, s.correct, sample_confidence(s), s.n_tokens or 0) for s in pool]


def replay_vote(
    pool: Sequence[Sample],
    plan: SamplingPlan,
    *,
    orders: int,
    rng: np.random.Generator,
    stops: dict[str, int] | None = None,
) -> tuple[float, float]:
    """Replay a resample plan's CAS vote on ``pool`` in ``orders`` random orders: the share of
    orders whose winner is correct (no winner: wrong) and the mean samples spent; ``stops`` (if
    given) counts the rule that ended each run."""
    from capgate.cas import replay, stop_rule

    items = pool_items(pool)
    rule = stop_rule(plan.stop)
    correct = spent = 0
    for _ in range(orders):
        order = rng.permutation(len(items))
        result = replay(
            [items[j] for j in order],
            stop=rule,
            batch_size=plan.batch_size,
            max_samples=plan.max_samples,
            seed=rng,
        )
        correct += bool(result.correct)
        spent += result.samples_used
        if stops is not None:
            stops[result.stopped_by] = stops.get(result.stopped_by, 0) + 1
    return correct / orders, spent / orders


def threshold_frontier(
    policy: Policy,
    p: ArrayLike,
    mu_hat: ArrayLike,
    *,
    thresholds: Sequence[float] | int = 11,
    n_samples: ArrayLike | None = None,
    degraded: ArrayLike | None = None,
    step: str | None = None,
    tool: str | None = None,
    pools: Sequence[PoolLike] | None = None,
    orders: int = 20,
    seed: int = 0,
) -> list[ReplaySummary]:
    """Replay the policy with its answer band moved to each threshold t (answer when p >= t, lower
    bands clipped at t: :meth:`~capgate.policies.Policy.with_answer_threshold`): the
    coverage/accuracy frontier.

    Args:
        policy: The policy; the top band of the rule replayed must answer.
        p: Predicted capability per query (NaN: unavailable).
        mu_hat: Empirical capability per query.
        thresholds: The thresholds, or how many evenly spaced ones in [0, 1].
        n_samples: Graded responses per query (see :func:`replay_policy`).
        degraded: Per-query degraded flags.
        step: Agent step to replay as.
        tool: Gated tool to replay as.
        pools: Per-query graded samples for replaying resample votes (see :func:`replay_policy`).
        orders: Random orders per pool.
        seed: Seed of the orders (each threshold replays the same orders).

    Returns:
        One replay per threshold, in the order given (ascending for a count).

    Examples:
        >>> from capgate.policies import load_policy
        >>> rows = threshold_frontier(load_policy("balanced"), [0.2, 0.7, 0.9], [0.0, 1.0, 1.0], thresholds=3)
        >>> [(r.threshold, round(r.coverage, 2)) for r in rows]
        [(0.0, 1.0), (0.5, 0.67), (1.0, 0.0)]
    """
    if isinstance(thresholds, bool):
        raise ValueError(f"`thresholds` must be a count or a list of thresholds; got {thresholds!r}")
    if isinstance(thresholds, int | np.integer):
        count = check_int_at_least("thresholds", thresholds, 2, "at least 2 when given as a count")
        values = [round(float(t), 12) for t in np.linspace(0.0, 1.0, count)]
    else:
        values = [float(t) for t in thresholds]
    return [
        replay_policy(
            policy.with_answer_threshold(t, step=step, tool=tool)[0],
            p,
            mu_hat,
            n_samples=n_samples,
            degraded=degraded,
            step=step,
            tool=tool,
            threshold=t,
            pools=pools,
            orders=orders,
            seed=seed,
        )
        for t in values
    ]
