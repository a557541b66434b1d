"""Capability estimators: predict µ(x) for a query before or while the model answers.

Black-box estimators that query the model through a backend: :class:`VerbalizedConfidence`,
:class:`PTrue` and :class:`Consistency`; :class:`FallbackChain` composes estimators so the first
usable estimate wins. :func:`estimate_jsonl` runs any estimator over a labelled JSONL file.
"""

from capgate.estimators._parsing import normalize_answer, parse_probability
from capgate.estimators.base import CapabilityEstimator, Query, query_text
from capgate.estimators.consistency import Consistency
from capgate.estimators.fallback import FallbackChain
from capgate.estimators.jsonl import estimate_jsonl, read_labelled_jsonl
from capgate.estimators.ptrue import PTrue, read_p_true
from capgate.estimators.verbalized import VerbalizedConfidence

__all__ = [
    "CapabilityEstimator",
    "Consistency",
    "FallbackChain",
    "PTrue",
    "Query",
    "VerbalizedConfidence",
    "estimate_jsonl",
    "normalize_answer",
    "parse_probability",
    "query_text",
    "read_labelled_jsonl",
    "read_p_true",
]
