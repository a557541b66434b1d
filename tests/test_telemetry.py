"""OpenTelemetry traces of gate decisions: the real SDK with its in-memory exporter, a real
OTLP/HTTP export to a receiver this test starts, and capgate without OpenTelemetry installed."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from _estimators import KeywordEstimator
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import capgate
from capgate import Decision, Estimate, Gate
from capgate.decision import DecisionLog
from capgate.gate import telemetry
from capgate.policies import Policy

ROOT = Path(__file__).resolve().parents[1]

POLICY = Policy.model_validate(
    {
        "name": "traced",
        "bands": [
            {"below": 0.2, "action": "abstain"},
            {"below": 0.6, "action": "resample", "max_samples": 6, "batch_size": 2},
            {"action": "answer"},
        ],
        "on_degraded": {"action": "abstain", "message": "No estimate."},
    }
)
TABLE = {"HARD": 0.1, "MID": 0.4, "NOEST": None}

_EXPORTER = InMemorySpanExporter()


def _provider() -> TracerProvider:
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
        provider = trace.get_tracer_provider()
        assert isinstance(provider, TracerProvider)
    return provider


_provider().add_span_processor(SimpleSpanProcessor(_EXPORTER))


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


def _named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def _children(exporter: InMemorySpanExporter, parent: ReadableSpan, name: str) -> list[ReadableSpan]:
    return [
        s
        for s in exporter.get_finished_spans()
        if s.name == name and s.parent is not None and s.parent.span_id == parent.context.span_id
    ]


def _outer() -> Any:
    return trace.get_tracer("test").start_as_current_span("caller")


def test_a_resample_decision_is_one_gate_span_with_estimate_and_round_children(
    spans: InMemorySpanExporter,
) -> None:
    answers = itertools.cycle(["4", "5", "4"])

    @capgate.guard(policy=POLICY, estimator=KeywordEstimator(TABLE), target="model-a")
    def ask(prompt: str) -> str:
        return next(answers)

    with _outer() as caller:
        assert ask("MID: what is 2 + 2?") == "4"
    (gate,) = _named(spans, telemetry.SPAN_GATE)
    assert gate.parent is not None
    assert gate.parent.span_id == caller.get_span_context().span_id
    attrs = dict(gate.attributes or {})
    decision = ask.stats.last_decision
    assert decision is not None
    assert attrs["capgate.decision.id"] == decision.id
    assert attrs["capgate.action"] == "resample"
    assert attrs["capgate.p"] == pytest.approx(0.4)
    assert attrs["capgate.estimator"] == "keyword"
    assert attrs["capgate.degraded"] is False
    assert attrs["capgate.policy.name"] == "traced"
    assert attrs["capgate.policy.version"] == 1
    assert attrs["gen_ai.request.model"] == "model-a"
    cas = ask.stats.last_cas
    assert cas is not None
    assert attrs["capgate.samples"] == cas.samples_used
    assert attrs["capgate.stop_rule"] == cas.stopped_by
    assert "capgate.query" not in attrs  # no text log: no query text
    (estimate,) = _children(spans, gate, telemetry.SPAN_ESTIMATE)
    assert dict(estimate.attributes or {})["capgate.p"] == pytest.approx(0.4)
    rounds = _children(spans, gate, telemetry.SPAN_ROUND)
    assert len(rounds) == cas.batches >= 1
    assert [dict(r.attributes or {})["capgate.round"] for r in rounds] == list(range(cas.batches))
    assert sum(dict(r.attributes or {})["capgate.samples"] for r in rounds) == cas.samples_used


def test_a_degraded_decision_says_why_on_its_span(spans: InMemorySpanExporter) -> None:
    @capgate.guard(policy=POLICY, estimator=KeywordEstimator(TABLE))
    def ask(prompt: str) -> str:
        raise AssertionError("a degraded estimate must not reach the model")

    result = ask("NOEST question")
    assert isinstance(result, capgate.Gated)
    (gate,) = _named(spans, telemetry.SPAN_GATE)
    attrs = dict(gate.attributes or {})
    assert attrs["capgate.degraded"] is True
    assert attrs["capgate.degraded.reason"] == "marker 'NOEST' means no estimate"
    assert attrs["capgate.action"] == "abstain"
    assert "capgate.p" not in attrs


def test_the_query_text_is_on_the_span_only_when_the_log_keeps_text(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    for store_text in (False, True):
        log = DecisionLog(tmp_path / f"log-{store_text}.db", store_text=store_text)
        gate = Gate(policy=POLICY, estimator=KeywordEstimator(TABLE), log=log)

        @capgate.guard(gate=gate)
        def ask(prompt: str) -> str:
            return "fine"

        ask("the secret question")
        log.close()
    plain, texted = _named(spans, telemetry.SPAN_GATE)
    assert "capgate.query" not in dict(plain.attributes or {})
    assert "the secret question" in str(dict(texted.attributes or {})["capgate.query"])


def test_a_direct_assess_is_a_gate_span_too(spans: InMemorySpanExporter) -> None:
    verdict = Gate(policy=POLICY, estimator=KeywordEstimator(TABLE)).assess("HARD one")
    (gate,) = _named(spans, telemetry.SPAN_GATE)
    assert dict(gate.attributes or {})["capgate.decision.id"] == verdict.decision.id
    assert len(_children(spans, gate, telemetry.SPAN_ESTIMATE)) == 1


def test_the_async_path_nests_the_same_way(spans: InMemorySpanExporter) -> None:
    answers = itertools.cycle(["7", "7", "8"])

    @capgate.guard(policy=POLICY, estimator=KeywordEstimator(TABLE))
    async def ask(prompt: str) -> str:
        await asyncio.sleep(0)
        return next(answers)

    async def main() -> str:
        with _outer():
            return await ask("MID: 3 + 4?")

    assert asyncio.run(main()) == "7"
    (gate,) = _named(spans, telemetry.SPAN_GATE)
    assert len(_children(spans, gate, telemetry.SPAN_ESTIMATE)) == 1
    assert len(_children(spans, gate, telemetry.SPAN_ROUND)) >= 1


def test_an_estimator_error_is_recorded_on_the_spans(spans: InMemorySpanExporter) -> None:
    class Broken(KeywordEstimator):
        def estimate(self, queries: Any) -> Any:
            raise RuntimeError("estimator exploded")

    @capgate.guard(policy=POLICY, estimator=Broken(TABLE))
    def ask(prompt: str) -> str:
        return "x"

    assert ask("q").decision.degraded  # fail closed: the decision is degraded, the call not failed
    (gate,) = _named(spans, telemetry.SPAN_GATE)
    (estimate,) = _children(spans, gate, telemetry.SPAN_ESTIMATE)
    assert estimate.status.status_code == trace.StatusCode.ERROR
    assert "exploded" in (estimate.status.description or "")
    assert gate.status.status_code != trace.StatusCode.ERROR
    assert gate.attributes["capgate.degraded"] is True
    assert "RuntimeError: estimator exploded" in str(gate.attributes["capgate.degraded.reason"])


def test_gate_spans_nest_under_a_langchain_agent_run(spans: InMemorySpanExporter) -> None:
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import FakeListChatModel

    from capgate.adapters.agents.langchain import CapabilityGate

    agent = create_agent(
        FakeListChatModel(responses=["Paris."]),
        middleware=[CapabilityGate(policy=POLICY, estimator=KeywordEstimator(TABLE))],
    )
    with _outer() as caller:
        out = agent.invoke({"messages": [{"role": "user", "content": "Capital of France?"}]})
    assert out["messages"][-1].content == "Paris."
    (gate,) = _named(spans, telemetry.SPAN_GATE)
    assert gate.context.trace_id == caller.get_span_context().trace_id
    assert gate.parent is not None
    assert gate.parent.span_id == caller.get_span_context().span_id
    assert dict(gate.attributes or {})["capgate.action"] == "answer"


def test_gate_spans_nest_under_a_langgraph_run(spans: InMemorySpanExporter) -> None:
    from langchain_core.messages import AIMessage, HumanMessage

    from capgate.adapters.agents.langgraph import capability_subgraph

    def answer(state: Any) -> dict[str, Any]:
        return {"messages": [AIMessage("4")]}

    app = capability_subgraph(answer, policy=POLICY, estimator=KeywordEstimator(TABLE)).compile()
    with _outer() as caller:
        app.invoke({"messages": [HumanMessage("HARD: 2 + 2?")]})
    (gate,) = _named(spans, telemetry.SPAN_GATE)
    assert gate.context.trace_id == caller.get_span_context().trace_id
    assert dict(gate.attributes or {})["capgate.action"] == "abstain"


def test_without_opentelemetry_everything_works_and_nothing_is_traced() -> None:
    script = textwrap.dedent(
        """
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name == "opentelemetry" or name.startswith("opentelemetry."):
                    raise ImportError("opentelemetry is not installed here")
        sys.meta_path.insert(0, Block())
        import capgate
        from capgate import Estimate
        from capgate.gate import telemetry
        from capgate.estimators import CapabilityEstimator
        class Mid(CapabilityEstimator):
            method = "mid"
            def estimate(self, queries):
                return [Estimate(p=0.4, method=self.method) for _ in queries]
        policy = capgate.policies.Policy(
            name="t", on_degraded="abstain",
            bands=[
                {"below": 0.6, "action": "resample", "max_samples": 4, "batch_size": 2},
                {"action": "answer"},
            ],
        )
        ask = capgate.guard(policy=policy, estimator=Mid())(lambda prompt: "4")
        assert ask("2 + 2?") == "4"
        assert not telemetry.enabled()
        assert not any(m.startswith("opentelemetry") for m in sys.modules), sorted(sys.modules)
        print("ok", ask.stats.samples)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    word, samples = done.stdout.split()
    assert word == "ok"
    assert 2 <= int(samples) <= 4


