"""Escalate a hard question to a human with LangGraph, persist the pending hand-off in SQLite, and
resume it after a restart.

``ask`` runs the gated graph on a question; the review-desk policy sends anything the model is not
nearly sure of to a human, so the graph pauses (``interrupt``) and the process exits with the
escalation stored in the SQLite checkpoint. ``resume``, in a new process, finds the pending
escalation for the same thread and resumes it with the reviewer's verdict: ``--reply TEXT`` answers
the user in the reviewer's words, ``--approve`` lets the model answer, ``--reject`` declines.
Without a command the script does both, the second part in a fresh process.

The capability estimator is self-consistency over the local model (the embedded
SmolLM2-135M-Instruct by default).

Run: .venv/bin/python examples/langgraph_escalation.py [--model default] [--db FILE]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from langchain_core.messages import HumanMessage
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command

from capgate import SamplingParams, default_extract
from capgate.adapters.agents.langchain import CapgateChatModel
from capgate.adapters.agents.langgraph import capability_subgraph, read_decision
from capgate.adapters.backends.transformers import load_backend
from capgate.estimators import Consistency
from capgate.policies import Policy

QUESTION = "What is the 20th digit of pi after the decimal point?"

REVIEW_DESK = """\
version: 1
name: review-desk
description: Answer only when nearly sure; otherwise a human from the maths desk takes it.
bands:
  - {below: 0.95, action: escalate, to: maths-desk}
  - {action: answer}
on_degraded: {action: escalate, to: maths-desk}
"""


def build(model: str, db: Path) -> Any:
    """The gated graph, compiled with a SQLite checkpointer (the same in every process)."""
    backend = load_backend(model)
    chat = CapgateChatModel(backend=backend, params=SamplingParams(temperature=0.3, max_tokens=40, seed=0))
    estimator = Consistency(
        backend, k_c=3, extract=default_extract, params=SamplingParams(temperature=0.7, max_tokens=24, seed=0)
    )

    def answer(state: dict[str, Any]) -> dict[str, Any]:
        return {"messages": [chat.invoke(state["messages"])]}

    graph = capability_subgraph(answer, policy=Policy.from_yaml_text(REVIEW_DESK), estimator=estimator)
    return graph.compile(checkpointer=SqliteSaver(sqlite3.connect(db, check_same_thread=False)))


def ask(app: Any, thread: dict[str, Any], question: str) -> None:
    out = app.invoke({"messages": [HumanMessage(question)]}, thread)
    decision = read_decision(out["capgate_decision"])
    assert decision is not None
    print(f"question: {question}")
    print(f"decision: {decision.action} (p={decision.estimate.p})")
    if "__interrupt__" not in out:
        print(f"answer: {out['messages'][-1].content}")
        return
    pending = out["__interrupt__"][0].value
    print(f"escalated to {pending['to']}: {pending['summary']}")
    print("pending escalation saved; the process can stop now")


def resume(app: Any, thread: dict[str, Any], verdict: dict[str, Any]) -> None:
    state = app.get_state(thread)
    if not state.interrupts:
        print("nothing pending for this thread")
        return
    pending = state.interrupts[0].value
    print(f"found pending escalation ({pending['kind']} to {pending['to']}): {pending['query']}")
    out = app.invoke(Command(resume=verdict), thread)
    print(f"reviewer: {json.dumps(verdict)}")
    print(f"final answer: {out['messages'][-1].content}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs="?", choices=("ask", "resume"), help="one step (default: both)")
    parser.add_argument("--model", default="default", help="model name, folder or .gguf (default: default)")
    parser.add_argument("--db", type=Path, help="SQLite checkpoint file (default: a temporary file)")
    parser.add_argument("--thread", default="ticket-1", help="conversation thread id")
    parser.add_argument("--question", default=QUESTION)
    verdicts = parser.add_mutually_exclusive_group()
    verdicts.add_argument("--reply", help="the reviewer answers in their own words")
    verdicts.add_argument("--approve", action="store_true", help="let the model answer")
    verdicts.add_argument("--reject", metavar="REASON", help="decline, with a reason")
    args = parser.parse_args(argv)

    db = args.db or Path(tempfile.mkdtemp()) / "checkpoints.sqlite"
    thread = {"configurable": {"thread_id": args.thread}}
    if args.command is None:  # both steps, the resume in a new process
        ask(build(args.model, db), thread, args.question)
        rest = ["resume", "--model", args.model, "--db", str(db), "--thread", args.thread]
        rest += ["--reply", args.reply or "The 20th digit of pi after the decimal point is 6."]
        subprocess.run([sys.executable, __file__, *rest], check=True)
        return
    app = build(args.model, db)
    if args.command == "ask":
        ask(app, thread, args.question)
        return
    if args.approve:
        verdict: dict[str, Any] = {"decision": "approve", "reviewer": "maths-desk"}
    elif args.reject is not None:
        verdict = {"decision": "reject", "message": args.reject, "reviewer": "maths-desk"}
    else:
        verdict = {"decision": "reply", "message": args.reply or "Let me check and get back to you."}
    resume(app, thread, verdict)


if __name__ == "__main__":
    main()
