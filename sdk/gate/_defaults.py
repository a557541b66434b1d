"""Process-wide defaults of a gate: the estimator bare ``@guard`` uses, and the answer extractor."""

from __future__ import annotations

from capgate.errors import SettingsError
from capgate.estimators.base import CapabilityEstimator

_default: list[CapabilityEstimator] = []


def set_default_estimator(estimator: CapabilityEstimator | None) -> None:
    """Set (or, with ``None``, clear) the estimator that gates built without one use.

    Raises:
        SettingsError: Not a capgate CapabilityEstimator.

    Examples:
        >>> set_default_estimator(None)
        >>> default_estimator() is None
        True
    """
    if estimator is not None and not isinstance(estimator, CapabilityEstimator):
        raise SettingsError(f"the default estimator must be a CapabilityEstimator; got {estimator!r}")
    _default[:] = [] if estimator is None else [estimator]


def default_estimator() -> CapabilityEstimator | None:
    """The estimator set by :func:`set_default_estimator`, if any."""
    return _default[0] if _default else None


def default_extract(text: str) -> str | None:
    """The default answer extractor for voting: the final-answer span, normalized.

    The last ``\\boxed{}``, else the text after "answer is" / "Answer:", else the first line;
    then lowercased with punctuation and articles dropped (:func:`capgate.grading.normalize_text`).

    Examples:
        >>> default_extract("Let me think.\\nThe answer is: **The Eiffel Tower**.")
        'eiffel tower'
    """
    from capgate.grading import final_answer_text, normalize_text

    span = final_answer_text(text)
    if span is None:
        return None
    return normalize_text(span) or None
