"""``@capgate.guard``: gate any function that asks an LLM, by the model's predicted capability.

Put it on a sync or async function whose argument is the prompt (a string or chat messages).
Before each call the gate estimates the capability for that prompt and its policy decides:

* ``answer``: the function runs as usual.
* ``resample``: the function runs repeatedly under CAS (each call is one sample), answers are
  grouped by ``extract`` and the policy's stop rule ends sampling; the call returns the value the
  function returned for the winning answer. A ``max_tokens`` cap counts the ``n_tokens`` of each
  returned :class:`~capgate.Generation` (other values count 0: warned once, the cap cannot hold).
* ``route``: the function runs with the chosen model choice as its ``route`` keyword argument
  (the cheapest choice of the gate's ``routes`` predicted to clear the edge, else the strongest);
  the function must take a ``route`` parameter (or ``**kwargs``).
* ``abstain`` / ``clarify`` / ``escalate``: the function does not run; the call returns a
  :class:`~capgate.gate.Gated` (decision, estimate, message) or, with ``on_block="raise"``,
  raises the matching :class:`~capgate.gate.GateBlocked` subclass.

The wrapped function keeps its name, docstring, signature and type hints (``functools.wraps``)
and exposes ``.gate`` (the :class:`~capgate.gate.Gate`) and ``.stats``. Per-call settings:
``fn.with_options(step="draft")(prompt)`` takes every setting :func:`guard` takes and shares the
gate's statistics and log (as :meth:`capgate.Gate.with_options`). The call's logic is one
I/O-free flow (:mod:`capgate.gate.flow`) driven by the sync or the async path.

The latest call's decision is :func:`last_decision`, so an outcome learned later attaches to the
logged decision without the return type changing: ``ask(q); capgate.last_decision().id``.

Examples:
    >>> import capgate
    >>> from capgate import Estimate
    >>> from capgate.estimators import CapabilityEstimator
    >>> class ByLength(CapabilityEstimator):
    ...     method = "by-length"
    ...     def estimate(self, queries):
    ...         return [Estimate(p=0.9 if len(q) < 20 else 0.1, method=self.method) for q in queries]
    >>> @capgate.guard(policy="balanced", estimator=ByLength())
    ... def ask(prompt: str) -> str:
    ...     '''Ask the model.'''
    ...     return "4"
    >>> ask("What is 2 + 2?")
    '4'
    >>> blocked = ask("What will the stock market do next year?")
    >>> blocked.action, ask.stats.actions["abstain"], ask.__doc__
    ('abstain', 1, 'Ask the model.')
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Literal, ParamSpec, Protocol, Required, TypedDict, TypeVar, Unpack, overload

from capgate.core.backend import Generation
from capgate.core.types import Decision
from capgate.errors import SettingsError
from capgate.gate import UNSET, Gate, Gated, GateOptions, GateStats, SharedOptions, Unset, Verdict
from capgate.gate.flow import Assess, Flow, Invoke, Record, Sample, Speculate, adrive, drive

__all__ = ["Guarded", "QueryArg", "guard", "last_decision"]

P = ParamSpec("P")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)

QueryArg = str | int | Callable[..., object]
"""Where the query is: a parameter name, a positional index, or a function called with the same
arguments as the guarded function that returns the prompt."""

_DEFAULT_QUERY_NAMES = ("prompt", "messages")
_LOG = logging.getLogger("capgate")

_LAST_DECISION: contextvars.ContextVar[Decision | None] = contextvars.ContextVar(
    "capgate_last_decision", default=None
)


def last_decision() -> Decision | None:
    """The decision of the latest guarded call made in this thread or asyncio task.

    Set as soon as a call's gate has decided (the guarded function can read it too) and kept after
    the call returns; ``None`` before any call, or after one that failed before its decision. Its
    ``id`` is the logged decision's, so an outcome learned later attaches to it:
    ``log.record_outcome(capgate.last_decision().id, correct=True, source="user")``; in shadow mode
    it is the stand-in ``answer`` decision, whose id the logged shadow decision takes. A context
    variable: calls in other threads or tasks never overwrite it, and calls run as separate tasks
    (``asyncio.gather(ask(a), ask(b))``) set it in their own tasks: read it inside the task.

    Examples:
        >>> import capgate
        >>> from capgate.estimators import ConstantPrior
        >>> @capgate.guard(policy="balanced", estimator=ConstantPrior.from_mean(0.95, n_train=1))
        ... def ask(prompt: str) -> str:
        ...     return "4"
        >>> ask("What is 2 + 2?"), capgate.last_decision().action
        ('4', 'answer')
    """
    return _LAST_DECISION.get()


class Guarded(Protocol[P, R_co]):
    """A guarded function: call it like the original; it also exposes its gate."""

    gate: Gate
    __wrapped__: Callable[..., Any]

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R_co: ...

    @property
    def stats(self) -> GateStats:
        """The gate's statistics (calls, actions counted, last decision)."""
        ...

    def with_options(
        self, *, to_text: Callable[[Any], str] | Unset | None = UNSET, **settings: Unpack[GateOptions]
    ) -> Guarded[P, R_co]:
        """The same guarded function with some settings changed (shares the gate's stats and log)."""
        ...


