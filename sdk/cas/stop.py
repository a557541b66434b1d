"""Composable stop rules for adaptive sampling (tenacity's ``stop.py`` idiom).

A stop rule is a small callable object whose class name reads as a phrase; ``__init__`` stores its
settings and ``__call__(state) -> bool`` decides from one frozen
:class:`~capgate.cas.SamplingState`. ``a | b`` stops when either rule does, ``a & b`` when both
do; the result is a rule itself. A plain function ``state -> bool`` is accepted anywhere a rule is.

Examples:
    >>> import numpy as np
    >>> from capgate.cas import SamplingState, beta_consensus, stop_after_samples
    >>> rule = beta_consensus(0.95) | stop_after_samples(40)
    >>> rule
    stop_any(beta_consensus(threshold=0.95), stop_after_samples(40))
    >>> rule(SamplingState.build(votes={"42": 4}))
    True
    >>> rule(SamplingState.build(votes={"42": 2, "41": 1}))
    False
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar, TypeAlias

from capgate._util.validate import (
    check_number_in,
    check_positive_int,
    check_positive_number,
    settings_of,
)
from capgate.cas._state import SamplingState
from capgate.core.plans import ConfidenceGap, PaperConfidenceGap
from capgate.core.types import CASMode

_GAP = ConfidenceGap.model_fields

StopFn: TypeAlias = Callable[[SamplingState], bool]
"""Anything that decides from a state: a :class:`StopRule` or a plain function."""


class StopRule(ABC):
    """Base class of stop rules: ``__call__`` decides; ``|`` and ``&`` compose."""

    @abstractmethod
    def __call__(self, state: SamplingState) -> bool:
        """True to stop sampling now."""

    def fired(self, state: SamplingState) -> StopFn | None:
        """The rule that stops sampling now (``self``, or for a composite the part that fired),
        or ``None`` to go on. Asks every rule at most once, in the order ``__call__`` would."""
        return self if self(state) else None

    def __or__(self, other: StopFn) -> stop_any:
        return stop_any(self, other)

    def __ror__(self, other: StopFn) -> stop_any:
        return stop_any(other, self)

    def __and__(self, other: StopFn) -> stop_all:
        return stop_all(self, other)

    def __rand__(self, other: StopFn) -> stop_all:
        return stop_all(other, self)


def fired_rule(rule: StopFn, state: SamplingState) -> StopFn | None:
    """The rule within ``rule`` that stops sampling in ``state``, or ``None`` to go on.

    For ``a | b`` it is whichever of ``a`` and ``b`` fired first; for ``a & b`` the last part (the
    one that completed the conjunction); for a plain function, the function itself.

    Examples:
        >>> from capgate.cas import SamplingState, beta_consensus, stop_after_samples
        >>> fired_rule(stop_after_samples(10) | beta_consensus(), SamplingState.build(votes={"4": 4}))
        beta_consensus(threshold=0.95)
    """
    if isinstance(rule, StopRule):
        return rule.fired(state)
    return rule if rule(state) else None


def rule_name(rule: StopFn) -> str:
    """How a rule is shown in reprs and results: its repr, or a plain function's name."""
    return repr(rule) if isinstance(rule, StopRule) else getattr(rule, "__name__", repr(rule))


def _check_callable(rules: tuple[StopFn, ...], who: str) -> None:
    for rule in rules:
        if not callable(rule):
            raise TypeError(f"{who} takes stop rules or functions state -> bool; got {rule!r}")


class _Composite(StopRule):
    """``stop_any`` / ``stop_all`` (``_kind``): a nested composite of the same kind is flattened."""

    _kind: ClassVar[str]

    def __init__(self, *rules: StopFn) -> None:
        _check_callable(rules, self._kind)
        flat: list[StopFn] = []
        for rule in rules:
            flat.extend(rule.rules if isinstance(rule, _Composite) and rule._kind == self._kind else (rule,))
        self.rules: tuple[StopFn, ...] = tuple(flat)

    def __call__(self, state: SamplingState) -> bool:
        return self.fired(state) is not None

    def __repr__(self) -> str:
        return f"{self._kind}({', '.join(rule_name(r) for r in self.rules)})"


