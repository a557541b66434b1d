"""The OpenAI backend's failure policy without I/O: what to retry, how long to wait, what to say
(the policy itself is described in :mod:`capgate.adapters.backends.openai`)."""

from __future__ import annotations

import email.utils
import random
import time
from typing import Any

from tenacity import RetryCallState, retry_if_exception, stop_after_attempt

from capgate.adapters.backends._breaker import CircuitOpenError
from capgate.errors import BackendError

#: Status codes worth retrying besides 5xx: request time-out and rate limit.
RETRYABLE_STATUS = frozenset({408, 429})


def is_retryable(exc: BaseException) -> bool:
    """Whether an error from the openai SDK is transient: 429/408/5xx, a time-out, a lost connection.

    Other 4xx responses (bad request, authentication, not found...) are not: retrying cannot help.

    Examples:
        >>> is_retryable(ValueError("not an API error"))
        False
    """
    import openai

    if isinstance(exc, openai.APIConnectionError):  # includes APITimeoutError
        return True
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code in RETRYABLE_STATUS or exc.status_code >= 500
    return False


def worth_retrying(exc: BaseException) -> bool:
    """Transient errors, and a circuit breaker's refusal while another caller's trial is in flight."""
    return is_retryable(exc) or (isinstance(exc, CircuitOpenError) and exc.trial_in_flight)


def retry_after_s(exc: BaseException | None) -> float | None:
    """Seconds asked for by a ``Retry-After`` header on an HTTP error, if any."""
    headers = getattr(getattr(exc, "response", None), "headers", None)
    value = headers.get("retry-after") if headers is not None else None
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:  # an HTTP date
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, parsed.timestamp() - time.time())


def retry_settings(*, max_retries: int, backoff_initial: float, backoff_max: float) -> dict[str, Any]:
    """Keyword arguments of tenacity's ``Retrying`` / ``AsyncRetrying`` for one request."""

    def wait(state: RetryCallState) -> float:
        # Exponential back-off with jitter: initial * 2**(attempt-1), plus up to as much again.
        base = backoff_initial * 2.0 ** (state.attempt_number - 1)
        base += random.uniform(0.0, base)
        exc = state.outcome.exception() if state.outcome is not None else None
        asked = retry_after_s(exc)
        return min(max(base, asked or 0.0), backoff_max)

    return {
        "stop": stop_after_attempt(max_retries + 1),
        "wait": wait,
        "retry": retry_if_exception(worth_retrying),
        "reraise": True,
    }


def as_backend_error(exc: BaseException, attempts: int, *, where: str, timeout: float) -> BackendError:
    """``exc`` as a :class:`BackendError` naming the server ``where``, the status and the message."""
    if isinstance(exc, BackendError):
        return exc
    import openai

    retryable = is_retryable(exc)
    status: int | None = None
    if isinstance(exc, openai.APITimeoutError):
        msg = f"request to {where} timed out after {timeout:g}s"
    elif isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__ or exc
        msg = f"could not reach {where}: {type(cause).__name__}: {cause}"
    elif isinstance(exc, openai.APIStatusError):
        msg = f"HTTP {exc.status_code} from {where}: {exc.message}"
        status = exc.status_code
    elif isinstance(exc, ValueError):  # the body was not JSON (json.JSONDecodeError)
        msg = f"malformed response from {where}: {type(exc).__name__}: {exc}"
    else:
        msg = f"request to {where} failed: {type(exc).__name__}: {exc}"
    return BackendError(msg, attempts=attempts, retryable=retryable, status=status)


def outage(exc: BaseException, *, where: str, timeout: float) -> str | None:
    """What made a failed attempt an outage (unreachable, time-out, 5xx); None if it answered."""
    down = is_retryable(exc) and getattr(exc, "status_code", None) != 429
    return str(as_backend_error(exc, 1, where=where, timeout=timeout)) if down else None
