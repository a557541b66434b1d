"""One process of the escalation-survives-a-restart test (run by tests/test_langgraph.py).

``start DB``: ask a question the policy escalates; once the interrupt is persisted print
``PENDING <interrupt id>`` and wait to be killed. ``resume DB``: in a new process, check what is
pending for the same thread, resume it with the reviewer's approval (the real model then answers)
and print the outcome as JSON.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import time

from _estimators import KeywordEstimator
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command

from capgate import SamplingParams
from capgate.adapters.agents.langchain import CapgateChatModel
from capgate.adapters.agents.langgraph import capability_subgraph
from capgate.adapters.backends.transformers import load_backend

THREAD = {"configurable": {"thread_id": "ticket-42"}}


def build(db: str) -> tuple[object, KeywordEstimator]:
    model = CapgateChatModel(backend=load_backend("default"), params=SamplingParams(max_tokens=24, seed=0))
    estimator = KeywordEstimator({"refund": 0.75})

    def answer(state: dict[str, object]) -> dict[str, object]:
        return {"messages": [model.invoke(state["messages"])]}  # type: ignore[arg-type]

    saver = SqliteSaver(sqlite3.connect(db, check_same_thread=False))
    graph = capability_subgraph(answer, policy="conservative", estimator=estimator)
    return graph.compile(checkpointer=saver), estimator


def main() -> None:
    mode, db = sys.argv[1], sys.argv[2]
    app, estimator = build(db)
    if mode == "start":
        out = app.invoke({"messages": [HumanMessage("Can I get a refund on a used item?")]}, THREAD)  # type: ignore[attr-defined]
        print("PENDING", out["__interrupt__"][0].id, flush=True)
        while True:  # stay alive until the test kills this process
            time.sleep(1)
    state = app.get_state(THREAD)  # type: ignore[attr-defined]
    pending = [i.value for i in state.interrupts]
    out = app.invoke(Command(resume={"decision": "approve", "reviewer": "alice"}), THREAD)  # type: ignore[attr-defined]
    print(
        json.dumps(
            {
                "next_before": list(state.next),
                "pending": pending,
                "estimator_calls": estimator.calls,
                "messages": [[m.type, m.content] for m in out["messages"]],
                "human": out["capgate_human"],
                "decision": out["capgate_decision"]["action"],
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
