"""Metrics of capability calibration: vectorized numpy functions with keyword-only options."""
