"""Capability estimators: predict µ(x) for a query before or while the model answers.

White-box: :class:`ProbeEstimator` (a :class:`LinearProbe` on a local model's hidden states);
:class:`ProbeSearch` fits a stronger :class:`LinearProbe` (layers, solver and regularization chosen
by inner cross-validation) and :func:`nested_cross_val_predict` scores such a recipe honestly;
:class:`NuisanceProjection` makes a probe blind to edits (claims of easiness) that should not move it.
Black-box estimators that query the model through a backend: :class:`VerbalizedConfidence`,
:class:`PTrue` and :class:`Consistency`. Baselines: :class:`UniformRandom`, :class:`ConstantPrior`.
:class:`Recalibrated` wraps any estimator with an isotonic or Platt calibrator fitted on held-out
outcomes; :class:`FallbackChain` composes estimators so the first usable estimate wins.
:func:`estimate_jsonl` runs any estimator over a labelled JSONL file.
"""

from capgate.estimators._invariance import NuisanceProjection
from capgate.estimators._nested import NestedCV, nested_cross_val_predict
from capgate.estimators._parsing import normalize_answer, parse_probability
from capgate.estimators._probe_search import ProbeSearch
from capgate.estimators._target import ProbeTarget, check_target_match
from capgate.estimators.base import CapabilityEstimator, query_text
from capgate.estimators.baselines import ConstantPrior, UniformRandom
from capgate.estimators.consistency import Consistency
from capgate.estimators.fallback import FallbackChain
from capgate.estimators.jsonl import estimate_jsonl
from capgate.estimators.probe import Featurizer, LinearProbe, ProbeEstimator
from capgate.estimators.ptrue import PTrue, read_p_true
from capgate.estimators.recalibration import IsotonicCalibrator, PlattCalibrator, Recalibrated
from capgate.estimators.verbalized import VerbalizedConfidence

__all__ = [
    "CapabilityEstimator",
    "Consistency",
    "ConstantPrior",
    "FallbackChain",
    "Featurizer",
    "IsotonicCalibrator",
    "LinearProbe",
    "NestedCV",
    "NuisanceProjection",
    "PTrue",
    "PlattCalibrator",
    "ProbeEstimator",
    "ProbeSearch",
    "ProbeTarget",
    "Recalibrated",
    "UniformRandom",
    "VerbalizedConfidence",
    "check_target_match",
    "estimate_jsonl",
    "nested_cross_val_predict",
    "normalize_answer",
    "parse_probability",
    "query_text",
    "read_p_true",
]
