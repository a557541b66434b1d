"""OpenTelemetry traces of gate decisions (opt-in: ``pip install 'capgate[otel]'``).

With ``opentelemetry-api`` installed, every gate decision is a ``capgate.gate`` span, nested under
the current span (a LangGraph run's, a web request's), with a ``capgate.estimate`` child for the
estimate and a ``capgate.resample.round`` child for each batch a ``resample`` draws. capgate only
uses the API: spans go wherever the application's tracer provider sends them; with no provider
they are non-recording and no attribute is computed. Without OpenTelemetry every function here is
a no-op.

Attributes follow the OpenTelemetry GenAI semantic conventions where one applies
(``gen_ai.request.model``, ``gen_ai.usage.input_tokens``, ``gen_ai.usage.output_tokens``) and are
``capgate.*`` otherwise (see :data:`ATTRIBUTES`). The query text is never put on a span unless the
gate's decision log keeps text (``DecisionLog(..., store_text=True)``).

Examples:
    >>> from capgate import Gate
    >>> from capgate.estimators import ConstantPrior
    >>> likely = ConstantPrior.from_mean(0.9, n_train=1)  # predicts 0.9 for every query
    >>> Gate(policy="balanced", estimator=likely).assess("2 + 2?").action  # traced if a provider is set
    'answer'
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from capgate.core.backend import Generation, Prompt, as_messages
from capgate.core.types import Decision, Estimate

if TYPE_CHECKING:
    from capgate.cas.loop import CASResult

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
    "capgate.calibration": "the calibration version the decision was made under (capgate calibrate)",
    "capgate.shadow": "whether the decision was made beside the call, not acted on (shadow mode)",
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
    "capgate.fast_path.dtype": "the dtype the estimator's reader pass ran in (when it records one)",
    "capgate.fast_path.chosen_by": "what chose that dtype (the probe's recorded checks, or the caller)",
    "capgate.fast_path.bf16_speedup": "the bf16 speedup measured when the dtype was chosen",
    "capgate.fast_path.bf16_threshold": "the speedup bf16 had to reach to be chosen",
}
"""Every attribute capgate sets, with its meaning."""


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


def start(name: str) -> Any:
    """Start a span (a child of the current one), or ``None`` without OpenTelemetry."""
    trace = _trace()
    if trace is None:
        return None
    return trace.get_tracer("capgate", _version()).start_span(name)


@contextlib.contextmanager
def current(span: Any) -> Iterator[None]:
    """Make ``span`` the current span while the block runs (not ending it); ``None``: no change."""
    trace = _trace()
    if span is None or trace is None:
        yield
        return
    with trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
        yield


def fail(span: Any, error: BaseException) -> None:
    """Record an error on a span (a LangGraph interrupt is not one; the caller leaves out blocks)."""
    if span is None or not span.is_recording() or not isinstance(error, Exception):
        return
    if type(error).__name__ in ("GraphInterrupt", "GraphBubbleUp"):
        return
    from opentelemetry.trace import Status, StatusCode

    span.record_exception(error)
    span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))


def end(span: Any) -> None:
    """End a span (no-op for ``None``)."""
    if span is not None:
        span.end()


def _set(span: Any, values: dict[str, Any]) -> None:
    if span is not None and span.is_recording():
        span.set_attributes({k: v for k, v in values.items() if v is not None})


def _fast_path(estimate: Estimate) -> dict[str, Any]:
    """How the estimate's reader pass chose its dtype (``details["fast_path"]``), as attributes."""
    choice = estimate.details.get("fast_path")
    if not isinstance(choice, dict):
        return {}
    return {
        "capgate.fast_path.dtype": choice.get("dtype"),
        "capgate.fast_path.chosen_by": choice.get("chosen_by"),
        "capgate.fast_path.bf16_speedup": choice.get("bf16_speedup"),
        "capgate.fast_path.bf16_threshold": choice.get("bf16_threshold"),
    }


def record_decision(span: Any, decision: Decision, query: Prompt | None = None) -> None:
    """Put a decision's attributes on its ``capgate.gate`` span (``query`` only when the decision
    log keeps text: the caller decides)."""
    estimate = decision.estimate
    _set(
        span,
        {
            **_fast_path(estimate),
            "capgate.decision.id": decision.id,
            "capgate.action": decision.action,
            "capgate.reason": decision.reason,
            "capgate.p": estimate.p,
            "capgate.estimator": estimate.method,
            "capgate.degraded": decision.degraded,
            "capgate.degraded.reason": estimate.reason if estimate.degraded else None,
            "capgate.policy.name": decision.policy,
            "capgate.policy.version": decision.policy_version,
            "capgate.calibration": decision.calibration,
            "capgate.shadow": decision.shadow or None,
            "capgate.step": decision.step,
            "capgate.tool": decision.tool,
            "capgate.route": decision.route,
            "capgate.samples.max": decision.budget,
            "gen_ai.request.model": decision.target,
            "capgate.query": None if query is None else json.dumps(as_messages(query), ensure_ascii=False),
        },
    )


def record_sampling(span: Any, cas: CASResult | None = None, *, samples_used: int | None = None) -> None:
    """Put what a decision drew (a resample's run, or the samples its log records) on its span."""
    if cas is None:
        _set(span, {"capgate.samples": samples_used})
        return
    values = {
        "capgate.samples": cas.samples_used,
        "capgate.stop_rule": cas.stopped_by,
        "capgate.batches": cas.batches,
        "gen_ai.usage.output_tokens": cas.tokens,
    }
    _set(span, values)


def record_estimates(span: Any, estimates: object, model: str | None) -> None:
    """Put one estimator call's results (p, method, degraded, tokens) on its ``capgate.estimate`` span."""
    if not isinstance(estimates, list):
        return
    found = [e for e in estimates if isinstance(e, Estimate)]
    values: dict[str, Any] = {"gen_ai.request.model": model, "capgate.batch_size": len(estimates)}
    if found:
        values["gen_ai.usage.input_tokens"] = sum(e.cost.prompt_tokens for e in found)
        values["gen_ai.usage.output_tokens"] = sum(e.cost.completion_tokens for e in found)
        values["capgate.estimator"] = found[0].method
        values["capgate.degraded"] = any(e.degraded for e in found)
        values |= _fast_path(found[0])
    if len(found) == 1:
        values["capgate.p"] = found[0].p
        values["capgate.degraded.reason"] = found[0].reason if found[0].degraded else None
    _set(span, values)


def record_round(span: Any, index: int, n: int, model: str | None) -> None:
    """Put a resample round's index, size and model on its ``capgate.resample.round`` span."""
    _set(span, {"capgate.round": index, "capgate.samples": n, "gen_ai.request.model": model})


def record_drawn(span: Any, generations: Sequence[Generation]) -> None:
    """Put the tokens a resample round generated on its span."""
    _set(span, {"gen_ai.usage.output_tokens": sum(g.n_tokens for g in generations)})
