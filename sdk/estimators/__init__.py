"""Capability estimators: predict µ(x) for a query before or while the model answers."""

from capgate.estimators.base import CapabilityEstimator, Query, query_text

__all__ = ["CapabilityEstimator", "Query", "query_text"]
