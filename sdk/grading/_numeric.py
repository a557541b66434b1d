"""Numeric final answers (GSM8K, arithmetic): the last ``\\boxed{}`` number, or else the last number."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction

from capgate._util.text import last_boxed
from capgate.datasets import DatasetItem
from capgate.grading._base import Grader

_FRAC = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_FRAC_SHORT = re.compile(r"\\[dt]?frac\s*(\d)\s*(\d)")
_WRAPPED = re.compile(r"\\(?:text|textbf|mathrm|mbox|operatorname)\s*\{([^{}]*)\}")
_NUMBER = re.compile(
    r"(?<![\w.])(?P<num>-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\.\d+)"
    r"(?:\s*/\s*(?P<den>\d+(?:\.\d+)?)(?![\d.]))?"
)
_ANSWER_CUE = re.compile(r"(?:answer\s*(?:is|:)|####)", re.IGNORECASE)


def _clean(text: str) -> str:
    """Strip what decorates a number: LaTeX fractions to ``a/b``, units in ``\\text{}``, ``$``, ``%``."""
    text = text.replace("−", "-").replace("–", "-")
    text = _FRAC.sub(r"(\1)/(\2)", text)
    text = _FRAC_SHORT.sub(r"\1/\2", text)
    text = _WRAPPED.sub(r" \1 ", text)
    text = text.replace("(", " ").replace(")", " ")
    for token in ("\\$", "$", "\\%", "%", "{,}", "\\!", "\\,", "\\;", "\\left", "\\right", "\\ ", "{", "}"):
        text = text.replace(token, "" if token in ("{,}", "\\!", "\\,") else " ")
    return re.sub(r"-\s+(?=[\d.])", "-", text)


def _numbers(text: str) -> list[Fraction]:
    values: list[Fraction] = []
    for match in _NUMBER.finditer(_clean(text)):
        try:
            value = Fraction(match.group("num").replace(",", ""))
            if match.group("den") is not None:
                value /= Fraction(match.group("den"))
        except (ValueError, ZeroDivisionError):  # a zero denominator: not a number
            continue
        values.append(value)
    return values


def _canonical(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    return format(float(value), ".12g")


def parse_number(text: str) -> float | None:
    """The number ``text`` states, if it states exactly one (``"$1,234.50"``, ``"\\frac{3}{4}"``, ``"25%"``).

    Examples:
        >>> parse_number("\\\\$1,234.50")
        1234.5
        >>> parse_number("3/4")
        0.75
        >>> parse_number("12 or 13") is None
        True
    """
    values = _numbers(text)
    return float(values[0]) if len(values) == 1 else None


@dataclass(kw_only=True, eq=False)
class NumericGrader(Grader):
    """Accepts a final number within a tolerance of a numeric reference.

    The final answer is the last number inside the last ``\\boxed{}``; without a box, the first
    number after the last "answer is" / "Answer:" / "####"; else the last number in the
    response. Thousands separators, ``$``, ``%``, units in ``\\text{}`` and ``\\frac{a}{b}``
    are understood (a percentage is compared as its number: "25%" is 25).

    Args:
        rel_tol: Relative tolerance (as :func:`math.isclose`).
        abs_tol: Absolute tolerance.

    Examples:
        >>> item = DatasetItem(id="q", question="How many dollars?", references=["18"], kind="numeric")
        >>> NumericGrader().judge("9 * 2 = 18, so she makes \\\\$18.00 a day.", item)
        Judgement(answer='18', correct=True)
    """

    kind = "numeric"
    rel_tol: float = 1e-6
    abs_tol: float = 1e-9

    def extract(self, response: str) -> str | None:
        boxed = last_boxed(response)
        if boxed is not None:
            values = _numbers(boxed)
            return _canonical(values[-1]) if values else None
        cues = list(_ANSWER_CUE.finditer(response))
        if cues:
            values = _numbers(response[cues[-1].end() :])
            if values:
                return _canonical(values[0])
        values = _numbers(response)
        return _canonical(values[-1]) if values else None

    def match(self, answer: str, item: DatasetItem) -> bool:
        value = float(Fraction(answer))
        for reference in item.references:
            target = parse_number(reference)
            if target is None:
                raise ValueError(f"numeric reference {reference!r} of item {item.id!r} is not one number")
            if math.isclose(value, target, rel_tol=self.rel_tol, abs_tol=self.abs_tol):
                return True
        return False
