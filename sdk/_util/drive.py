"""Sync and async twins driven from one I/O-free plan (the way httpx keeps its twins in step).

A *plan* is a generator that yields requests (what one call needs, such as ``(prompts, params)``),
receives the answer to each, and returns the result; it does everything but the I/O. :func:`drive` runs a plan
with a blocking call and :func:`adrive` with an awaitable one, so a public function and its async
twin differ only in which driver and which backend method they use.

:func:`twin_of` gives both public functions the parameters of the plan they drive, written once:
type checkers see them through a ``ParamSpec`` and ``inspect.signature`` / ``help()`` show them.

Examples:
    >>> def doubled(x: int, *, times: int = 2) -> Plan[list[str]]:
    ...     answers = yield [f"say {x}"], times
    ...     return answers
    >>> @twin_of(doubled)
    ... def run(backend: object, *args: Any, **kwargs: Any) -> list[str]:
    ...     return drive(doubled(*args, **kwargs), lambda request: request[0] * request[1])
    >>> run(None, 7)
    ['say 7', 'say 7']
    >>> str(inspect.signature(run))
    "(backend: 'object', x: 'int', *, times: 'int' = 2) -> 'list[str]'"
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Awaitable, Callable, Generator
from typing import Any, Concatenate, ParamSpec, TypeAlias, TypeVar

P = ParamSpec("P")
R = TypeVar("R")
B = TypeVar("B")

Plan: TypeAlias = Generator[Any, Any, R]
"""Yields each request (e.g. ``(prompts, params)``), receives its answer, returns the result."""


def twin_of(
    template: Callable[P, object],
) -> Callable[[Callable[Concatenate[B, ...], R]], Callable[Concatenate[B, P], R]]:
    """Give the decorated ``fn(backend, *args, **kwargs)`` the parameters of ``template`` after ``backend``.

    The function itself is returned (still a coroutine function when it is one, with its own
    docstring and examples); only its signature is taken from ``template``.
    """

    def decorate(fn: Callable[Concatenate[B, ...], R]) -> Callable[Concatenate[B, P], R]:
        own = inspect.signature(fn)
        backend = next(iter(own.parameters.values()))
        theirs = inspect.signature(template)
        fn.__signature__ = theirs.replace(  # type: ignore[attr-defined]
            parameters=[backend, *theirs.parameters.values()], return_annotation=own.return_annotation
        )
        return fn

    return decorate


def _attempt(call: Callable[[Any], Any], request: Any) -> tuple[Any, BaseException | None]:
    try:
        return call(request), None
    except BaseException as exc:  # handed to the plan, which re-raises what it does not handle
        return None, exc


async def _aattempt(call: Callable[[Any], Awaitable[Any]], request: Any) -> tuple[Any, BaseException | None]:
    try:
        return await call(request), None
    except BaseException as exc:  # handed to the plan, which re-raises what it does not handle
        return None, exc


def _resume(plan: Plan[Any], outcome: tuple[Any, BaseException | None]) -> Any:
    answer, error = outcome
    return plan.throw(error) if error is not None else plan.send(answer)


def drive(plan: Plan[R], call: Callable[[Any], Any]) -> R:
    """Run ``plan`` to its result, answering each request with ``call(request)``.

    An error raised by ``call`` is thrown into the plan at its ``yield``: the plan may handle it
    (log it, fall back) and go on, or let it propagate, its cleanup running at once.
    """
    with contextlib.closing(plan):
        try:
            request = next(plan)
            while True:
                request = _resume(plan, _attempt(call, request))
        except StopIteration as done:
            result: R = done.value
            return result


async def adrive(plan: Plan[R], call: Callable[[Any], Awaitable[Any]]) -> R:
    """Async twin of :func:`drive`: each request is answered with ``await call(request)``."""
    with contextlib.closing(plan):
        try:
            request = next(plan)
            while True:
                request = _resume(plan, await _aattempt(call, request))
        except StopIteration as done:
            result: R = done.value
            return result


def relay(plan: Plan[R], ask: Callable[[Any], Any], answer: Callable[[Any], Any]) -> Plan[R]:
    """``plan`` as part of a larger plan: yields ``ask(request)`` for each of its requests and sends
    it ``answer(reply)``; an error thrown in is thrown into ``plan``. Returns its result."""
    with contextlib.closing(plan):
        try:
            request = next(plan)
            while True:
                try:
                    reply = yield ask(request)
                except BaseException as exc:  # the inner plan may handle it, as under drive
                    request = plan.throw(exc)
                else:
                    request = plan.send(answer(reply))
        except StopIteration as done:
            result: R = done.value
            return result
