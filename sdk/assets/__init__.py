"""Data files shipped with capgate (the default model's labels and probe, its C3RL adapter, recorded
data of a 20B model)."""

from pathlib import Path

__all__ = ["C3RL_SMOLLM2_ADAPTER", "MATH500_GPT_OSS_20B"]

C3RL_SMOLLM2_ADAPTER = Path(__file__).resolve().parent / "c3rl_smollm2"
"""A LoRA adapter (PEFT's format, float16) that ``capgate train c3rl`` trained on the embedded
SmolLM2-135M-Instruct, so that it ends its answers with ``[confidence=X%]`` and means it
(``bench/c3rl.py``; its README and bench/RESULTS.md say what it learnt and what it did not).
``prepare_model("default-c3rl")`` merges it in (:func:`capgate.local.lora.merge_lora`);
``capgate.load_estimator("default-c3rl", method="verbalized")`` reads its tag."""

MATH500_GPT_OSS_20B = Path(__file__).resolve().parent / "math500_gpt-oss-20b_probe-math.jsonl"
"""gpt-oss-20b on MATH-500: per question, the Probe-MATH confidence and the correct count out of
100 sampled answers (µ̂), from appier-research/llm-calibration (MIT), the code release of arXiv
2602.13540; see ``math500_gpt-oss-20b_probe-math.README.md`` beside it. The demo's replay reads
it, and the docs' examples calibrate and simulate policies on it."""
