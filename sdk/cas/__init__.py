"""Confidence-based adaptive sampling (CAS) and composable stop rules."""
