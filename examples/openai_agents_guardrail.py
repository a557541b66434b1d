"""capgate in the OpenAI Agents SDK: a capability input guardrail and a triage agent that hands off.

The agent's model is an OpenAI-compatible server (``OpenAIChatCompletionsModel`` over
``AsyncOpenAI``; CI uses its vLLM server). The estimate is the model's own verbalized confidence,
asked of the same server (the hosted-model path: no hidden states needed). Both SDK modes run:

1. A blocking guardrail (``run_in_parallel=False``): an ``abstain`` / ``clarify`` / ``escalate``
   trips the wire before the model is called (nothing spent); the decision is in ``output_info``.
2. A triage agent (``capability_triage``): ``escalate`` to ``human-review`` is a handoff to the
   reviewer agent; ``answer`` hands the run to the helper.

Run: .venv/bin/python examples/openai_agents_guardrail.py --base-url http://127.0.0.1:8000/v1 \
     --model SERVED_NAME
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from agents import (
    Agent,
    InputGuardrailTripwireTriggered,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

from capgate import SamplingParams
from capgate.adapters.agents.openai_agents import capability_guardrail, capability_triage
from capgate.adapters.backends.openai import OpenAIBackend
from capgate.estimators import VerbalizedConfidence

QUESTIONS = (
    "What is the capital of France?",
    "Which lottery numbers will be drawn next Saturday?",
)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL"), help="server URL (…/v1)")
    parser.add_argument("--model", required=True, help="the served model name")
    args = parser.parse_args(argv)
    set_tracing_disabled(True)  # the SDK's trace export goes to OpenAI's platform; not here

    api_key = os.environ.get("OPENAI_API_KEY", "EMPTY")
    client = AsyncOpenAI(base_url=args.base_url, api_key=api_key)
    model = OpenAIChatCompletionsModel(model=args.model, openai_client=client)
    settings = ModelSettings(max_tokens=48)
    # The estimator asks the same served model how likely it is to answer correctly.
    backend = OpenAIBackend(args.model, base_url=args.base_url, api_key=api_key)
    estimator = VerbalizedConfidence(backend, params=SamplingParams(temperature=0.7, max_tokens=64))

    # 1. The guardrail, blocking: a tripped run never calls the model.
    guard = capability_guardrail(policy="balanced", estimator=estimator, run_in_parallel=False)
    helper = Agent(
        name="helper", instructions="Answer in one sentence.", model=model, model_settings=settings,
        input_guardrails=[guard],
    )  # fmt: skip
    for question in QUESTIONS:
        print(f"question: {question}")
        try:
            result = Runner.run_sync(helper, question)
        except InputGuardrailTripwireTriggered as tripped:
            check = tripped.guardrail_result.output.output_info
            print(
                f"  decision: {check.action} (p={check.decision.estimate.p}, target {check.decision.target})"
            )
            print(f"  tripped: {check.message}")
        else:
            (check,) = (r.output.output_info for r in result.input_guardrail_results)
            print(
                f"  decision: {check.action} (p={check.decision.estimate.p}, target {check.decision.target})"
            )
            print(f"  reply: {str(result.final_output).strip()}")

    # 2. The triage: escalate (conservative policy, `to: human-review`) is a handoff.
    reviewer = Agent(
        name="reviewer", instructions="Say that a human reviewer will follow up.", model=model,
        model_settings=settings,
    )  # fmt: skip
    plain = helper.clone(input_guardrails=[])
    triage = capability_triage(
        plain, escalate_to={"human-review": reviewer}, policy="conservative", estimator=estimator
    )
    question = "Is this clause of my lease enforceable: 'the tenant pays all repairs'?"
    print(f"triage: {question}")
    try:
        result = Runner.run_sync(triage, question)
    except InputGuardrailTripwireTriggered as tripped:
        check = tripped.guardrail_result.output.output_info
        print(f"  decision: {check.action}; tripped: {check.message}")
    else:
        (check,) = (r.output.output_info for r in result.input_guardrail_results)
        print(f"  decision: {check.action}; handed to: {result.last_agent.name}")
        print(f"  reply: {str(result.final_output).strip()}")
    assert guard.gate is not None
    stats = guard.gate.stats
    print(f"gate stats: calls={stats.calls} actions={dict(stats.actions)} degraded={stats.degraded}")


if __name__ == "__main__":
    main()
