"""Graders: decide whether a sampled response answers a query correctly.

Every grader exposes ``extract(response) -> str | None`` (the normalized final answer; equal
strings are the same answer, which consistency estimators and CAS group by),
``grade(response, item) -> bool`` and ``judge(response, item) -> Judgement`` (both at once).
:func:`grader_for` picks the default grader of an item's answer kind.

Examples:
    >>> from capgate.datasets import DatasetItem
    >>> from capgate.grading import grader_for
    >>> item = DatasetItem(id="q", question="Janet's eggs?", references=["18"], kind="numeric")
    >>> grader_for(item).grade("She makes $18 every day.", item)
    True
"""

from capgate.grading._alias import AliasGrader, final_answer_text, normalize_text
from capgate.grading._base import Grader, GraderLike, Judgement
from capgate.grading._choice import ChoiceGrader
from capgate.grading._choose import FunctionGrader, as_grader, grader_for
from capgate.grading._math import MathGrader, normalize_latex
from capgate.grading._numeric import NumericGrader, parse_number

__all__ = [
    "AliasGrader",
    "ChoiceGrader",
    "FunctionGrader",
    "Grader",
    "GraderLike",
    "Judgement",
    "MathGrader",
    "NumericGrader",
    "as_grader",
    "final_answer_text",
    "grader_for",
    "normalize_latex",
    "normalize_text",
    "parse_number",
]
