"""The interface every capability estimator implements."""

from __future__ import annotations

import asyncio
import inspect
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar, TypeVar

from capgate.core.backend import ChatMessage, Prompt, as_messages
from capgate.core.types import Estimate

__all__ = ["CapabilityEstimator", "Params", "clone", "query_text"]

_EstimatorT = TypeVar("_EstimatorT")


def query_text(query: Prompt) -> str:
    """The text of the last user turn of a query (the question being asked)."""
    messages: list[ChatMessage] = as_messages(query)
    for message in reversed(messages):
        if message["role"] == "user":
            return message["content"]
    return messages[-1]["content"] if messages else ""


class Params:
    """``get_params``, ``set_params`` and ``repr`` derived from the constructor (scikit-learn's way):
    a setting is a constructor argument stored under its own name, so that
    ``type(e)(**e.get_params(deep=False))`` builds a copy of ``e`` with the same settings (unfitted
    once the parts its ``fit`` learns are copied too: :func:`clone`); the repr shows the arguments
    that differ from their defaults.

    Examples:
        >>> from capgate.estimators import LinearProbe
        >>> probe = LinearProbe(lr=0.1)
        >>> probe, probe.get_params()["lr"]
        (LinearProbe(lr=0.1), 0.1)
    """

    #: The settings holding a part that ``fit`` fits (a calibrator, a probe): :func:`clone` copies
    #: them; it shares every other setting (a fitted base estimator, a featurizer and its model).
    _fitted_parts: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def _param_defaults(cls) -> dict[str, Any]:
        """Each constructor argument and its default (``inspect.Parameter.empty`` when required)."""
        if cls.__init__ is object.__init__:
            return {}
        parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
        if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in parameters):
            raise TypeError(f"{cls.__name__}.__init__ must name its settings; *args/**kwargs are not allowed")
        return {p.name: p.default for p in parameters}

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The constructor settings; with ``deep``, also ``part__setting`` of nested estimators."""
        params: dict[str, Any] = {}
        for name in self._param_defaults():
            if not hasattr(self, name):
                msg = f"{type(self).__name__} takes `{name}` but does not store it as self.{name}"
                raise AttributeError(msg)
            value = getattr(self, name)
            params[name] = value
            if deep and isinstance(value, Params):
                params.update((f"{name}__{k}", v) for k, v in value.get_params().items())
        return params

    def set_params(self, **params: Any) -> Any:
        """Change settings (``part__setting`` reaches a nested estimator), checked as the
        constructor checks them; what it derives from them (a ``method`` name) follows. Returns ``self``."""
        own: dict[str, Any] = {}
        nested: dict[str, dict[str, Any]] = {}
        valid = self._param_defaults()
        for key, value in params.items():
            name, _, sub = key.partition("__")
            if name not in valid:
                raise ValueError(
                    f"`{name}` is not a setting of {type(self).__name__}; it has {sorted(valid)}"
                )
            if sub:
                nested.setdefault(name, {})[sub] = value
            else:
                own[name] = value
        if own:
            checked = type(self)(**{**self.get_params(deep=False), **own})
            for name, value in vars(checked).items():  # learned state it leaves unset (None) is kept
                if name in own or value is not None:
                    setattr(self, name, value)
        for name, sub_params in nested.items():
            getattr(self, name).set_params(**sub_params)
        return self

    def __repr__(self) -> str:
        try:  # a subclass that does not store its settings by name keeps the default repr
            params, defaults = self.get_params(deep=False), self._param_defaults()
        except (AttributeError, TypeError):
            return object.__repr__(self)
        shown = [
            f"{name}={value!r}"
            for name, value in params.items()
            if defaults[name] is inspect.Parameter.empty or _differs(value, defaults[name])
        ]
        return f"{type(self).__name__}({', '.join(shown)})"


def clone(estimator: _EstimatorT) -> _EstimatorT:
    """An unfitted copy of ``estimator`` with its settings (scikit-learn's ``clone``):
    ``type(e)(**e.get_params(deep=False))``, with each part its ``fit`` fits (the settings its class
    names in ``_fitted_parts``) cloned in turn. Every other setting is the same object, never copied:
    a :class:`~capgate.estimators.Recalibrated`'s fitted base estimator, a featurizer and its model.

    Examples:
        >>> from capgate.estimators import IsotonicCalibrator, Recalibrated, UniformRandom
        >>> fitted = Recalibrated(UniformRandom(), IsotonicCalibrator()).fit(["a", "b"], [0.2, 0.8])
        >>> copy = clone(fitted)
        >>> copy.estimator is fitted.estimator, copy.calibrator is fitted.calibrator
        (True, False)
        >>> copy.calibrator.X_thresholds_ is None, fitted.calibrator.X_thresholds_ is None
        (True, False)
    """
    params: dict[str, Any] = estimator.get_params(deep=False)  # type: ignore[attr-defined]
    for name in getattr(type(estimator), "_fitted_parts", ()):
        params[name] = clone(params[name])
    return type(estimator)(**params)


def _differs(value: Any, default: Any) -> bool:
    if value is default:
        return False
    try:
        return not bool(value == default)
    except (TypeError, ValueError):  # an array compared element-wise
        return True


class CapabilityEstimator(Params, ABC):
    """Predicts the capability µ(x) for queries.

    Subclasses implement :meth:`estimate` (batched). :meth:`aestimate` runs it in a worker
    thread by default; I/O-bound estimators override it with a native async path.
    An estimator never raises for a single bad query: it returns a degraded
    :class:`~capgate.Estimate` naming the reason, and raises only for misuse
    (wrong types, an unfitted model).
    """

    #: Short name recorded in every Estimate this estimator returns.
    method: str = "estimator"

    @property
    def target_model(self) -> str | None:
        """The model whose capability this estimator predicts, when it knows (a probe records it
        from its labels); ``None`` means "whatever model it is asked about"."""
        return None

    @abstractmethod
    def estimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
        """Estimate capability for each query; ``result[i]`` belongs to ``queries[i]``."""

    async def aestimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
        """Async twin of :meth:`estimate`."""
        return await asyncio.to_thread(self.estimate, queries)

    @property
    def thread_safe_estimate(self) -> bool:
        """Whether :meth:`estimate` may stand in for :meth:`aestimate` in worker threads while the
        caller's event loop runs (an async shadow decision then runs off that loop): True when
        :meth:`aestimate` is the default; else ``False`` unless the estimator says so itself, since
        its client may be bound to the caller's loop.
        """
        return type(self).aestimate is CapabilityEstimator.aestimate

    def estimate_one(self, query: Prompt) -> Estimate:
        """Estimate capability for a single query."""
        return self.estimate([query])[0]
