"""Competition-math answers (MATH): the last ``\\boxed{}``, compared as strings, then symbolically.

Symbolic equivalence uses `math-verify <https://github.com/huggingface/Math-Verify>`_
(``pip install 'capgate[data]'`` or ``capgate[local]``), imported on first use.
"""

from __future__ import annotations

import functools
import re
import threading
from dataclasses import dataclass
from typing import Any

from capgate._util.extras import import_extra
from capgate._util.text import last_boxed
from capgate.datasets import DatasetItem
from capgate.grading._base import Grader

_FINAL_ANSWER = re.compile(r"final answer is\s*\$(?P<answer>.+?)\$", re.IGNORECASE | re.DOTALL)
_TRAILING_UNITS = re.compile(r"^(?P<value>.*\S)\s*\\(?:text|mbox|mathrm)\s*\{\s*[a-zA-Z][a-zA-Z\s.]*\}$")
_WRAPPED = re.compile(r"\\(?:text|textbf|textrm|mbox|mathrm|mathbf)\s*\{([^{}]*)\}")
_ASSIGNMENT = re.compile(r"^[a-zA-Z]\s*=\s*(?P<value>[^=]+)$")
_THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")


def normalize_latex(answer: str) -> str:
    """Normalize a LaTeX final answer so that notational variants compare equal as strings.

    Drops ``\\left``/``\\right``, spacing commands, ``$``, ``%``, degree marks, trailing units in
    ``\\text{}``, a leading ``x =``, a final full stop and whitespace; unifies ``\\dfrac`` and
    ``\\tfrac`` with ``\\frac``; braces ``\\frac12`` and ``\\sqrt2``; drops thousands separators
    from a lone number; writes ``.5`` as ``0.5``. The result is still valid LaTeX.

    Examples:
        >>> normalize_latex("\\\\left( 3, \\\\dfrac{\\\\pi}{2} \\\\right)")
        '(3,\\\\frac{\\\\pi}{2})'
        >>> normalize_latex("x = 14{,}400")
        '14400'
    """
    s = answer.strip().rstrip(".").strip()
    units = _TRAILING_UNITS.match(s)
    if units:
        s = units.group("value")
    s = _WRAPPED.sub(r"\1", s)
    s = s.replace("\\displaystyle", "")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.replace("{,}", ",")
    for token in ("\\!", "\\,", "\\;", "\\:", "^{\\circ}", "^\\circ", "°", "\\$", "$", "\\%", "%"):
        s = s.replace(token, "")
    s = s.strip().rstrip(".").strip()
    assignment = _ASSIGNMENT.match(s)
    if assignment:
        s = assignment.group("value").strip()
    s = re.sub(r"\\frac\s*(\d)\s*(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac\s*\{([^{}]*)\}\s*(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac\s*(\d)\s*\{", r"\\frac{\1}{", s)
    s = re.sub(r"\\sqrt\s*([0-9a-zA-Z])", r"\\sqrt{\1}", s)
    s = re.sub(r"(?<![\d}])\.(\d)", r"0.\1", s)
    s = re.sub(r"(\\[a-zA-Z]+)\s+(?=[a-zA-Z])", r"\1{}", s)  # keep "\pi r" from becoming "\pir"
    s = re.sub(r"\s+", "", s)
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    return s


def _math_verify() -> Any:
    return import_extra(
        "math_verify", "data", "MathGrader(symbolic=True) (symbolic=False compares strings only)"
    )


@functools.lru_cache(maxsize=8192)
def _parse(latex: str, timeout_s: int | None) -> tuple[Any, ...]:
    mv = _math_verify()
    config = [mv.LatexExtractionConfig(), mv.ExprExtractionConfig()]
    return tuple(mv.parse(f"${latex}$", extraction_config=config, parsing_timeout=timeout_s))


@functools.lru_cache(maxsize=8192)
def _equivalent(reference: str, answer: str, timeout_s: int | None) -> bool:
    gold = _parse(reference, timeout_s)
    pred = _parse(answer, timeout_s)
    if not gold or not pred:
        return False
    return bool(_math_verify().verify(list(gold), list(pred), timeout_seconds=timeout_s))


@dataclass(kw_only=True, eq=False)
class MathGrader(Grader):
    """Accepts a final ``\\boxed{}`` answer equivalent to a LaTeX reference.

    The answer is the last ``\\boxed{}`` (braces nest), or Minerva's "The final answer is $X$".
    It is correct when its :func:`normalize_latex` form equals a reference's, or, with
    ``symbolic=True``, when math-verify finds the two mathematically equivalent (``0.5`` and
    ``\\frac12``, ``(x+1)^2`` and ``x^2+2x+1``, intervals, sets, matrices).

    math-verify bounds each parse and comparison with ``timeout_s`` via ``SIGALRM``; that works
    only in the main thread, so off the main thread comparisons run unbounded and answers longer
    than ``max_symbolic_chars`` are compared as strings only.

    Args:
        symbolic: Use math-verify for equivalence (needs the ``math-verify`` package).
        timeout_s: Seconds allowed per symbolic parse or comparison (main thread only).
        max_symbolic_chars: Longer answers skip the symbolic check.

    Examples:
        >>> item = DatasetItem(id="q", question="Simplify 2/4.", references=["\\\\frac{1}{2}"], kind="math")
        >>> MathGrader(symbolic=False).judge("So it is $\\\\boxed{\\\\dfrac12}$.", item)
        Judgement(answer='\\\\frac{1}{2}', correct=True)
    """

    kind = "math"
    symbolic: bool = True
    timeout_s: int = 5
    max_symbolic_chars: int = 500

    def extract(self, response: str) -> str | None:
        boxed = last_boxed(response)
        if boxed is None:
            finals = _FINAL_ANSWER.findall(response)
            boxed = finals[-1] if finals else None
        if boxed is None:
            return None
        return normalize_latex(boxed) or None

    def match(self, answer: str, item: DatasetItem) -> bool:
        references = [normalize_latex(ref) for ref in item.references]
        if answer in references:
            return True
        if not self.symbolic:
            return False
        main = threading.current_thread() is threading.main_thread()
        if not main and len(answer) > self.max_symbolic_chars:
            return False
        timeout = self.timeout_s if main else None
        return any(_equivalent(ref, answer, timeout) for ref in references)
