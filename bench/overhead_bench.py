"""Overhead of gating: wall time of a gated LLM call over the same call ungated.

Measures, side by side in one run, on real questions (the held-out prompts shipped with the
default model's labels):

* local path: ``ask(prompt)`` = one greedy answer (max 24 tokens) from the embedded
  SmolLM2-135M-Instruct through ``TransformersBackend``; gated = ``capgate.guard`` with the
  shipped probe (one extra prefill to read the hidden states) and an always-answer policy, so
  the ratio is the estimate + decision cost alone. The probe does not yet share the prefill
  with generation (it runs its own forward pass), so this is the unshared cost.
* remote path (``--server URL``): the same ``ask`` through ``OpenAIBackend`` against an
  OpenAI-compatible server (the CI's vLLM CPU server), gated by the verbalized estimator (one
  extra completion per call, up to 3 on unparsable replies).

Calls alternate gated / ungated per question to share machine noise; the table prints median
seconds per call and the ratio of medians. Run: ``python bench/overhead_bench.py [--server URL
--served-model NAME] [--questions N]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from capgate import guard
from capgate.backend import Backend, SamplingParams
from capgate.demo import demo_questions
from capgate.estimators.base import CapabilityEstimator
from capgate.policies import Policy

ALWAYS_ANSWER = Policy.from_yaml_text(
    "version: 1\nname: always-answer\nbands:\n  - action: answer\non_degraded: answer\n", source="bench"
)


def ask_with(backend: Backend) -> Callable[[str], str]:
    def ask(prompt: str) -> str:
        params = SamplingParams(n=1, temperature=0.0, max_tokens=24)
        return backend.generate([prompt], params)[0][0].text

    return ask


def measure(name: str, ask: Callable[[str], str], estimator: CapabilityEstimator, prompts: list[str]) -> None:
    gated = guard(policy=ALWAYS_ANSWER, estimator=estimator)(ask)
    ask(prompts[0])  # warm-up both paths once
    gated(prompts[0])
    plain_s: list[float] = []
    gated_s: list[float] = []
    for prompt in prompts:
        start = time.perf_counter()
        ask(prompt)
        plain_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        gated(prompt)
        gated_s.append(time.perf_counter() - start)
    plain, gate = statistics.median(plain_s), statistics.median(gated_s)
    print(f"{name:<44} {plain:>10.3f} {gate:>10.3f} {gate / plain:>8.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--questions", type=int, default=12)
    parser.add_argument("--server", help="OpenAI-compatible base URL for the remote path")
    parser.add_argument("--served-model", help="model name on the server")
    args = parser.parse_args()
    prompts = [q.prompt for q in demo_questions(args.questions, seed=1)]
    print(f"data: {len(prompts)} held-out prompts from the shipped SmolLM2 labels; greedy, max 24 tokens")
    print(f"{'path':<44} {'ungated s':>10} {'gated s':>10} {'ratio':>9}")

    import torch

    from capgate.adapters.backends.transformers import load_backend
    from capgate.loading import load_estimator

    torch.set_num_threads(2)
    measure("local: probe (own prefill) + policy", ask_with(load_backend("default", device="cpu")),
            load_estimator("default", device="cpu"), prompts)  # fmt: skip
    if args.server:
        from capgate.adapters.backends.openai import OpenAIBackend
        from capgate.estimators import VerbalizedConfidence

        remote = OpenAIBackend(
            args.served_model or "default", base_url=args.server, api_key="none", timeout=300.0
        )
        measure(
            "remote: verbalized confidence + policy", ask_with(remote), VerbalizedConfidence(remote), prompts
        )


if __name__ == "__main__":
    main()
