"""Probe-based capability estimation (placeholder, filled below)."""

from capgate.estimators._linear_probe import LR_GRID, LinearProbe

__all__ = ["LR_GRID", "LinearProbe"]
