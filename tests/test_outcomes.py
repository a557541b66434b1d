"""Outcomes (#22 part 2): attached one at a time or in bulk, per source, from wherever the decision
id is held: a guarded call (``capgate.last_decision()``), LangGraph state, the LangChain
middleware's state. Both stores."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from _estimators import KeywordEstimator
from typer.testing import CliRunner

import capgate
from capgate import DataError, Estimate, Outcome
from capgate.cli import app
from capgate.core.messages import query_hash
from capgate.decision import Decision, DecisionLog
from capgate.decision.store.outcomes import OutcomeConflictError, OutcomeImportError

WAIT_S = 30.0


def _decision(p: float = 0.9) -> Decision:
    return Decision(action="answer", estimate=Estimate(p=p, method="probe"), reason="r")


# --------------------------------------------------------------------------- one at a time


def test_binary_rate_and_score_outcomes_side_by_side_by_source(log_location: str | Path) -> None:
    d = _decision()
    with DecisionLog(log_location) as log:
        log.record(d)
        log.record_outcome(d.id, correct=True, source="user", note="thumbs up")
        log.record_outcome(d.id, mu_hat=0.75, k=4, source="grader")
        log.record_outcome(d.id, score=0.5, source="test", latency_s=1.5)
        got = log.get(d.id)
    by_source = {o.source: o for o in got.outcomes}
    assert set(by_source) == {"user", "grader", "test"}
    assert (by_source["user"].correct, by_source["user"].note) == (True, "thumbs up")
    assert (by_source["grader"].mu_hat, by_source["grader"].k) == (0.75, 4)
    assert (by_source["test"].score, by_source["test"].latency_s) == (0.5, 1.5)
    assert got.value == pytest.approx((1.0 + 0.75 + 0.5) / 3)
    assert got.outcome == got.outcomes[-1]
    assert [o.recorded_at for o in got.outcomes] == sorted(o.recorded_at for o in got.outcomes)


def test_attaching_is_idempotent_a_conflict_is_an_error_unless_replaced(log_location: str | Path) -> None:
    d = _decision()
    with DecisionLog(log_location) as log:
        log.record(d)
        first = log.record_outcome(d.id, correct=False, source="grader", note="first")
        again = log.record_outcome(d.id, correct=False, source="grader", note="a retry")
        assert again == first  # the first record (time, note) is kept
        with pytest.raises(OutcomeConflictError) as info:
            log.record_outcome(d.id, correct=True, source="grader")
        message = str(info.value)
        assert f"decision {d.id!r} already has an outcome from source 'grader' (correct=False" in message
        assert "this one says correct=True" in message
        assert "replace=True" in message
        assert info.value.field == "source"
        log.record_outcome(d.id, correct=True, source="user")  # another source: no conflict
        replaced = log.record_outcome(d.id, correct=True, source="grader", replace=True)
        assert {o.source: o for o in log.get(d.id).outcomes}["grader"] == replaced
        assert len(log.get(d.id).outcomes) == 2


def test_an_unknown_id_or_an_empty_outcome_is_a_clear_error(log_location: str | Path) -> None:
    with DecisionLog(log_location) as log:
        log.record(_decision())
        for replace in (False, True):
            with pytest.raises(DataError, match="no decision with id 'nope' in the log") as info:
                log.record_outcome("nope", score=0.5, replace=replace)
            assert info.value.field == "decision_id"
        with pytest.raises(DataError, match="needs `correct`, `mu_hat` or `score`"):
            log.record_outcome(log.decisions()[0].id, source="user")


def test_outcome_fields_are_checked() -> None:
    with pytest.raises(ValueError, match="whole number"):
        Outcome(decision_id="x", mu_hat=0.5, k=3)
    with pytest.raises(ValueError, match="give `mu_hat` with it"):
        Outcome(decision_id="x", correct=True, k=3)
    with pytest.raises(ValueError, match="less than or equal to 1"):
        Outcome(decision_id="x", score=1.5)
    with pytest.raises(ValueError, match="source"):
        Outcome(decision_id="x", correct=True, source=" user")
    assert Outcome(decision_id="x", correct=False, mu_hat=1.0).value == 0.0  # the answer's own verdict first
    assert Outcome(decision_id="x", mu_hat=0.25, k=4, score=1.0).value == 0.25


# --------------------------------------------------------------------------- bulk, from a file


def _write(path: Path, lines: list[Any]) -> Path:
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


def test_bulk_import_reports_every_bad_line_and_imports_nothing(
    log_location: str | Path, tmp_path: Path
) -> None:
    a, b, c = _decision(), _decision(), _decision()
    with DecisionLog(log_location) as log:
        for d in (a, b, c):
            log.record(d)
        log.record_outcome(c.id, correct=True, source="user")
        path = _write(
            tmp_path / "outcomes.jsonl",
            [
                {"decision_id": a.id, "correct": True, "source": "user"},  # 1 good
                "{not json",  # 2
                {"decision_id": "ghost", "correct": True},  # 3 unknown id
                {"decision_id": b.id, "score": 1.5},  # 4 out of range
                {"decision_id": b.id, "correct": True, "colour": "red"},  # 5 unknown field
                {"decision_id": c.id, "correct": False, "source": "user"},  # 6 conflicts with the log
                "",
                {"decision_id": a.id, "correct": False, "source": "user"},  # 8 contradicts line 1
                {"decision_id": b.id},  # 9 says nothing
                {"decision_id": c.id, "correct": True, "source": "user"},  # 10 already there: fine
                [1, 2],  # 11
            ],
        )
        with pytest.raises(OutcomeImportError) as info:
            log.import_outcomes(path)
        located = [(e.line, e.field) for e in info.value.errors]
        assert located == [
            (2, None),
            (3, "decision_id"),
            (4, "score"),
            (5, "colour"),
            (6, "source"),
            (8, "source"),
            (9, "correct"),
            (11, None),
        ]
        assert f"{path}:3: field 'decision_id': no decision with id 'ghost' in the log" in str(info.value)
        assert log.count(with_outcome=True) == 1  # nothing imported
        summary = log.import_outcomes(path, skip_bad=True)
        assert (summary.imported, summary.unchanged, summary.skipped) == (1, 1, 8)
        assert [o.source for o in log.get(a.id).outcomes] == ["user"]
        assert log.get(b.id).outcomes == ()
        replaced = log.import_outcomes(
            _write(tmp_path / "fix.jsonl", [{"decision_id": c.id, "correct": False, "source": "user"}]),
            replace=True,
        )
        assert replaced.imported == 1
        assert log.get(c.id).outcome is not None
        assert log.get(c.id).outcome.correct is False


def test_cli_bulk_import(tmp_path: Path) -> None:
    db = tmp_path / "d.sqlite3"
    a, b = _decision(), _decision()
    with DecisionLog(db) as log:
        log.record(a)
        log.record(b)
    bad = _write(
        tmp_path / "bad.jsonl",
        [
            {"decision_id": a.id, "mu_hat": 0.5, "k": 2, "source": "grader"},
            {"decision_id": "ghost", "score": 1},
        ],
    )
    runner = CliRunner()
    result = runner.invoke(app, ["log", "outcome", "--file", str(bad), "--db", str(db)])
    assert result.exit_code == 2
    assert f"error: {bad}:2: field 'decision_id': no decision with id 'ghost' in the log" in result.stderr
    assert "1 bad line(s); nothing imported" in result.stderr
    with DecisionLog(db) as log:
        assert log.count(with_outcome=True) == 0
    result = runner.invoke(app, ["log", "outcome", "--file", str(bad), "--skip-bad", "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert "imported 1 outcomes" in result.stdout
    assert f"skipped: {bad}:2" in result.stderr
    result = runner.invoke(
        app, ["log", "outcome", b.id, "--score", "0.4", "--source", "tool", "--db", str(db)]
    )
    assert result.exit_code == 0, result.output
    assert "score=0.4 (source tool)" in result.stdout
    result = runner.invoke(
        app, ["log", "outcome", b.id, "--score", "0.9", "--source", "tool", "--db", str(db)]
    )
    assert result.exit_code == 2
    assert "already has an outcome from source 'tool'" in result.stderr
    result = runner.invoke(app, ["log", "outcome", b.id, "--file", str(bad), "--db", str(db)])
    assert result.exit_code == 2
    assert "--file takes the outcomes from the file; drop DECISION_ID" in result.stderr
    # an outcome's own checks are error lines naming the option, not pydantic's dump
    for options, message in (
        (["--mu-hat", "0.3", "--k", "4"], "error: `mu_hat` * `k` must be a whole number of correct answers"),
        (["--correct", "yes", "--source", " user"], "error: --source: String should match pattern"),
    ):
        result = runner.invoke(app, ["log", "outcome", b.id, *options, "--db", str(db)])
        assert result.exit_code == 2, result.output
        assert result.stderr.startswith(message), result.stderr
        assert "validation error" not in result.stderr


def test_a_recorded_at_without_a_time_zone_is_refused_naming_file_line_and_field(tmp_path: Path) -> None:
    """A naive ``recorded_at`` cannot be ordered against the decision's other outcomes: refused at
    import (file:line, field) and when attached, so the log stays readable."""
    from datetime import datetime

    db = tmp_path / "d.sqlite3"
    d = _decision()
    with DecisionLog(db) as log:
        log.record(d)
        log.record_outcome(d.id, correct=True, source="grader")
        with pytest.raises(DataError, match="time zone") as info:
            log.record_outcome(
                Outcome(decision_id=d.id, score=0.0, source="user", recorded_at=datetime(2026, 1, 5))
            )
        assert info.value.field == "recorded_at"
    naive = _write(
        tmp_path / "naive.jsonl",
        [
            {"decision_id": d.id, "score": 0.0, "source": "user", "recorded_at": "2026-01-05T10:00:00"},
            {"decision_id": d.id, "score": 1.0, "source": "test", "recorded_at": "2026-01-05T10:00:00Z"},
        ],
    )
    result = CliRunner().invoke(app, ["log", "outcome", "--file", str(naive), "--db", str(db)])
    assert result.exit_code == 2, result.output
    assert f"error: {naive}:1: field 'recorded_at': must carry a time zone" in result.stderr
    shown = CliRunner().invoke(app, ["log", "show", "--db", str(db)])
    assert shown.exit_code == 0, shown.output
    with DecisionLog(db) as log:
        assert [o.source for o in log.get(d.id).outcomes] == ["grader"]


# --------------------------------------------------------------------------- from a guarded call


def _guarded(log: DecisionLog, **settings: Any) -> Any:
    estimator = KeywordEstimator({"hard": 0.05}, default=0.95)

    @capgate.guard(policy="balanced", estimator=estimator, log=log, **settings)
    def ask(prompt: str) -> str:
        return f"answer to {prompt}"

    return ask


def test_a_guarded_call_exposes_its_decision_without_changing_what_it_returns(tmp_path: Path) -> None:
    log = DecisionLog(tmp_path / "d.sqlite3")
    ask = _guarded(log)
    assert ask("easy one") == "answer to easy one"
    decision = capgate.last_decision()
    assert decision is not None
    assert decision.action == "answer"
    log.record_outcome(decision.id, correct=True, source="user")
    assert log.get(decision.id).outcome is not None
    blocked = ask("hard one")
    assert capgate.last_decision() == blocked.decision  # a block's decision too
    log.record_outcome(blocked.decision.id, correct=False, source="grader")
    assert log.count(with_outcome=True) == 2


def test_an_async_guarded_call_and_a_shadow_one_expose_their_decision(tmp_path: Path) -> None:
    log = DecisionLog(tmp_path / "d.sqlite3")
    estimator = KeywordEstimator({"hard": 0.05}, default=0.95)

    @capgate.guard(policy="balanced", estimator=estimator, log=log, mode="shadow")
    async def ask(prompt: str) -> str:
        return "42"

    async def main() -> str:
        assert await ask("hard one") == "42"  # shadow: answered
        decision = capgate.last_decision()
        assert decision is not None
        await ask.gate.aflush()  # its async-only estimator decides on this loop: wait before it ends
        return decision.id

    decision_id = asyncio.run(main())
    logged = log.get(decision_id).decision
    assert (logged.shadow, logged.action, logged.degraded) == (True, "abstain", False)
    log.record_outcome(decision_id, correct=True, source="grader")
    assert log.get(decision_id).value == 1.0


def test_concurrent_threads_each_see_their_own_decision(tmp_path: Path) -> None:
    log = DecisionLog(tmp_path / "d.sqlite3")
    n = 8
    inside = threading.Barrier(n, timeout=WAIT_S)  # every call is in flight at once
    estimator = KeywordEstimator({}, default=0.95)

    @capgate.guard(policy="balanced", estimator=estimator, log=log)
    def ask(prompt: str) -> str:
        assert capgate.last_decision() is not None  # the function itself may read it
        inside.wait()
        return prompt

    seen: dict[str, str] = {}

    def worker(i: int) -> None:
        ask(f"question {i}")
        decision = capgate.last_decision()
        assert decision is not None
        seen[f"question {i}"] = decision.id

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert len(set(seen.values())) == n
    for question, decision_id in seen.items():
        assert log.get(decision_id).query_sha256 == query_hash(question)
    mine = capgate.last_decision()  # this thread made none of those calls
    assert mine is None or mine.id not in seen.values()


def test_concurrent_tasks_each_see_their_own_decision(tmp_path: Path) -> None:
    log = DecisionLog(tmp_path / "d.sqlite3")
    n = 6
    estimator = KeywordEstimator({}, default=0.95)

    async def main() -> tuple[dict[str, str], bool]:
        before = capgate.last_decision()
        arrived = 0
        all_in = asyncio.Event()

        @capgate.guard(policy="balanced", estimator=estimator, log=log)
        async def ask(prompt: str) -> str:
            nonlocal arrived
            arrived += 1
            if arrived == n:
                all_in.set()
            await asyncio.wait_for(all_in.wait(), WAIT_S)
            return prompt

        async def one(question: str) -> tuple[str, str]:
            await ask(question)
            decision = capgate.last_decision()
            assert decision is not None
            return question, decision.id

        pairs = await asyncio.gather(*(one(f"question {i}") for i in range(n)))
        return dict(pairs), capgate.last_decision() == before  # the tasks' calls leave the caller's

    seen, untouched = asyncio.run(main())
    assert untouched
    assert len(set(seen.values())) == n
    for question, decision_id in seen.items():
        assert log.get(decision_id).query_sha256 == query_hash(question)


# --------------------------------------------------------------------------- from agent state


@pytest.mark.slow
def test_an_outcome_attaches_from_langgraph_state(default_model_dir: Path, tmp_path: Path) -> None:
    from langchain_core.messages import HumanMessage
    from langgraph.checkpoint.memory import InMemorySaver

    from capgate import Gate, SamplingParams
    from capgate.adapters.agents.langchain import CapgateChatModel
    from capgate.adapters.agents.langgraph import capability_subgraph
    from capgate.adapters.backends.transformers import load_backend

    model = CapgateChatModel(backend=load_backend("default"), params=SamplingParams(max_tokens=8))

    def answer(state: dict[str, Any]) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    log = DecisionLog(tmp_path / "log.sqlite3")
    gate = Gate(policy="balanced", estimator=KeywordEstimator({}, default=0.95), log=log)
    graph = capability_subgraph(answer, gate=gate).compile(checkpointer=InMemorySaver())
    out = graph.invoke({"messages": [HumanMessage("What is 2 + 2?")]}, {"configurable": {"thread_id": "o"}})
    decision_id = out["capgate_decision"]["id"]
    log.record_outcome(decision_id, correct="4" in str(out["messages"][-1].content), source="grader")
    assert log.get(decision_id).outcome is not None
    assert log.get(decision_id).decision.action == "answer"


@pytest.mark.slow
def test_an_outcome_attaches_from_the_langchain_middleware_state(real_backend: Any, tmp_path: Path) -> None:
    from langchain.agents import create_agent
    from langchain_core.messages import HumanMessage
    from langgraph.checkpoint.memory import InMemorySaver

    from capgate import SamplingParams
    from capgate.adapters.agents.langchain import CapabilityGate, CapgateChatModel

    log = DecisionLog(tmp_path / "log.sqlite3")
    middleware = CapabilityGate(
        policy="balanced", estimator=KeywordEstimator({}, default=0.95), mode="shadow", log=log
    )
    model = CapgateChatModel(backend=real_backend, params=SamplingParams(max_tokens=8))
    agent = create_agent(model, tools=[], middleware=[middleware], checkpointer=InMemorySaver())
    out = agent.invoke({"messages": [HumanMessage("What is 2 + 2?")]}, {"configurable": {"thread_id": "o"}})
    decision_id = out["capgate_decision"]["id"]
    assert middleware.gate.flush(WAIT_S)
    log.record_outcome(decision_id, correct=False, source="user", note="thumbs down")
    got = log.get(decision_id)
    assert got.decision.shadow
    assert got.outcome is not None
    assert got.outcome.note == "thumbs down"
