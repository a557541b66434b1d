"""Roll a gate out: shadow mode, outcomes, the report, then decide whether to enforce it.

1. **Shadow.** An agent (one call to the embedded SmolLM2-135M-Instruct) is guarded in shadow mode:
   the gate estimates and decides beside each call and logs what it *would* have done, while every
   call is answered as if ungated.
2. **Outcomes.** The answers are graded (``capgate.grading``, against the held-out questions'
   references); the grader's verdicts are attached to the logged decisions by id
   (``capgate.last_decision().id``), in bulk from a JSONL file as ``capgate log outcome --file``
   would.
3. **Report.** :func:`capgate.decision.gate_report` (``capgate report --db LOG``) compares the
   ungated agent's accuracy with the accuracy of what the gate would have let through, and the
   coverage it would have cost, each with its 95% interval.
4. **Enforce** (not run here): drop ``mode="shadow"`` once the report says the trade is worth it.

Run: .venv/bin/python examples/shadow_rollout.py [--questions 24] [--db LOG]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Sequence
from pathlib import Path

import capgate
from capgate import SamplingParams
from capgate.adapters.backends.transformers import load_backend
from capgate.decision import DecisionLog, gate_report
from capgate.demo import DEMO_POLICY, demo_questions
from capgate.grading import grader_for


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=24, help="held-out questions to ask (default 24)")
    parser.add_argument("--db", type=Path, default=None, help="the decision log (default: a temporary file)")
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="capgate-shadow-"))
    log = DecisionLog(args.db or folder / "decisions.sqlite3")

    backend = load_backend("default", device="cpu")
    estimator = capgate.load_estimator("default", device="cpu")

    # 1. Shadow: the gate decides beside the call and logs what it would have done.
    @capgate.guard(policy=DEMO_POLICY, estimator=estimator, mode="shadow", log=log)
    def ask(prompt: str) -> str:
        """Ask the local model one question."""
        [[reply]] = backend.generate([prompt], SamplingParams(temperature=0.0, max_tokens=24, seed=0))
        return reply.text.strip()

    questions = demo_questions(args.questions, seed=0)
    outcomes = folder / "outcomes.jsonl"
    with outcomes.open("w", encoding="utf-8") as sink:
        for question in questions:
            answer = ask(question.prompt)  # shadow mode: always the model's answer
            decision = capgate.last_decision()  # this call's decision; its id is the logged one's
            assert decision is not None
            # 2. Outcomes: grade the answer; the verdict goes to the log by the decision's id.
            verdict = grader_for(question.item).judge(answer, question.item)
            line = {"decision_id": decision.id, "correct": verdict.correct, "source": "grader"}
            sink.write(json.dumps(line) + "\n")
    assert ask.gate.flush(120.0), "shadow decisions still in flight"
    imported = log.import_outcomes(outcomes)  # or: capgate log outcome --file outcomes.jsonl --db LOG
    print(f"asked {len(questions)} held-out questions in shadow mode; {imported.imported} outcomes attached")
    print(f"would-be actions: {dict(ask.stats.shadow_actions)}; actions taken: {dict(ask.stats.actions)}")

    # 3. Report: what the gate would have bought (capgate report --db LOG).
    report = gate_report(log, min_outcomes=20)
    print()
    print(report.format())
    (group,) = report.groups
    print()
    if group.accuracy_all is None or group.accuracy_gated is None or group.coverage is None:
        print(f"not enough outcomes yet: {group.with_outcome}")
    else:
        print(f"ungated accuracy:         {group.accuracy_all}")
        print(f"would-be gated accuracy:  {group.accuracy_gated}")
        print(f"would-be coverage:        {group.coverage}")
    # 4. Enforce: the same guard without mode="shadow" (or `mode: enforce` in the policy file).
    log.close()


if __name__ == "__main__":
    main()
