"""Exceptions raised by capgate.

Every error that concerns user input names *where* the problem is (file, line, field) and
*what* was expected versus what was found, so that a bad row can be fixed without guessing.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "BackendError",
    "CapgateError",
    "DataError",
    "LogUnavailableError",
    "MessageError",
    "MissingExtraError",
    "NotFittedError",
    "ProbeMismatchError",
    "SettingsError",
]


class CapgateError(Exception):
    """Base class of every error capgate raises on purpose."""


class DataError(CapgateError, ValueError):
    """Bad input data, located by file, line and field.

    Args:
        message: What is wrong, including what was expected and what was got.
        path: The file the data came from, if any.
        line: 1-based line number within ``path``, if known.
        field: The field (column, key) at fault, if known.

    Examples:
        >>> str(DataError("must be in [0, 1]; got 1.5", path="x.jsonl", line=3, field="p"))
        "x.jsonl:3: field 'p': must be in [0, 1]; got 1.5"
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | Path | None = None,
        line: int | None = None,
        field: str | None = None,
    ) -> None:
        self.message = message
        self.path = None if path is None else str(path)
        self.line = line
        self.field = field
        super().__init__(self._render())

    def _render(self) -> str:
        where = "" if self.line is None else f"line {self.line}"
        if self.path is not None:
            where = self.path if self.line is None else f"{self.path}:{self.line}"
        parts = [p for p in (where, f"field {self.field!r}" if self.field else "") if p]
        return ": ".join([*parts, self.message])


class MessageError(CapgateError, TypeError):
    """A prompt or chat message list is malformed; the message says where (``query, message 2``).
    A ``TypeError`` too, as a wrong type given to any Python function is."""


class NotFittedError(CapgateError, AttributeError):
    """An estimator was used before ``fit`` (scikit-learn's contract)."""

    def __init__(self, estimator: object) -> None:
        name = type(estimator).__name__
        super().__init__(f"This {name} instance is not fitted yet; call fit(X, y) before using it.")


class SettingsError(CapgateError, ValueError, TypeError):
    """A gate or integration setting (named in the message) has a wrong value or type, or conflicts
    with ``gate=``. Both a ``ValueError`` (what scikit-learn and LangChain raise for bad settings)
    and a ``TypeError`` (what Python raises for a wrong type), so callers catching either catch it.
    """


class ProbeMismatchError(CapgateError, ValueError):
    """A saved probe does not match the model or feature spec it is asked to serve."""


class BackendError(CapgateError, RuntimeError):
    """A model backend could not produce a generation (after any retries it makes). Estimators
    catch it and return a degraded :class:`~capgate.Estimate` naming it; code that calls a backend
    directly sees it raised.

    Args:
        message: What failed, including the last underlying error.
        attempts: How many attempts were made before giving up.
        retryable: Whether the last error was of a kind worth retrying (429, 5xx, timeout,
            connection) -- true means the retries ran out, false means it was not retried.
        status: The HTTP status of the last error, when a server answered with one.

    Examples:
        >>> str(BackendError("HTTP 500 from server", attempts=3, retryable=True))
        'HTTP 500 from server (after 3 attempts)'
    """

    def __init__(
        self, message: str, *, attempts: int = 1, retryable: bool = False, status: int | None = None
    ) -> None:
        self.message = message
        self.attempts = attempts
        self.retryable = retryable
        self.status = status
        suffix = f" (after {attempts} attempts)" if attempts > 1 else ""
        super().__init__(f"{message}{suffix}")


class LogUnavailableError(CapgateError, RuntimeError):
    """The decision log could not be written or read: its database is down, unreachable, locked
    beyond its wait, or did not answer within its time limit.

    A :class:`~capgate.Gate` logging a decision catches it: the decision is still returned, the
    failure counted in ``gate.stats.log_failures`` and logged as a warning, and the decision kept in
    the log's spill file (:mod:`capgate.decision.store.spill`); with ``fail_closed=True`` the gated
    call raises it instead.

    Args:
        message: What failed, including the underlying error.
        location: The log's file or (password-free) database URL.

    Examples:
        >>> str(LogUnavailableError("connection refused", location="postgresql://db.example/capgate"))
        'postgresql://db.example/capgate: decision log unavailable: connection refused'
    """

    def __init__(self, message: str, *, location: str) -> None:
        self.message = message
        self.location = location
        super().__init__(f"{location}: decision log unavailable: {message}")


class MissingExtraError(CapgateError, ModuleNotFoundError):
    """A feature needs an optional dependency that is not installed; the message names the extra.

    Examples:
        >>> str(MissingExtraError("local", ["torch"], "a local model"))
        "a local model needs torch, which is not installed: pip install 'capgate[local]'"
    """

    def __init__(self, extra: str, missing: list[str], what: str) -> None:
        super().__init__(
            f"{what} needs {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} not installed: "
            f"pip install 'capgate[{extra}]'"
        )
        self.extra = extra
        self.missing = missing