class stop_any(_Composite):  # noqa: N801 - tenacity-style phrase name
    """Stop when any of the rules says stop (``a | b``)."""

    _kind = "stop_any"

    def fired(self, state: SamplingState) -> StopFn | None:
        for rule in self.rules:
            which = fired_rule(rule, state)
            if which is not None:
                return which
        return None


class stop_all(_Composite):  # noqa: N801
    """Stop only when every rule says stop (``a & b``)."""

    _kind = "stop_all"

    def fired(self, state: SamplingState) -> StopFn | None:
        which: StopFn | None = None
        for rule in self.rules:
            which = fired_rule(rule, state)
            if which is None:
                return None
        return which


class stop_if(StopRule):  # noqa: N801
    """Wrap a plain function ``state -> bool`` as a rule (only needed to get ``|``/``&`` on it)."""

    def __init__(self, predicate: StopFn) -> None:
        _check_callable((predicate,), "stop_if")
        self.predicate = predicate

    def __call__(self, state: SamplingState) -> bool:
        return bool(self.predicate(state))

    def __repr__(self) -> str:
        return f"stop_if({rule_name(self.predicate)})"


class stop_never(StopRule):  # noqa: N801
    """Never stop: sampling runs to the loop's ``max_samples`` cap."""

    def __call__(self, state: SamplingState) -> bool:
        return False

    def __repr__(self) -> str:
        return "stop_never()"


class stop_after_samples(StopRule):  # noqa: N801
    """Stop once ``n`` responses have been drawn."""

    def __init__(self, n: int) -> None:
        self.n = check_positive_int("n", n)

    def __call__(self, state: SamplingState) -> bool:
        return state.n_samples >= self.n

    def __repr__(self) -> str:
        return f"stop_after_samples({self.n})"


class stop_after_tokens(StopRule):  # noqa: N801
    """Stop once ``n`` tokens have been generated in total."""

    def __init__(self, n: int) -> None:
        self.n = check_positive_int("n", n)

    def __call__(self, state: SamplingState) -> bool:
        return state.tokens >= self.n

    def __repr__(self) -> str:
        return f"stop_after_tokens({self.n})"


class stop_after_delay(StopRule):  # noqa: N801
    """Stop once ``seconds`` of wall-clock time have passed since sampling started."""

    def __init__(self, seconds: float) -> None:
        self.seconds = check_positive_number("seconds", seconds)

    def __call__(self, state: SamplingState) -> bool:
        return state.elapsed_s >= self.seconds

    def __repr__(self) -> str:
        return f"stop_after_delay({self.seconds:g})"


def beta_prob_above_half(a: int, b: int) -> float:
    """P(X > 1/2) for X ~ Beta(a, b) with positive integer ``a``, ``b``, computed exactly.

    By I_x(a, b) = P(Binomial(a+b-1, x) >= a): P(X > 1/2) = sum_{j<a} C(n, j) / 2^n, n = a+b-1,
    in exact integers divided once (Python rounds the big-integer quotient correctly).

    Examples:
        >>> beta_prob_above_half(1, 1), beta_prob_above_half(5, 1)
        (0.5, 0.96875)
    """
    check_positive_int("a", a)
    check_positive_int("b", b)
    n = a + b - 1
    return sum(math.comb(n, j) for j in range(a)) / (1 << n)


class beta_consensus(StopRule):  # noqa: N801
    """Adaptive-Consistency's Beta rule: stop when P(X > 1/2) >= ``threshold``, X ~ Beta(v1+1, v2+1).

    ``v1``, ``v2``: the votes of the two most-voted answers (``v2 = 0`` while there is one). X is
    the leader's posterior share of the two under a uniform prior: once it is above one half with
    high probability, more samples are unlikely to overturn the vote. With the default 0.95, four
    unanimous votes suffice (P = 0.96875), three do not (0.9375).
    """

    def __init__(self, threshold: float = 0.95) -> None:
        self.threshold = check_number_in("threshold", threshold, 0.5, 1.0, open_ends=True)

    def posterior(self, state: SamplingState) -> float | None:
        """P(X > 1/2) for the current votes, or ``None`` before any answer was extracted."""
        v1, v2 = state.top_two_counts()
        if v1 == 0:
            return None
        return beta_prob_above_half(v1 + 1, v2 + 1)

    def __call__(self, state: SamplingState) -> bool:
        p = self.posterior(state)
        return p is not None and p >= self.threshold

    def __repr__(self) -> str:
        return f"beta_consensus(threshold={self.threshold:g})"


