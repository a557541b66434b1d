"""Quickstart: gate a function that asks an LLM with ``@capgate.guard``.

The function asks the local model (the embedded SmolLM2-135M-Instruct by default); before each call
a capability estimator predicts the chance that the model answers correctly and a
policy decides: answer, resample, ask a clarifying question, or abstain. For the embedded model the estimator
is the linear probe shipped with capgate (``capgate.load_estimator("default")``: one forward pass
over the prompt, no sampling); for any other model it falls back to self-consistency (sample a
few answers, measure their agreement), which needs nothing but the model.

Run: .venv/bin/python examples/guard_quickstart.py [--model default]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import capgate
from capgate import SamplingParams
from capgate.adapters.backends.transformers import load_backend
from capgate.estimators import CapabilityEstimator, Consistency

QUESTIONS = (
    "One word only: what is the capital of France?",
    "Reply with just the number: what is 2 + 2?",
    "What will the exact closing price of the S&P 500 be on 3 March 2031?",
)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default", help="model name, folder or .gguf (default: default)")
    args = parser.parse_args(argv)

    backend = load_backend(args.model)
    estimator: CapabilityEstimator
    if args.model == "default":
        # The probe shipped for the embedded model: one forward pass, no sampling.
        estimator = capgate.load_estimator("default")
    else:
        # Any other model: self-consistency needs nothing but the model.
        estimator = Consistency(
            backend,
            k_c=4,
            extract=capgate.default_extract,
            params=SamplingParams(temperature=0.7, max_tokens=24, seed=0),
        )

    # The presets ("balanced", "conservative", "cost-saver") suit capable models; a 135M model is
    # rarely right, so the embedded model gets the demo's policy, whose thresholds were set from
    # the shipped probe's predictions on its training questions.
    policy = "demo-smollm2" if args.model == "default" else "balanced"

    @capgate.guard(policy=policy, estimator=estimator)
    def ask(prompt: str) -> str:
        """Ask the local model one question."""
        [[reply]] = backend.generate([prompt], SamplingParams(temperature=0.3, max_tokens=40, seed=0))
        return reply.text.strip()

    for question in QUESTIONS:
        result = ask(question)
        decision = ask.stats.last_decision
        assert decision is not None
        print(f"question: {question}")
        print(f"  p = {decision.estimate.p}, decision: {decision.action}")
        # A blocked call returns a capgate.Gated (decision, estimate, message) instead of an answer.
        print(f"  {'blocked' if isinstance(result, capgate.Gated) else 'answer'}: {result}")

    # The same function, raising instead of returning when the policy blocks it.
    strict = capgate.guard(policy="conservative", estimator=estimator, on_block="raise")(ask.__wrapped__)
    try:
        print(f"strict answer: {strict(QUESTIONS[2])}")
    except capgate.GateBlocked as blocked:
        print(f"strict: {type(blocked).__name__}: {blocked.message}")

    stats = ask.stats
    print(f"stats: calls={stats.calls} actions={dict(stats.actions)} degraded={stats.degraded}")


if __name__ == "__main__":
    main()