class _Receiver(BaseHTTPRequestHandler):
    """A minimal OTLP/HTTP trace receiver: decodes each POST /v1/traces body (protobuf)."""

    received: ClassVar[list[Any]] = []

    def do_POST(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path != "/v1/traces" or self.headers["Content-Type"] != "application/x-protobuf":
            self.send_response(404)
            self.end_headers()
            return
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        type(self).received.append(request)
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_decisions_export_over_otlp_http_to_a_local_receiver() -> None:
    _Receiver.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_address[1]
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(ROOT / "tests")!r})
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        provider = TracerProvider(resource=Resource.create({{"service.name": "capgate-test"}}))
        provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint="http://127.0.0.1:{port}/v1/traces"))
        )
        trace.set_tracer_provider(provider)
        import capgate
        from _estimators import KeywordEstimator
        from capgate.policies import Policy
        policy = Policy(name="otlp", bands=0.5, on_degraded="abstain")
        ask = capgate.guard(policy=policy, estimator=KeywordEstimator({{"HARD": 0.2}}), target="m")(
            lambda prompt: "fine"
        )
        ask("easy")
        ask("HARD")
        provider.shutdown()  # flushes the batch to the receiver
        print(ask.stats.last_decision.id)
        """
    )
    try:
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 0, done.stderr
    last_id = done.stdout.strip()
    spans = [
        span
        for request in _Receiver.received
        for resource in request.resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
    ]
    gates = [s for s in spans if s.name == telemetry.SPAN_GATE]
    assert len(gates) == 2
    attrs = [{a.key: a.value for a in s.attributes} for s in gates]
    assert sorted(a["capgate.action"].string_value for a in attrs) == ["abstain", "answer"]
    assert last_id in {a["capgate.decision.id"].string_value for a in attrs}
    assert {a["gen_ai.request.model"].string_value for a in attrs} == {"m"}
    estimates = [s for s in spans if s.name == telemetry.SPAN_ESTIMATE]
    assert {s.parent_span_id for s in estimates} == {s.span_id for s in gates}
    services = {
        a.value.string_value
        for request in _Receiver.received
        for resource in request.resource_spans
        for a in resource.resource.attributes
        if a.key == "service.name"
    }
    assert services == {"capgate-test"}


def test_a_route_decision_records_its_choice_and_each_choice_estimate(spans: InMemorySpanExporter) -> None:
    policy = Policy.model_validate(
        {
            "name": "router",
            "bands": [{"below": 0.8, "action": "route", "choices": ["small", "large"]}, {"action": "answer"}],
            "on_degraded": "abstain",
        }
    )
    routes = {"small": KeywordEstimator({}, default=0.5), "large": KeywordEstimator({}, default=0.9)}

    @capgate.guard(policy=policy, estimator=KeywordEstimator({}, default=0.3), routes=routes)
    def ask(prompt: str, route: str = "") -> str:
        return route

    assert ask("q") == "large"
    (gate,) = _named(spans, telemetry.SPAN_GATE)
    assert dict(gate.attributes or {})["capgate.route"] == "large"
    ps = sorted(
        dict(s.attributes or {})["capgate.p"] for s in _children(spans, gate, telemetry.SPAN_ESTIMATE)
    )
    assert ps == pytest.approx([0.3, 0.5, 0.9])  # the gate's estimate, then each choice's


def test_a_decision_span_names_its_calibration_version_and_shadow_mode() -> None:
    """A span says under which learnt calibration (capgate calibrate) a decision was made."""

    class Span:
        def __init__(self) -> None:
            self.attributes: dict[str, Any] = {}

        def is_recording(self) -> bool:
            return True

        def set_attributes(self, values: dict[str, Any]) -> None:
            self.attributes = {**self.attributes, **values}

    estimate = Estimate(p=0.8, method="probe")
    made = Decision(action="answer", estimate=estimate, reason="r", calibration="cal-0123", shadow=True)
    span = Span()
    telemetry.record_decision(span, made)
    assert span.attributes["capgate.calibration"] == "cal-0123"
    assert span.attributes["capgate.shadow"] is True
    plain = Span()
    telemetry.record_decision(plain, made.model_copy(update={"calibration": None, "shadow": False}))
    assert "capgate.calibration" not in plain.attributes
    assert "capgate.shadow" not in plain.attributes


def test_the_probes_fast_path_choice_is_on_the_estimate_the_log_and_the_spans(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    """An automatic choice is on the record: load_estimator's dtype choice (what it measured,
    against which threshold) rides in every estimate's details, the logged decision and both
    spans, so two processes that chose differently near the threshold can be told apart."""
    import numpy as np

    from capgate.estimators import LinearProbe, ProbeEstimator

    class Lengths:
        spec: ClassVar[dict[str, object]] = {"model_id": "toy", "weights_fingerprint": "0", "dim": 2}

        def transform(self, queries: list[str]) -> Any:
            return np.array([[len(q), len(q) % 7] for q in queries], dtype=np.float32)

    choice = {
        "dtype": "float32",
        "chosen_by": "auto",
        "checked_fast_paths": ["bfloat16"],
        "native_bf16": True,
        "bf16_speedup": 1.21,
        "bf16_threshold": 1.25,
    }
    queries = [f"q{'?' * i}" for i in range(40)]
    estimator = ProbeEstimator(
        Lengths(), LinearProbe(lr=0.05, validation_fraction=None, max_epochs=5), fast_path=choice
    ).fit(queries, np.array([1.0 if len(q) < 20 else 0.0 for q in queries]))
    log = DecisionLog(tmp_path / "log.sqlite3")

    @capgate.guard(policy="balanced", estimator=estimator, log=log)
    def ask(prompt: str) -> str:
        return "4"

    ask("q?")
    (logged,) = log.decisions()
    assert logged.decision.estimate.details["fast_path"] == choice
    (gate,) = _named(spans, telemetry.SPAN_GATE)
    attrs = dict(gate.attributes or {})
    assert attrs["capgate.fast_path.dtype"] == "float32"
    assert attrs["capgate.fast_path.chosen_by"] == "auto"
    assert attrs["capgate.fast_path.bf16_speedup"] == 1.21
    assert attrs["capgate.fast_path.bf16_threshold"] == 1.25
    (estimate_span,) = _named(spans, telemetry.SPAN_ESTIMATE)
    assert dict(estimate_span.attributes or {})["capgate.fast_path.bf16_speedup"] == 1.21
    log.close()


def test_every_fast_path_attribute_is_listed_in_attributes() -> None:
    """ATTRIBUTES lists every attribute capgate sets, the four ``capgate.fast_path.*`` ones included."""
    record = {"dtype": "float32", "chosen_by": "auto", "bf16_speedup": 1.2, "bf16_threshold": 1.25}
    keys = set(telemetry._fast_path(Estimate(p=0.5, method="probe", details={"fast_path": record})))
    assert len(keys) == 4
    assert keys <= set(telemetry.ATTRIBUTES)