class beta_futility(StopRule):  # noqa: N801
    """Give up when no answer is likely to win a majority: P(S > 1/2) < ``threshold``.

    S ~ Beta(v1 + 1, n − v1 + 1) is the leader's posterior share of *all* n responses so far
    (unanswered ones included), under a uniform prior. When even the leader is unlikely to hold a
    majority, more samples rarely change the outcome: the loop stops with the current (plurality)
    winner. The mirror image of :class:`beta_consensus` (0.05 mirrors its 0.95); with every
    response different it fires after 7 samples (P = 0.035).

    Examples:
        >>> from capgate.cas import SamplingState
        >>> beta_futility()(SamplingState.build(votes={answer: 1 for answer in "abcdefg"}))
        True
        >>> beta_futility()(SamplingState.build(votes={"a": 4, "b": 3}))
        False
    """

    def __init__(self, threshold: float = 0.05) -> None:
        self.threshold = check_number_in("threshold", threshold, 0.0, 0.5, open_ends=True)

    def posterior(self, state: SamplingState) -> float | None:
        """P(S > 1/2) for the leader's share of all responses, or ``None`` before any response."""
        if state.n_samples == 0:
            return None
        leader = max(state.votes.values(), default=0)
        return beta_prob_above_half(leader + 1, state.n_samples - leader + 1)

    def __call__(self, state: SamplingState) -> bool:
        p = self.posterior(state)
        return p is not None and p < self.threshold

    def __repr__(self) -> str:
        return f"beta_futility(threshold={self.threshold:g})"


def _leader_gap(state: SamplingState, ranked: list[str]) -> float | None:
    """c1 − c2 of the first two of ``ranked`` (c2 = 0 for a lone answer); ``None``: none, or unknown."""
    if not ranked:
        return None
    c1 = state.mean_confidence(ranked[0])
    if c1 is None:
        return None
    if len(ranked) == 1:
        return c1
    c2 = state.mean_confidence(ranked[1])
    return None if c2 is None else c1 - c2


