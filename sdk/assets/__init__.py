"""Data files shipped with capgate (the default model's labels and probe)."""

from pathlib import Path

__all__ = ["MATH500_GPT_OSS_20B"]

MATH500_GPT_OSS_20B = Path(__file__).resolve().parent / "math500_gpt-oss-20b_probe-math.jsonl"
"""gpt-oss-20b on MATH-500: per question, the Probe-MATH confidence and the correct count out of
100 sampled answers (µ̂), from appier-research/llm-calibration (MIT), the code release of arXiv
2602.13540; see ``math500_gpt-oss-20b_probe-math.README.md`` beside it. The demo's replay reads
it, and the docs' examples calibrate and simulate policies on it."""
