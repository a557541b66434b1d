"""User-supplied graders and the per-kind default chooser."""

from __future__ import annotations

from collections.abc import Callable

from capgate.datasets import DatasetItem
from capgate.grading._alias import AliasGrader
from capgate.grading._base import Grader, GraderLike, Judgement
from capgate.grading._choice import ChoiceGrader
from capgate.grading._math import MathGrader
from capgate.grading._numeric import NumericGrader


class FunctionGrader(Grader):
    """A grader from a plain function ``fn(response, item) -> bool``.

    Args:
        fn: Decides correctness; it sees the whole response. It must return a ``bool``.
        extract: Gives the normalized final answer for grouping (consistency, CAS). Defaults to
            the free-text rule of :class:`AliasGrader` (last ``\\boxed{}``, else "Answer: ...",
            else the first line; then :func:`normalize_text`).
        name: Shown in ``repr`` and recorded by harvest.

    Examples:
        >>> item = DatasetItem(id="q", question="Say hi", kind="custom")
        >>> grader = FunctionGrader(lambda response, item: "hi" in response.lower())
        >>> grader.judge("Hi there", item)
        Judgement(answer='hi there', correct=True)
    """

    def __init__(
        self,
        fn: Callable[[str, DatasetItem], bool],
        *,
        extract: Callable[[str], str | None] | None = None,
        name: str | None = None,
    ) -> None:
        self.fn = fn
        self.extract_fn = extract
        self.name = name

    def __repr__(self) -> str:
        name = self.name or getattr(self.fn, "__qualname__", repr(self.fn))
        return f"FunctionGrader({name})"

    def extract(self, response: str) -> str | None:
        return (self.extract_fn or AliasGrader().extract)(response)

    def match(self, answer: str, item: DatasetItem) -> bool:
        raise TypeError("FunctionGrader judges whole responses; call judge() or grade()")

    def judge(self, response: str, item: DatasetItem) -> Judgement:
        verdict = self.fn(response, item)
        if not isinstance(verdict, bool):
            raise TypeError(f"grader function {self!r} must return a bool; got {type(verdict).__name__}")
        return Judgement(answer=self.extract(response), correct=verdict)


_DEFAULTS: dict[str, Callable[[], Grader]] = {
    "alias": AliasGrader,
    "numeric": NumericGrader,
    "math": MathGrader,
    "choice": ChoiceGrader,
}


def grader_for(item_or_kind: DatasetItem | str) -> Grader:
    """The default grader for an item's answer kind (or for a kind named directly).

    ``alias`` → :class:`AliasGrader`, ``numeric`` → :class:`NumericGrader`, ``math`` →
    :class:`MathGrader`, ``choice`` → :class:`ChoiceGrader`.

    Raises:
        ValueError: The kind is ``custom`` (such items need a grader from the caller) or unknown.

    Examples:
        >>> grader_for("numeric")
        NumericGrader(rel_tol=1e-06, abs_tol=1e-09)
    """
    kind = item_or_kind.kind if isinstance(item_or_kind, DatasetItem) else item_or_kind
    if kind == "custom":
        raise ValueError("items of kind 'custom' have no default grader; pass a Grader or fn(response, item)")
    if kind not in _DEFAULTS:
        raise ValueError(f"unknown answer kind {kind!r}; expected one of {sorted(_DEFAULTS)} or 'custom'")
    return _DEFAULTS[kind]()


def as_grader(grader: GraderLike) -> Grader:
    """A :class:`Grader` as is; a plain function wrapped in :class:`FunctionGrader`.

    Raises:
        TypeError: ``grader`` is neither.
    """
    if isinstance(grader, Grader):
        return grader
    if callable(grader):
        return FunctionGrader(grader)
    raise TypeError(f"expected a Grader or a function (response, item) -> bool; got {type(grader).__name__}")
