"""A circuit breaker: stop calling a server that keeps failing, and say so.

After ``failures`` outage attempts in a row (unreachable, time-out, 5xx) the circuit *opens*:
every attempt fails at once with a :class:`BackendError` saying why and for how long, which
estimators turn into a degraded estimate. After ``cooldown_s`` one trial attempt goes through
(*half-open*): its success closes the circuit, its failure opens it again. Answers that show the
server alive (2xx, 4xx, 429) reset the count.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from capgate._util.validate import check_positive_int
from capgate.errors import BackendError


class CircuitOpenError(BackendError):
    """An attempt refused by an open circuit breaker (no request was sent).

    ``trial_in_flight`` is true when the cooldown is over and another caller's trial attempt is
    deciding whether the server is back: worth retrying after a short back-off, unlike a refusal
    during the cooldown (fail fast).
    """

    def __init__(self, message: str, *, trial_in_flight: bool) -> None:
        super().__init__(message, retryable=trial_in_flight)
        self.trial_in_flight = trial_in_flight


class CircuitBreaker:
    """Counts consecutive outage attempts toward one server; thread-safe, shared by sync and async.

    Args:
        failures: Consecutive outage attempts that open the circuit (>= 1).
        cooldown_s: Seconds the circuit stays open before a trial attempt (> 0).

    Examples:
        >>> breaker = CircuitBreaker(failures=2, cooldown_s=60)
        >>> breaker.failed("HTTP 500"); breaker.failed("HTTP 500"); breaker.is_open
        True
    """

    def __init__(self, *, failures: int = 5, cooldown_s: float = 10.0) -> None:
        self.failures = check_positive_int("failures", failures)
        if not cooldown_s > 0:
            raise ValueError(f"`cooldown_s` must be positive; got {cooldown_s!r}")
        self.cooldown_s = cooldown_s
        self._lock = threading.Lock()
        self._count = 0
        self._open_until: float | None = None
        self._trial_until: float | None = None
        self._last = ""
        self.opened = 0
        """How many times the circuit has opened."""
        self.refused = 0
        """How many attempts it has refused while open."""

    def __repr__(self) -> str:
        return f"CircuitBreaker(failures={self.failures}, cooldown_s={self.cooldown_s:g})"

    @property
    def is_open(self) -> bool:
        """Whether attempts are refused now (open, or half-open with its trial in flight)."""
        with self._lock:
            return self._open_until is not None and (
                time.monotonic() < self._open_until or self._trial_busy()
            )

    def _trial_busy(self) -> bool:
        return self._trial_until is not None and time.monotonic() < self._trial_until

    def admit(self, where: str) -> None:
        """Let an attempt toward ``where`` through, or refuse it.

        Raises:
            CircuitOpenError: The circuit is open (the message says until when), or half-open with
                another caller's trial in flight.
        """
        with self._lock:
            if self._open_until is None:
                return
            now = time.monotonic()
            if now >= self._open_until and not self._trial_busy():
                self._trial_until = now + self.cooldown_s  # half-open: this one attempt is the trial
                return
            self.refused += 1
            wait = max(self._open_until - now, 0.0)
            msg = (
                f"circuit open: {self._count} attempts in a row failed toward {where} "
                f"(last: {self._last}); not calling it for {wait:.1f}s more"
                if wait > 0
                else f"circuit open: a trial attempt toward {where} is in flight (last: {self._last})"
            )
        raise CircuitOpenError(msg, trial_in_flight=wait <= 0)

    def succeeded(self) -> None:
        """The server answered: close the circuit."""
        with self._lock:
            self._count, self._open_until, self._trial_until = 0, None, None

    def failed(self, why: str) -> None:
        """An attempt failed with an outage (``why`` is reported while the circuit is open)."""
        with self._lock:
            self._count += 1
            self._last = why
            trial = self._trial_until is not None
            if self._count >= self.failures or trial:
                if self._open_until is None or trial:
                    self.opened += 1
                self._open_until = time.monotonic() + self.cooldown_s
                self._trial_until = None

    @contextmanager
    def watch(self, where: str, outage: Callable[[BaseException], str | None]) -> Iterator[None]:
        """Admit one attempt toward ``where`` and record how it ends.

        ``outage(exc)`` says why a failure is an outage, or ``None`` when the server answered (a
        4xx, a 429, a malformed body): only outages count toward opening the circuit. An attempt
        cancelled (a caller's deadline) or interrupted says nothing either way: it counts as
        neither, and a trial it was frees its place for the next attempt.

        Raises:
            CircuitOpenError: The circuit is open.
        """
        self.admit(where)
        try:
            yield
        except Exception as exc:
            why = outage(exc)
            if why is None:
                self.succeeded()
            else:
                self.failed(why)
            raise
        except BaseException:
            with self._lock:
                self._trial_until = None
            raise
        self.succeeded()