class _GuardExtras(TypedDict, total=False):
    to_text: Callable[[Any], str] | None
    query_arg: QueryArg | None
    gate: Gate | None


class _RaisingOptions(SharedOptions, _GuardExtras, total=False):
    on_block: Required[Literal["raise"]]


class _ReturningOptions(SharedOptions, _GuardExtras, total=False):
    on_block: Literal["return"]


class _Decorator(Protocol):
    @overload
    def __call__(
        self, fn: Callable[P, Coroutine[Any, Any, R]], /
    ) -> Guarded[P, Coroutine[Any, Any, R | Gated]]: ...
    @overload
    def __call__(self, fn: Callable[P, R], /) -> Guarded[P, R | Gated]: ...


class _RaisingDecorator(Protocol):
    @overload
    def __call__(self, fn: Callable[P, Coroutine[Any, Any, R]], /) -> Guarded[P, Coroutine[Any, Any, R]]: ...
    @overload
    def __call__(self, fn: Callable[P, R], /) -> Guarded[P, R]: ...


class _Binder:
    """Finds the query among a call's arguments (pure logic, shared by the sync and async paths)."""

    def __init__(self, fn: Callable[..., Any], query_arg: QueryArg | None) -> None:
        self.fn_name = getattr(fn, "__qualname__", repr(fn))
        self.signature = inspect.signature(fn)
        params = list(self.signature.parameters.values())
        self.var_keyword = next((p.name for p in params if p.kind == p.VAR_KEYWORD), None)
        takes_kwargs = self.var_keyword is not None
        self.takes_route = "route" in self.signature.parameters or takes_kwargs
        self.tokens_warned = False  # an uncountable resample under max_tokens is warned once
        self.query_fn: Callable[..., object] | None = None
        self.name: str | None = None
        self.index: int | None = None
        if query_arg is None:
            chosen = next((n for n in _DEFAULT_QUERY_NAMES if n in self.signature.parameters), None)
            if chosen is None:
                positional = [
                    p.name
                    for p in params
                    if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                    and p.name not in ("self", "cls")
                ]
                if not positional:
                    raise ValueError(
                        f"guard cannot find the prompt of {self.fn_name}(): it has no 'prompt' or "
                        "'messages' parameter and no positional one; pass query_arg="
                    )
                chosen = positional[0]
            self.name = chosen
        elif isinstance(query_arg, str):
            if query_arg not in self.signature.parameters and not takes_kwargs:
                raise ValueError(
                    f"`query_arg` {query_arg!r} is not a parameter of {self.fn_name}(); its parameters: "
                    f"{', '.join(self.signature.parameters) or 'none'}"
                )
            self.name = query_arg
        elif isinstance(query_arg, int) and not isinstance(query_arg, bool):
            if query_arg < 0:
                raise ValueError(f"`query_arg` must be a non-negative position; got {query_arg}")
            self.index = query_arg
        elif callable(query_arg):
            self.query_fn = query_arg
        else:
            raise TypeError(
                f"`query_arg` must be a parameter name, an index or a function; got {query_arg!r}"
            )

    def query(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[object, str]:
        """The raw query value and a description of where it came from."""
        if self.query_fn is not None:
            return self.query_fn(*args, **kwargs), f"query_arg function of {self.fn_name}()"
        if self.index is not None:
            if self.index >= len(args):
                raise TypeError(
                    f"{self.fn_name}() got {len(args)} positional argument(s); the prompt is expected "
                    f"at position {self.index} (query_arg={self.index})"
                )
            return args[self.index], f"positional argument {self.index} of {self.fn_name}()"
        assert self.name is not None
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        where = f"argument {self.name!r} of {self.fn_name}()"
        if self.name in bound.arguments:
            return bound.arguments[self.name], where
        extra: Mapping[str, Any] = bound.arguments[self.var_keyword] if self.var_keyword else {}
        if self.name in extra:
            return extra[self.name], where
        raise TypeError(f"{self.fn_name}() was called without its prompt ({where})")


def _call_flow(
    gate: Gate,
    binder: _Binder,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    to_text: Callable[[Any], str] | None,
) -> Flow[Any]:
    """One guarded call, I/O-free: decide, then run, resample or block (sync and async alike)."""
    _LAST_DECISION.set(None)
    raw, where = binder.query(args, kwargs)
    call = answered = Invoke(lambda: fn(*args, **kwargs))
    if gate.settings.speculative and not gate.in_shadow():  # the call starts with its estimate
        verdict, answered = yield Speculate(Assess(gate, raw, where), call)
    else:
        verdict = yield Assess(gate, raw, where)
    _LAST_DECISION.set(verdict.decision)
    if verdict.action == "answer":
        yield Record(gate, verdict, samples_used=1)
        return (yield answered)  # speculative: the finished call's value, or its error raised
    if verdict.action == "route":
        route = verdict.decision.route
        yield Record(gate, verdict, samples_used=1)
        if not binder.takes_route:
            raise TypeError(
                f"the policy routed this call to model choice {route!r}, but {binder.fn_name}() has no "
                "`route` parameter to receive it; add one (route: str)"
            )
        return (yield Invoke(lambda: fn(*args, **{**kwargs, "route": route})))
    if verdict.action != "resample":
        yield Record(gate, verdict, samples_used=0)
        return gate.block(verdict)
    try:
        sampled = yield Sample(
            gate, verdict, call, to_text=to_text, count_tokens=_token_counter(binder, verdict)
        )
    except BaseException:
        yield Record(gate, verdict)
        raise
    yield Record(gate, verdict, cas=sampled.cas)
    return sampled.value if sampled.value is not None else gate.block(verdict, cas=sampled.cas)


def _token_counter(binder: _Binder, verdict: Verdict) -> Callable[[Any], int]:
    """A drawn value's tokens: a returned :class:`~capgate.Generation`'s ``n_tokens``, else 0 (unknown,
    warned once per function when the policy caps a resample's tokens: the cap cannot hold)."""
    plan = verdict.decision.plan
    cap = plan.stop.max_tokens if plan is not None else None

    def count(value: Any) -> int:
        if isinstance(value, Generation):
            return value.n_tokens
        if cap is not None and not binder.tokens_warned:
            binder.tokens_warned = True
            _LOG.warning(
                "%s() returned a %s, whose tokens capgate cannot count: the policy's max_tokens=%d "
                "cap does not hold; return a capgate Generation (with n_tokens) to count them",
                binder.fn_name,
                type(value).__name__,
                cap,
            )
        return 0

    return count


def _has_async_call(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` is an object whose ``__call__`` is a coroutine function (a class is not)."""
    return inspect.iscoroutinefunction(type(fn).__call__)


def _wrap(fn: Callable[..., Any], gate: Gate, binder: _Binder, to_text: Callable[[Any], str] | None) -> Any:
    if inspect.iscoroutinefunction(fn) or _has_async_call(fn):

        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            return await adrive(_call_flow(gate, binder, fn, args, kwargs, to_text))

        wrapper: Any = async_wrapper
    else:

        @functools.wraps(fn)
        def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
            return drive(_call_flow(gate, binder, fn, args, kwargs, to_text))

        wrapper = sync_wrapper

    def with_options(*, to_text: Callable[[Any], str] | Unset | None = UNSET, **settings: Any) -> Any:
        text = wrapper.to_text if to_text is UNSET else _checked_to_text(to_text)
        return _wrap(fn, gate.with_options(**settings), binder, text)

    wrapper.gate = gate
    wrapper.with_options = with_options
    wrapper.stats = gate.stats
    wrapper.to_text = to_text
    return wrapper


def _checked_to_text(to_text: object) -> Callable[[Any], str] | None:
    if to_text is not None and not callable(to_text):
        raise SettingsError(f"`to_text` must be a function value -> str; got {to_text!r}")
    return to_text


@overload
def guard(fn: Callable[P, Coroutine[Any, Any, R]], /) -> Guarded[P, Coroutine[Any, Any, R | Gated]]: ...
@overload
def guard(fn: Callable[P, R], /) -> Guarded[P, R | Gated]: ...
@overload
def guard(**options: Unpack[_RaisingOptions]) -> _RaisingDecorator: ...
@overload
def guard(**options: Unpack[_ReturningOptions]) -> _Decorator: ...
def guard(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    to_text: Callable[[Any], str] | None = None,
    query_arg: QueryArg | None = None,
    gate: Gate | None = None,
    **settings: Unpack[GateOptions],
) -> Any:
    """Gate a function that asks an LLM by the model's predicted capability on its prompt.

    Use bare (``@guard``, with the default policy ``"balanced"`` and the estimator set by
    :func:`capgate.gate.set_default_estimator`) or called (``@guard(policy=..., estimator=...)``).
    Coroutine functions (and objects whose ``__call__`` is one) get the async path (``aestimate``,
    concurrent resampling).

    Args:
        fn: The function (when used bare).
        to_text: Reads the function's return value as text for voting (default: a string, or its
            ``content`` / ``text`` attribute).
        query_arg: Where the prompt is (default: the ``prompt`` or ``messages`` parameter, else the
            first positional one).
        gate: A ready :class:`~capgate.gate.Gate` to share between functions (then give none of
            the gate settings below).
        **settings: The gate settings, each declared once in :class:`~capgate.GateSettings`
            (``policy``, default ``"balanced"``; ``estimator``, default the process-wide one;
            ``on_block``: ``"return"`` a :class:`~capgate.gate.Gated` or ``"raise"`` a
            :class:`~capgate.gate.GateBlocked`; ``log``, ``mode`` and the rest).

    Returns:
        The guarded function, or a decorator when called without ``fn``.

    Raises:
        SettingsError: A bad setting (named), or ``gate`` together with gate settings.
        ValueError: A prompt parameter that cannot be found.
    """
    the_gate = Gate.coerce(gate, **settings)
    text = _checked_to_text(to_text)

    def decorate(func: Callable[..., Any]) -> Any:
        if not callable(func):
            raise TypeError(f"guard decorates a function; got {func!r}")
        return _wrap(func, the_gate, _Binder(func, query_arg), text)

    return decorate if fn is None else decorate(fn)
