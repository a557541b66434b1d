"""Capability estimators: predict µ(x) for a query before or while the model answers."""

from capgate.estimators.base import CapabilityEstimator, Query, query_text
from capgate.estimators.baselines import ConstantPrior, UniformRandom
from capgate.estimators.probe import Featurizer, LinearProbe, ProbeEstimator
from capgate.estimators.recalibration import IsotonicCalibrator, PlattCalibrator, Recalibrated

__all__ = [
    "CapabilityEstimator",
    "ConstantPrior",
    "Featurizer",
    "IsotonicCalibrator",
    "LinearProbe",
    "PlattCalibrator",
    "ProbeEstimator",
    "Query",
    "Recalibrated",
    "UniformRandom",
    "query_text",
]
