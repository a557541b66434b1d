"""The target of a probe: the model whose capability it predicts, and how its labels were made.

A probe has a *reader* (the local model whose hidden states are its features, in its feature
spec) and a *target* (the model whose capability µ it predicts, possibly the reader itself), whose
sampled labels µ̂ = correct / k (``capgate harvest``, settings in ``<labels>.meta.json``)
:meth:`ProbeTarget.from_harvest` reads; the fit stores it, and the gate refuses other models.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from capgate.core.backend import EndpointKind
from capgate.errors import DataError, ProbeMismatchError
from capgate.estimators._common import read_json

_IDENTITY = ("model", "endpoint", "temperature", "top_p", "max_tokens", "prompt", "grader")
"""The fields that make two targets different models-under-settings (``k`` and the dataset do
not: more samples of the same target on other questions are the same target)."""


class ProbeTarget(BaseModel):
    """The model a probe predicts the capability of, with the settings its labels were sampled at.

    Attributes:
        model: The target's model id or served model name (what its backend calls ``model_id``).
        endpoint: How it was reached (:data:`EndpointKind`).
        base_url: The server's base URL, for a remote target (never an API key).
        temperature: Sampling temperature of the labels.
        top_p: Nucleus mass of the labels.
        max_tokens: Token cap per sampled response.
        prompt: The prompt builder (template) the questions were put to the target with.
        grader: The grader that judged the responses.
        k: Responses sampled per query.
        dataset: What was harvested.

    Examples:
        >>> a = ProbeTarget(model="gpt-oss-20b", endpoint="openai", temperature=1.0)
        >>> b = a.model_copy(update={"temperature": 0.2})
        >>> a.differences(b)
        ['temperature: 1.0 here, 0.2 there']
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field(min_length=1)
    endpoint: EndpointKind = "other"
    base_url: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    prompt: str | None = None
    grader: str | None = None
    k: int | None = None
    dataset: str | None = None

    @classmethod
    def from_harvest_settings(cls, settings: Mapping[str, Any]) -> ProbeTarget:
        """The target recorded in a harvest's settings (the ``<labels>.meta.json`` object).

        Raises:
            DataError: The settings name no model.
        """
        model = settings.get("model_id")
        if not isinstance(model, str) or not model:
            raise DataError("the harvest settings name no model (field 'model_id')", field="model_id")
        endpoint = settings.get("endpoint", "other")
        recorded = ("base_url", "temperature", "top_p", "max_tokens", "prompt", "grader", "k", "dataset")
        return cls(
            model=model,
            endpoint=endpoint if endpoint in ("local", "openai", "vllm", "function") else "other",
            **{name: settings.get(name) for name in recorded},
        )

    @classmethod
    def from_harvest(cls, labels: str | Path) -> ProbeTarget | None:
        """The target of a labels file harvested by capgate (``None`` without a settings file).

        Raises:
            DataError: The settings file exists but is unreadable or names no model.
        """
        from capgate.labels.harvesting import meta_path

        path = meta_path(labels)
        if not path.is_file():
            return None
        settings = read_json(path, kind=None, what="harvest settings")
        try:
            return cls.from_harvest_settings(settings)
        except DataError as exc:
            raise DataError(exc.message, path=path, field=exc.field) from None
        except ValidationError as exc:
            raise DataError(f"harvest settings do not describe a target: {exc}", path=path) from None

    def differences(self, other: ProbeTarget) -> list[str]:
        """What makes ``other`` a different target: one ``"field: a here, b there"`` per field."""
        return [
            f"{name}: {getattr(self, name)!r} here, {getattr(other, name)!r} there"
            for name in _IDENTITY
            if getattr(self, name) != getattr(other, name)
        ]


def check_target_match(
    expected: ProbeTarget | None, got: ProbeTarget | None, *, what: str = "labels"
) -> None:
    """Refuse ``got`` (the target of some labels) when it is another target than ``expected``;
    unknown on either side (``None``) is not a mismatch.

    Raises:
        ProbeMismatchError: The two differ; the message names each differing field.
    """
    if expected is None or got is None:
        return
    differences = expected.differences(got)
    if differences:
        raise ProbeMismatchError(
            f"the {what} measure another target than the probe's ({'; '.join(differences)}, "
            "with 'here' the probe's target): harvest from the probe's target, or fit a probe on these labels"
        )
