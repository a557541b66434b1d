"""Graders: decide whether a sampled response answers a query correctly."""