class cas_confidence_gap(StopRule):  # noqa: N801
    """The CAS stop rule: P_stop = σ(scale · (c1 − c2 − margin)).

    ``c1``, ``c2``: the mean per-response confidences of the two leading answers by
    **confidence-weighted vote** (an unknown confidence weighing
    :data:`~capgate.cas.UNKNOWN_CONFIDENCE_WEIGHT`), so ``c1`` is the answer the loop returns;
    ``c2 = 0`` while there is one distinct answer. ``mode="threshold"`` stops when P_stop >=
    ``level`` (c1 − c2 >= margin + logit(level)/scale); ``mode="stochastic"`` stops with
    probability P_stop, drawn from the state's seeded generator. It never stops on confidence it
    does not have (the leader's, or the runner-up's, all unknown: False), so pair it with a count
    rule such as :class:`beta_consensus` or a cap.

    Source: CAS, "Confidence-based Adaptive Test Time Scaling" (arXiv 2607.01612, "Scaling with
    Confidence", with C3RL verbalized confidence), whose own rule is :class:`cas_frequency_gap`;
    this variant ranks by weighted vote, scales the gap and stops deterministically by default.
    Defaults: ``margin=0.5`` stops a lone answer exactly when its mean confidence exceeds one half
    (more likely right than wrong), two rivals only when the leader is more confident by half the
    unit interval; ``scale=10`` makes each 0.1 of gap one unit of log-odds (σ(±3) ≈ 0.95/0.05 at
    margin ± 0.3); ``level=0.5`` makes threshold mode read "gap >= margin".

    Examples:
        >>> import numpy as np
        >>> from capgate.cas import SamplingState
        >>> rule = cas_confidence_gap()
        >>> rule(SamplingState.build(votes={"7": 1}, confidences={"7": (0.9,)}))
        True
        >>> rule(SamplingState.build(votes={"7": 2, "8": 1}, confidences={"7": (0.8, 0.7), "8": (0.6,)}))
        False
    """

    def __init__(
        self,
        *,
        scale: float = _GAP["scale"].default,
        margin: float = _GAP["margin"].default,
        mode: CASMode = _GAP["mode"].default,
        level: float = _GAP["level"].default,
    ) -> None:
        settings = settings_of(ConfidenceGap, scale=scale, margin=margin, mode=mode, level=level)
        self.scale = settings.scale
        self.margin = settings.margin
        self.mode: CASMode = settings.mode
        self.level = settings.level

    def gap(self, state: SamplingState) -> float | None:
        """c1 − c2 for the current state, or ``None`` when a needed confidence is unknown."""
        return _leader_gap(state, state.ranked())

    def stop_probability(self, state: SamplingState) -> float | None:
        """P_stop = σ(scale · (c1 − c2 − margin)), or ``None`` when the gap is unknown."""
        gap = self.gap(state)
        if gap is None:
            return None
        return _sigmoid(self.scale * (gap - self.margin))

    def __call__(self, state: SamplingState) -> bool:
        p = self.stop_probability(state)
        if p is None:
            return False
        if self.mode == "threshold":
            return p >= self.level
        return bool(state.rng.random() < p)

    def __repr__(self) -> str:
        settings = f"scale={self.scale:g}, margin={self.margin:g}, mode={self.mode!r}"
        if self.mode == "threshold":
            settings += f", level={self.level:g}"
        return f"cas_confidence_gap({settings})"


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


class cas_frequency_gap(StopRule):  # noqa: N801
    """CAS's stop rule as the paper states it: stop with probability σ(c1 − c2 − ε).

    ``c1``, ``c2``: the mean per-response confidences of the two most **frequent** answers (ties:
    higher mean confidence, then the text; ``c2 = 0`` while there is one answer); the draw uses the
    state's seeded generator, so a seeded loop reproduces its stops. The final answer is the loop's
    confidence-weighted vote, as in the paper. Unlike :class:`cas_confidence_gap` (capgate's
    variant) it ranks by raw frequency, has no ``scale`` and is always stochastic; since
    c1 − c2 <= 1, a batch stops with probability at most σ(1 − ε), so ε sets how eager it is. It
    never stops on confidence it does not have (``c1`` or, with a runner-up, ``c2`` unknown).

    Examples:
        >>> from capgate.cas import SamplingState
        >>> state = SamplingState.build(votes={"A": 3, "B": 1},
        ...                             confidences={"A": (0.3, 0.3, 0.3), "B": (0.95,)})
        >>> round(cas_frequency_gap(epsilon=0.1).stop_probability(state), 4)  # σ(0.3 − 0.95 − 0.1)
        0.3208
    """

    def __init__(self, epsilon: float = PaperConfidenceGap.model_fields["epsilon"].default) -> None:
        self.epsilon = settings_of(PaperConfidenceGap, epsilon=epsilon).epsilon

    def leaders(self, state: SamplingState) -> list[str]:
        """Answers by frequency, then mean known confidence, then text."""
        return sorted(
            state.votes,
            key=lambda a: (-state.votes[a], -(state.mean_confidence(a) or 0.0), a),
        )

    def gap(self, state: SamplingState) -> float | None:
        """c1 − c2, or ``None`` when a needed confidence is unknown (or no answer yet)."""
        return _leader_gap(state, self.leaders(state))

    def stop_probability(self, state: SamplingState) -> float | None:
        """P_stop = σ(c1 − c2 − ε), or ``None`` when the gap is unknown."""
        gap = self.gap(state)
        return None if gap is None else _sigmoid(gap - self.epsilon)

    def __call__(self, state: SamplingState) -> bool:
        p = self.stop_probability(state)
        return p is not None and bool(state.rng.random() < p)

    def __repr__(self) -> str:
        return f"cas_frequency_gap(epsilon={self.epsilon:g})"
