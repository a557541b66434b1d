"""OpenTelemetry traces of gate decisions (opt-in: ``pip install 'capgate[otel]'``).

With ``opentelemetry-api`` installed, every gate decision is a ``capgate.gate`` span, nested
under whatever span is current (a LangChain or LangGraph run's, a web request's), with a
``capgate.estimate`` child for the capability estimate and a ``capgate.resample.round`` child for
each batch a ``resample`` draws. capgate only uses the API: spans go wherever the application's
tracer provider sends them (the SDK and its exporters are the application's choice); with no
provider set they are non-recording and no attribute is computed. Without OpenTelemetry installed
every function here is a no-op.

Attributes follow the OpenTelemetry GenAI semantic conventions where one applies
(``gen_ai.request.model``, ``gen_ai.usage.input_tokens``, ``gen_ai.usage.output_tokens``) and are
``capgate.*`` otherwise (see :data:`ATTRIBUTES`). The query text is never put on a span unless the
gate's decision log keeps text (``DecisionLog(..., store_text=True)``).

Example:
    >>> from capgate import Estimate, Gate
    >>> from capgate.estimators import CapabilityEstimator
    >>> class Fixed(CapabilityEstimator):
    ...     method = "fixed"
    ...     def estimate(self, queries):
    ...         return [Estimate(p=0.9, method=self.method) for _ in queries]
    >>> Gate(policy="balanced", estimator=Fixed()).assess("2 + 2?").action  # traced if a provider is set
    'answer'
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from capgate.backend import Generation, Prompt, SamplingParams, as_messages

if TYPE_CHECKING:
    from capgate._types import Decision, Estimate
    from capgate.cas.loop import CASResult
    from capgate.gate._gate import Gate
    from capgate.gate._results import Verdict

__all__ = [
    "ATTRIBUTES",
    "SPAN_ESTIMATE",
    "SPAN_GATE",
    "SPAN_ROUND",
    "enabled",
]

SPAN_GATE = "capgate.gate"
"""The span of one gate decision (estimate, decide, and a resample's rounds, when there is one)."""
SPAN_ESTIMATE = "capgate.estimate"
"""The span of one call to the capability estimator."""
SPAN_ROUND = "capgate.resample.round"
"""The span of one batch drawn by a ``resample`` decision."""

ATTRIBUTES: dict[str, str] = {
    "gen_ai.request.model": "the model whose capability is predicted / that the call goes to",
    "gen_ai.usage.input_tokens": "tokens read by the estimator",
    "gen_ai.usage.output_tokens": "tokens generated (by the estimator, or by a resample's draws)",
    "capgate.decision.id": "the decision's id (as in the decision log)",
    "capgate.action": "the decided action",
    "capgate.reason": "the policy rule that fired",
    "capgate.p": "the predicted capability (absent when unavailable)",
    "capgate.estimator": "the estimate's method",
    "capgate.degraded": "whether the estimate was missing or weakened",
    "capgate.degraded.reason": "why, when degraded",
    "capgate.policy.name": "the deciding policy's name",
    "capgate.policy.version": "the deciding policy's format version",
    "capgate.step": "the agent step, if given",
    "capgate.tool": "the gated tool, if given",
    "capgate.route": "the model choice a route decision picked",
    "capgate.samples": "responses drawn for the decision",
    "capgate.samples.max": "a resample's budget",
    "capgate.stop_rule": "the stop rule (or cap) that ended a resample",
    "capgate.batches": "batches a resample drew",
    "capgate.round": "a resample round's index (0-based)",
    "capgate.batch_size": "queries estimated in one estimator call",
    "capgate.query": "the query as chat-messages JSON, only when the decision log stores text",
}
"""Every attribute capgate sets, with its meaning."""

_building: contextvars.ContextVar[bool] = contextvars.ContextVar("capgate_gate_span", default=False)


@functools.cache
def _trace() -> ModuleType | None:
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    return trace


def enabled() -> bool:
    """Whether ``opentelemetry-api`` is installed (spans are then made; recorded if a provider is set)."""
    return _trace() is not None


@functools.cache
def _version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("capgate")
    except metadata.PackageNotFoundError:
        return None


def _tracer() -> Any:
    trace = _trace()
    assert trace is not None
    return trace.get_tracer("capgate", _version())


def start(name: str) -> Any:
    """Start a span (a child of the current one), or ``None`` without OpenTelemetry."""
    if _trace() is None:
        return None
    return _tracer().start_span(name)


@contextlib.contextmanager
def current(span: Any, *, decision: bool = False) -> Iterator[None]:
    """Make ``span`` the current span (not ending it); ``decision``: it is a ``capgate.gate`` span
    being built, so :func:`decision_span` opens no other."""
    trace = _trace()
    if span is None or trace is None:
        yield
        return
    token = _building.set(decision)
    try:
        with trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
            yield
    finally:
        _building.reset(token)


def fail(span: Any, error: BaseException) -> None:
    """Record an error on a span (a :class:`~capgate.GateBlocked` or an interrupt is not one)."""
    if span is None or not span.is_recording() or not isinstance(error, Exception):
        return
    if type(error).__name__ in ("GraphInterrupt", "GraphBubbleUp") or _is_blocked(error):
        return
    from opentelemetry.trace import Status, StatusCode

    span.record_exception(error)
    span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))


