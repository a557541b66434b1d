"""A LangChain agent (``create_agent``) whose model steps and tool calls are gated by capgate.

The agent's model is the local model (the embedded SmolLM2-135M-Instruct by default) behind
``CapgateChatModel``; its tool is a small calculator. ``CapabilityGate`` estimates each model step
(self-consistency over the same model) and applies the ``balanced`` policy: answer, ask a
clarifying question (the graph pauses; this script then answers for the user) or abstain.

Run: .venv/bin/python examples/langchain_middleware.py [--model default]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from langchain.agents import create_agent
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from capgate import SamplingParams, default_extract
from capgate.adapters.agents.langchain import CapabilityGate, CapgateChatModel
from capgate.adapters.backends.transformers import load_backend
from capgate.estimators import Consistency

QUESTIONS = (
    "What is the capital of Japan?",
    "Tell me about it.",
    "Which lottery numbers will be drawn next Saturday?",
)
CLARIFICATION = "I mean the capital city of the country Japan, in Asia."


@tool
def multiply(a: float, b: float) -> float:
    """Multiply two numbers."""
    return a * b


def decision_of(out: dict[str, Any]) -> dict[str, Any]:
    """The gate's decision in an agent result: the one waiting on a human, else the last one."""
    if "__interrupt__" in out:
        return dict(out["__interrupt__"][0].value["decision"])
    return dict(out["capgate_decision"])


def describe(decision: dict[str, Any]) -> str:
    return f"{decision['action']} (p={decision['estimate']['p']})"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default", help="model name, folder or .gguf (default: default)")
    args = parser.parse_args(argv)

    backend = load_backend(args.model)
    estimator = Consistency(
        backend, k_c=4, extract=default_extract, params=SamplingParams(temperature=0.7, max_tokens=24, seed=0)
    )
    middleware = CapabilityGate(policy="balanced", estimator=estimator)
    agent = create_agent(
        CapgateChatModel(backend=backend, params=SamplingParams(temperature=0.3, max_tokens=40, seed=0)),
        tools=[multiply],
        middleware=[middleware],
        checkpointer=InMemorySaver(),
    )
    for i, question in enumerate(QUESTIONS):
        config: dict[str, Any] = {"configurable": {"thread_id": f"user-{i}"}}
        out = agent.invoke({"messages": [{"role": "user", "content": question}]}, config)
        print(f"question: {question}")
        print(f"  decision: {describe(decision_of(out))}")
        while "__interrupt__" in out:  # clarify (or escalate): answer for the user and resume
            request = out["__interrupt__"][0].value
            print(f"  the agent asks: {request.get('question') or request.get('summary')}")
            resume = {"answer": CLARIFICATION} if request["kind"] == "clarify" else {"decision": "approve"}
            out = agent.invoke(Command(resume=resume), config)
            print(f"  after the user's reply, decision: {describe(decision_of(out))}")
        print(f"  reply: {out['messages'][-1].content}")
    stats = middleware.stats
    print(f"gate stats: calls={stats.calls} actions={dict(stats.actions)}")


if __name__ == "__main__":
    main()
