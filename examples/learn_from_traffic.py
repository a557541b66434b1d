"""Learn from your own traffic: shadow -> outcomes -> calibrate -> shadow the new version -> promote.

The embedded SmolLM2-135M-Instruct answers held-out questions (the shipped split's, which its
probe never saw); the gate starts from the shipped probe.

1. **Shadow, keeping features.** A gate in shadow mode decides beside each call and logs each
   decision with the reader features its probe computed (``log_features=True``: no second pass).
2. **Outcomes.** Each answer is graded against the question's references; the verdicts go to the
   log by decision id, in bulk (``capgate log outcome --file``).
3. **Calibrate.** :func:`capgate.learn.calibrate` (``capgate calibrate --db LOG --out DIR``):
   the probe as it is, an isotonic and a Platt map of its estimates and a probe refitted on the
   logged features are judged on the latest outcomes (never on those they were fitted on); the
   kept one and its Learn-then-Test answer threshold are written to a versioned folder.
4. **Shadow the new version.** ``capgate calibrate shadow``: a gate with
   ``shadow_calibration="candidate"`` also decides under the candidate, beside each call; the
   report compares the two versions on the same decisions.
5. **Promote.** ``capgate calibrate promote``: a gate with ``calibration="promoted"`` enforces the
   new version, and every decision records it (``capgate calibrate rollback`` returns to the
   previous one).

Run: .venv/bin/python examples/learn_from_traffic.py [--questions 120] [--then 40] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import capgate
from capgate import SamplingParams
from capgate.adapters.backends.transformers import load_backend
from capgate.decision import DecisionLog, gate_report
from capgate.demo import DemoQuestion, demo_questions
from capgate.grading import grader_for
from capgate.learn import calibrate

RISK = 0.7  # the answered share's error rate the calibrated threshold keeps, with prob. >= 1 - DELTA
DELTA = 0.1  # (a 135M model: ungated, about 3 answers in 4 are wrong on these questions)


def capgate_cli(*args: str) -> str:
    """Run a ``capgate`` command (as a user would in a shell) and return what it printed."""
    print(f"$ capgate {' '.join(args)}")
    done = subprocess.run(
        [sys.executable, "-m", "capgate.cli", *args], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"capgate {args[0]} failed:\n{done.stderr}")
    return done.stdout


def ask_and_grade(ask: Callable[[str], object], questions: Sequence[DemoQuestion], outcomes: Path) -> int:
    """Ask each question through the guarded call, grade each answer, write the verdicts by decision id."""
    with outcomes.open("w", encoding="utf-8") as sink:
        for question in questions:
            answer = ask(question.prompt)
            decision = capgate.last_decision()  # this call's decision; the logged one has its id
            assert decision is not None
            text = answer if isinstance(answer, str) else ""  # a blocked call answers nothing
            verdict = grader_for(question.item).judge(text, question.item)
            line = {"decision_id": decision.id, "correct": verdict.correct, "source": "grader"}
            sink.write(json.dumps(line) + "\n")
    return len(questions)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=120, help="questions asked before calibrating")
    parser.add_argument("--then", type=int, default=40, help="questions asked with the candidate in shadow")
    parser.add_argument("--work", type=Path, default=None, help="folder for the log and calibration")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="capgate-learn-"))
    work.mkdir(parents=True, exist_ok=True)
    db = work / "decisions.sqlite3"
    log = DecisionLog(db)

    backend = load_backend("default", device="cpu")
    estimator = capgate.load_estimator("default", device="cpu")

    def answer(prompt: str) -> str:
        """The model's answer (greedy, short)."""
        [[reply]] = backend.generate([prompt], SamplingParams(temperature=0.0, max_tokens=24, seed=0))
        return reply.text.strip()

    questions = demo_questions(args.questions + args.then, seed=0)
    first, then = questions[: args.questions], questions[args.questions :]

    # 1-2. Shadow mode with features kept; the graded answers become the log's outcomes.
    # The default policy ("balanced"); calibrate sets its answer threshold. A gate running under a
    # calibration that carries thresholds takes them as its policy (so no policy= beside it).
    shadow = capgate.guard(estimator=estimator, mode="shadow", log=log, log_features=True)
    ask = shadow(answer)
    ask_and_grade(ask, first, work / "outcomes-1.jsonl")
    assert ask.gate.flush(300.0), "shadow decisions still in flight"
    imported = log.import_outcomes(work / "outcomes-1.jsonl")
    print(f"1. shadow: {len(first)} questions asked, {imported.imported} graded outcomes attached")

    # 3. Calibrate: candidates judged on the latest outcomes; thresholds for the stated risk.
    result = calibrate(log, out=work / "calibration-1", risk=RISK, delta=DELTA)
    print(f"3. calibrate: kept {result.kind!r}, version {result.version}")
    for row in result.table:  # each candidate on the latest outcomes, against the previous estimator
        kept = "  <- kept" if row.chosen else ""
        print(f"   {row.candidate:<9} Brier {row.brier:.3f} [{row.brier_low:.3f}, {row.brier_high:.3f}] "
              f"on {row.n} held-out outcomes, {row.diff:+.3f} vs previous{kept}")  # fmt: skip
    for note in result.notes:
        print(f"   note: {note}")

    # 4. Shadow the new version beside the current one (none promoted yet: the probe as shipped).
    print(capgate_cli("calibrate", "shadow", "--db", str(db), str(result.calibration.path)).rstrip())
    both = capgate.guard(
        estimator=estimator, mode="shadow", log=log, calibration="promoted", shadow_calibration="candidate"
    )
    ask = both(answer)
    ask_and_grade(ask, then, work / "outcomes-2.jsonl")
    assert ask.gate.flush(300.0), "shadow decisions still in flight"
    log.import_outcomes(work / "outcomes-2.jsonl")
    print(f"4. shadow of {result.version}: {len(then)} more questions, decided under both versions")
    print(gate_report(log, min_outcomes=10).format())

    # 5. Promote: the gate enforces the new version; each decision records it.
    print(capgate_cli("calibrate", "promote", "--db", str(db), str(result.calibration.path)).rstrip())
    enforced = capgate.guard(estimator=estimator, log=log, calibration="promoted")
    ask = enforced(answer)
    for question in then[:3]:
        reply = ask(question.prompt)
        decision = capgate.last_decision()
        assert decision is not None
        shown = reply if isinstance(reply, str) else "(blocked)"
        print(f"5. {decision.action} under {decision.calibration} (p={decision.estimate.p:.3f}): {shown}")
    print(capgate_cli("calibrate", "status", "--db", str(db)).rstrip())
    log.close()


if __name__ == "__main__":
    main()