def _is_blocked(error: BaseException) -> bool:
    from capgate.gate._results import GateBlocked

    return isinstance(error, GateBlocked)


def end(span: Any) -> None:
    """End a span (no-op for ``None``)."""
    if span is not None:
        span.end()


# --------------------------------------------------------------------------- attributes


def _set(span: Any, values: dict[str, Any]) -> None:
    span.set_attributes({k: v for k, v in values.items() if v is not None})


def _query_text(gate: Gate, query: Prompt) -> str | None:
    if gate.settings.log is None or not getattr(gate.log, "store_text", False):
        return None
    return json.dumps(as_messages(query), ensure_ascii=False)


def record_decision(span: Any, gate: Gate | None, decision: Decision, query: Prompt | None = None) -> None:
    """Put a decision's attributes on its ``capgate.gate`` span."""
    if span is None or not span.is_recording():
        return
    estimate = decision.estimate
    model = decision.target
    version: int | None = None
    if gate is not None:
        if model is None:
            model = _target_model(gate)
        version = gate.resolve_policy().version if decision.policy is not None else None
    _set(
        span,
        {
            "capgate.decision.id": decision.id,
            "capgate.action": decision.action,
            "capgate.reason": decision.reason,
            "capgate.p": estimate.p,
            "capgate.estimator": estimate.method,
            "capgate.degraded": decision.degraded,
            "capgate.degraded.reason": estimate.reason if estimate.degraded else None,
            "capgate.policy.name": decision.policy,
            "capgate.policy.version": version,
            "capgate.step": decision.step,
            "capgate.tool": decision.tool,
            "capgate.route": decision.route,
            "capgate.samples.max": decision.budget,
            "gen_ai.request.model": model,
            "capgate.query": _query_text(gate, query) if gate is not None and query is not None else None,
        },
    )


def _target_model(gate: Gate) -> str | None:
    try:
        return gate.resolve_estimator().target_model
    except Exception:  # no estimator: the decision itself failed and says so
        return None


def record_verdict(span: Any, gate: Gate, verdict: Verdict) -> None:
    """:func:`record_decision` for a verdict (its query goes on the span only with a text log)."""
    record_decision(span, gate, verdict.decision, verdict.query)


def record_sampling(span: Any, cas: CASResult | None = None, *, samples_used: int | None = None) -> None:
    """Put what a decision drew (a resample's run, or the samples its log records) on its span."""
    if span is None or not span.is_recording():
        return
    if cas is not None:
        _set(
            span,
            {
                "capgate.samples": cas.samples_used,
                "capgate.stop_rule": cas.stopped_by,
                "capgate.batches": cas.batches,
                "gen_ai.usage.output_tokens": cas.tokens,
            },
        )
    elif samples_used is not None:
        span.set_attribute("capgate.samples", samples_used)


