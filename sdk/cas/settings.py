"""Stop rules from declarative settings: :class:`~capgate.StopSettings` (a policy's ``stop:`` block,
carried by every resample :class:`~capgate.Decision`) turned into a composed stop rule.

The early-stop rules (confidence gap, consensus, futility) wait for ``min_samples``; the caps
(``max_tokens``, ``max_seconds``) do not: a budget holds whatever the vote says.
"""

from __future__ import annotations

from capgate.cas.stop import (
    StopRule,
    beta_consensus,
    beta_futility,
    cas_confidence_gap,
    cas_frequency_gap,
    stop_after_delay,
    stop_after_samples,
    stop_after_tokens,
    stop_all,
    stop_any,
    stop_never,
)
from capgate.core.types import PaperConfidenceGap, StopSettings

__all__ = ["stop_rule"]


def stop_rule(settings: StopSettings) -> StopRule:
    """The composed stop rule for :func:`capgate.cas.adaptive_sample` (``stop=...``).

    Examples:
        >>> stop_rule(StopSettings(consensus=0.9, confidence_gap=None, min_samples=3))
        stop_all(stop_after_samples(3), stop_any(beta_consensus(threshold=0.9)))
        >>> stop_rule(StopSettings(confidence_gap=None, max_tokens=4000))
        stop_any(beta_consensus(threshold=0.95), stop_after_tokens(4000))
    """
    rules: list[StopRule] = []
    gap = settings.confidence_gap
    if isinstance(gap, PaperConfidenceGap):
        rules.append(cas_frequency_gap(gap.epsilon))
    elif gap is not None:
        rules.append(cas_confidence_gap(**gap.model_dump(exclude={"rule"})))
    if settings.consensus is not None:
        rules.append(beta_consensus(settings.consensus))
    if settings.futility is not None:
        rules.append(beta_futility(settings.futility))
    combined: StopRule = stop_any(*rules) if rules else stop_never()
    if settings.min_samples > 1:
        combined = stop_all(stop_after_samples(settings.min_samples), combined)
    caps: list[StopRule] = []
    if settings.max_tokens is not None:
        caps.append(stop_after_tokens(settings.max_tokens))
    if settings.max_seconds is not None:
        caps.append(stop_after_delay(settings.max_seconds))
    return stop_any(combined, *caps) if caps else combined
