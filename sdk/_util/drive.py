"""Sync and async twins driven from one I/O-free generator of steps (the way httpx keeps its
twins in step).

:data:`Steps` is a generator that yields requests (what one call needs, such as ``(prompts,
params)``), receives the answer to each, and returns the result; it does everything but the I/O.
:func:`drive` runs the steps with a blocking call and :func:`adrive` with an awaitable one, so a
public function and its async twin differ only in which driver and which backend method they use.

:func:`twin_of` gives both public functions the parameters of the steps they drive, written once:
type checkers see them through a ``ParamSpec`` and ``inspect.signature`` / ``help()`` show them.

Examples:
    >>> def doubled(x: int, *, times: int = 2) -> Steps[list[str]]:
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

Steps: TypeAlias = Generator[Any, Any, R]
"""Yields each request (e.g. ``(prompts, params)``), receives its answer, returns the result."""


def twin_of(
    template: Callable[P, object],
) -> Callable[[Callable[Concatenate[B, ...], R]], Callable[Concatenate[B, P], R]]:
    """Give the decorated ``fn(backend, *args, **kwargs)`` the parameters of ``template`` after
    ``backend``; only its signature changes (it stays a coroutine function if it is one)."""

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
    except BaseException as exc:  # handed to the steps, which re-raise what they do not handle
        return None, exc


async def _aattempt(call: Callable[[Any], Awaitable[Any]], request: Any) -> tuple[Any, BaseException | None]:
    try:
        return await call(request), None
    except BaseException as exc:  # handed to the steps, which re-raise what they do not handle
        return None, exc


class _EscapedError(Exception):
    """Carries a thrown ``StopIteration`` the steps let through (as PEP 479's ``RuntimeError``)."""

    def __init__(self, error: StopIteration) -> None:
        super().__init__(error)
        self.error = error


def _resume(steps: Steps[Any], outcome: tuple[Any, BaseException | None], thrown: list[StopIteration]) -> Any:
    """Send the answer into ``steps``, or throw the error in; a ``StopIteration`` thrown in (kept in
    ``thrown``) that the steps let through, now or later, comes out as :class:`_EscapedError`."""
    answer, error = outcome
    if isinstance(error, StopIteration):
        thrown.append(error)
    try:
        return steps.throw(error) if error is not None else steps.send(answer)
    except RuntimeError as exc:  # a generator turns a StopIteration passing through into this
        cause = exc.__cause__
        if isinstance(cause, StopIteration) and any(cause is e for e in thrown):
            raise _EscapedError(cause) from None
        raise


def drive(steps: Steps[R], call: Callable[[Any], Any]) -> R:
    """Run ``steps`` to its result, answering each request with ``call(request)``.

    An error raised by ``call`` is thrown into the steps at its ``yield``: they may handle it
    (log it, fall back) and go on, or let it propagate (a ``StopIteration`` too, not turned into a
    ``RuntimeError``), its cleanup running at once.
    """
    thrown: list[StopIteration] = []
    with contextlib.closing(steps):
        try:
            request = next(steps)
            while True:
                request = _resume(steps, _attempt(call, request), thrown)
        except (StopIteration, _EscapedError) as end:
            ended = end
    result: R = _result(ended)
    return result


async def adrive(steps: Steps[R], call: Callable[[Any], Awaitable[Any]]) -> R:
    """Async twin of :func:`drive`: each request is answered with ``await call(request)``."""
    thrown: list[StopIteration] = []
    with contextlib.closing(steps):
        try:
            request = next(steps)
            while True:
                request = _resume(steps, await _aattempt(call, request), thrown)
        except (StopIteration, _EscapedError) as end:
            ended = end
    result: R = _result(ended)
    return result


def _result(ended: StopIteration | _EscapedError) -> Any:
    """The steps' result; or the ``StopIteration`` they let through, raised as itself (outside any
    handler, so without the driver's error as its context)."""
    if isinstance(ended, _EscapedError):
        raise ended.error
    return ended.value


def relay(steps: Steps[R], ask: Callable[[Any], Any], answer: Callable[[Any], Any]) -> Steps[R]:
    """``steps`` as part of larger steps: yields ``ask(request)`` for each of its requests and sends
    it ``answer(reply)``; an error thrown in is thrown into ``steps``. Returns its result."""
    with contextlib.closing(steps):
        try:
            request = next(steps)
            while True:
                try:
                    reply = yield ask(request)
                except BaseException as exc:  # the inner steps may handle it, as under drive
                    request = steps.throw(exc)
                else:
                    request = steps.send(answer(reply))
        except StopIteration as done:
            result: R = done.value
            return result