def _record_estimates(span: Any, estimates: object, model: str | None) -> None:
    if span is None or not span.is_recording() or not isinstance(estimates, list):
        return
    from capgate._types import Estimate

    found = [e for e in estimates if isinstance(e, Estimate)]
    values: dict[str, Any] = {"gen_ai.request.model": model, "capgate.batch_size": len(estimates)}
    if found:
        values["gen_ai.usage.input_tokens"] = sum(e.cost.prompt_tokens for e in found)
        values["gen_ai.usage.output_tokens"] = sum(e.cost.completion_tokens for e in found)
        values["capgate.estimator"] = found[0].method
        values["capgate.degraded"] = any(e.degraded for e in found)
    if len(found) == 1:
        one: Estimate = found[0]
        values["capgate.p"] = one.p
        values["capgate.degraded.reason"] = one.reason if one.degraded else None
    _set(span, values)


class EstimateSpan:
    """The ``capgate.estimate`` span around one estimator call (:func:`estimate_span`)."""

    def __init__(self, span: Any, model: str | None) -> None:
        self.span = span
        self.model = model

    def record(self, estimates: object) -> None:
        """Put the estimates' attributes (p, method, degraded, tokens) on the span."""
        _record_estimates(self.span, estimates, self.model)


@contextlib.contextmanager
def estimate_span(model: str | None) -> Iterator[EstimateSpan]:
    """A ``capgate.estimate`` span (current while the estimator runs); errors are recorded on it."""
    span = start(SPAN_ESTIMATE)
    try:
        with current(span, decision=_building.get()):
            yield EstimateSpan(span, model)
    except BaseException as exc:
        fail(span, exc)
        raise
    finally:
        end(span)


@contextlib.contextmanager
def decision_span(gate: Gate) -> Iterator[Any]:
    """The ``capgate.gate`` span of a decision made outside a flow (a direct :meth:`Gate.assess`).

    Yields the new span, or ``None`` when a flow is already building this decision's span (or
    without OpenTelemetry); the caller records the decision on what it gets.
    """
    span = None if _building.get() else start(SPAN_GATE)
    try:
        with current(span, decision=True):
            yield span
    except BaseException as exc:
        fail(span, exc)
        raise
    finally:
        end(span)


# --------------------------------------------------------------------------- resample rounds


class _Rounds:
    """A backend whose every ``generate`` (one resample round) is a ``capgate.resample.round`` span."""

    def __init__(self, backend: Any, model: str | None) -> None:
        self.backend = backend
        self.model = model
        self.index = 0

    @contextlib.contextmanager
    def _round(self, params: SamplingParams) -> Iterator[Any]:
        span = _tracer().start_span(SPAN_ROUND)
        if span.is_recording():
            _set(span, {"capgate.round": self.index, "capgate.samples": params.n})
            _set(span, {"gen_ai.request.model": self.model})
        self.index += 1
        try:
            with current(span):
                yield span
        except BaseException as exc:
            fail(span, exc)
            raise
        finally:
            span.end()

    @staticmethod
    def _tokens(span: Any, rows: list[list[Generation]]) -> None:
        if span.is_recording():
            span.set_attribute("gen_ai.usage.output_tokens", sum(g.n_tokens for row in rows for g in row))

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Generation]]:
        with self._round(params) as span:
            rows: list[list[Generation]] = self.backend.generate(prompts, params)
            self._tokens(span, rows)
            return rows

    async def agenerate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Generation]]:
        with self._round(params) as span:
            rows: list[list[Generation]] = await self.backend.agenerate(prompts, params)
            self._tokens(span, rows)
            return rows


def traced_rounds(backend: Any, model: str | None = None) -> Any:
    """``backend`` with a span per ``generate`` call (itself, without OpenTelemetry)."""
    return backend if _trace() is None else _Rounds(backend, model)
