"""Confidence-based adaptive sampling (CAS) and composable stop rules.

Examples:
    >>> from capgate.cas import beta_consensus, cas_confidence_gap, replay, stop_after_samples
    >>> rule = (cas_confidence_gap() | beta_consensus()) | stop_after_samples(16)
    >>> replay([("4", True, 0.9, 50), ("4", True, 0.95, 40)], stop=rule, batch_size=1).answer
    '4'
"""

from capgate.cas._state import UNKNOWN_CONFIDENCE_WEIGHT, SamplingState
from capgate.cas.batch import BatchAllocator, BatchResult, batch_adaptive_sample
from capgate.cas.budget import StartingBudget, samples_for_target
from capgate.cas.confidence import (
    CONFIDENCE_INSTRUCTION,
    DEFAULT_CONFIDENCE,
    ConfidenceSource,
    LogprobConfidence,
    deepconf_score,
    first_available,
    ignoring_tags,
    parse_verbalized_confidence,
    plants_confidence,
    strip_confidence_tag,
    verbalized_confidence,
    with_confidence_instruction,
)
from capgate.cas.loop import (
    DEFAULT_STOP,
    CASResult,
    DrawnSample,
    PoolItem,
    StopReason,
    aadaptive_sample,
    adaptive_sample,
    replay,
)
from capgate.cas.settings import stop_rule
from capgate.cas.stop import (
    StopFn,
    StopRule,
    beta_consensus,
    beta_futility,
    beta_prob_above_half,
    cas_confidence_gap,
    cas_frequency_gap,
    fired_rule,
    stop_after_delay,
    stop_after_samples,
    stop_after_tokens,
    stop_all,
    stop_any,
    stop_if,
    stop_never,
)
from capgate.core.plans import DEFAULT_EPSILON
from capgate.core.types import CASMode

__all__ = [
    "CONFIDENCE_INSTRUCTION",
    "DEFAULT_CONFIDENCE",
    "DEFAULT_EPSILON",
    "DEFAULT_STOP",
    "UNKNOWN_CONFIDENCE_WEIGHT",
    "BatchAllocator",
    "BatchResult",
    "CASMode",
    "CASResult",
    "ConfidenceSource",
    "DrawnSample",
    "LogprobConfidence",
    "PoolItem",
    "SamplingState",
    "StartingBudget",
    "StopFn",
    "StopReason",
    "StopRule",
    "aadaptive_sample",
    "adaptive_sample",
    "batch_adaptive_sample",
    "beta_consensus",
    "beta_futility",
    "beta_prob_above_half",
    "cas_confidence_gap",
    "cas_frequency_gap",
    "deepconf_score",
    "fired_rule",
    "first_available",
    "ignoring_tags",
    "parse_verbalized_confidence",
    "plants_confidence",
    "replay",
    "samples_for_target",
    "stop_after_delay",
    "stop_after_samples",
    "stop_after_tokens",
    "stop_all",
    "stop_any",
    "stop_if",
    "stop_never",
    "stop_rule",
    "strip_confidence_tag",
    "verbalized_confidence",
    "with_confidence_instruction",
]
