"""Metrics of capability calibration: vectorized numpy functions with keyword-only options.

Capability metrics compare a predicted capability p with the empirical µ̂ = correct / k;
response-level metrics (AUROC, AUPRC, response Brier) count every sampled response.
"""

from capgate.metrics.allocation import greedy_allocation, uniform_allocation
from capgate.metrics.calibration import (
    BinStrategy,
    BrierDecomposition,
    ReliabilityDiagram,
    brier_decomposition,
    capability_brier,
    expected_calibration_error,
    mean_absolute_error,
    reliability_diagram,
    response_brier,
    root_mean_squared_error,
)
from capgate.metrics.passk import (
    PassAtKInterval,
    dataset_pass_at_k,
    expected_success,
    pass_at_k_mse,
    pass_at_k_predicted,
    pass_at_k_unbiased,
)
from capgate.metrics.ranking import auprc, auroc, pearson, rankdata, spearman

__all__ = [
    "BinStrategy",
    "BrierDecomposition",
    "PassAtKInterval",
    "ReliabilityDiagram",
    "auprc",
    "auroc",
    "brier_decomposition",
    "capability_brier",
    "dataset_pass_at_k",
    "expected_calibration_error",
    "expected_success",
    "greedy_allocation",
    "mean_absolute_error",
    "pass_at_k_mse",
    "pass_at_k_predicted",
    "pass_at_k_unbiased",
    "pearson",
    "rankdata",
    "reliability_diagram",
    "response_brier",
    "root_mean_squared_error",
    "spearman",
    "uniform_allocation",
]
