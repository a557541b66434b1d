"""The grader interface: extract a response's final answer, then judge it against an item."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

from capgate.datasets import DatasetItem


@dataclass(frozen=True)
class Judgement:
    """A graded response.

    Attributes:
        answer: The extracted, normalized final answer (``None`` when none was found). Equal
            strings mean the same answer, so consistency estimators and CAS group samples by it.
        correct: Whether the grader accepted the response.
    """

    answer: str | None
    correct: bool


class Grader(ABC):
    """Decides whether a response answers an item correctly.

    Subclasses implement :meth:`extract` (response → normalized final answer) and :meth:`match`
    (normalized answer × item → correct?). :meth:`judge` returns both; :meth:`grade` and calling
    the grader return only the verdict. Graders never raise on an odd response (they judge it
    wrong); they raise on a malformed *item* (say, a numeric reference that is not a number).
    """

    #: The answer kind this grader handles by default (see :func:`grader_for`).
    kind: str = "custom"

    @abstractmethod
    def extract(self, response: str) -> str | None:
        """The normalized final answer of ``response``, or ``None`` if it gives none."""

    @abstractmethod
    def match(self, answer: str, item: DatasetItem) -> bool:
        """Whether an extracted answer is correct for ``item``."""

    def judge(self, response: str, item: DatasetItem) -> Judgement:
        """Extract the answer and grade it."""
        answer = self.extract(response)
        return Judgement(answer=answer, correct=answer is not None and self.match(answer, item))

    def grade(self, response: str, item: DatasetItem) -> bool:
        """Whether ``response`` answers ``item`` correctly."""
        return self.judge(response, item).correct

    def __call__(self, response: str, item: DatasetItem) -> bool:
        return self.grade(response, item)


GraderLike = Grader | Callable[[str, DatasetItem], bool]
"""A :class:`Grader`, or a plain ``fn(response, item) -> bool`` (wrapped in :class:`FunctionGrader`)."""
