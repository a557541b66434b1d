"""One query of a dataset: the question, its accepted answers, and how to grade them."""

from __future__ import annotations

import string
from typing import Any, Literal, TypeAlias

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

AnswerKind: TypeAlias = Literal["alias", "numeric", "math", "choice", "custom"]
"""How a query's answer is graded.

- ``alias``: short free text matched against reference aliases after normalization (TriviaQA).
- ``numeric``: a final number compared with a tolerance (GSM8K).
- ``math``: a final ``\\boxed{}`` LaTeX expression, compared symbolically (MATH).
- ``choice``: the letter of one of ``choices`` (MMLU, ARC).
- ``custom``: graded only by a grader the caller supplies.
"""

CHOICE_LETTERS = string.ascii_uppercase
"""Letters naming the options of a multiple-choice item, in order."""


class DatasetItem(BaseModel):
    """A query with its reference answers: one line of a capgate dataset file.

    The JSON-lines form is one object per line with exactly these keys (unknown keys are an
    error, so a typo never passes silently)::

        {"id": "q1", "question": "What is 2 + 3?", "references": ["5"], "kind": "numeric"}
        {"id": "q2", "question": "Capital of France?", "references": ["Paris", "Paris, France"],
         "kind": "alias", "metadata": {"source": "me"}}
        {"id": "q3", "question": "2 + 2 = ?", "choices": ["3", "4"], "references": ["B"], "kind": "choice"}

    ``aliases`` and ``answers`` are accepted as other names for ``references``, and a single
    ``"answer": "x"`` stands for ``"references": ["x"]``.

    Attributes:
        id: Unique id within the dataset.
        question: The query text (for ``choice`` items, without the options).
        references: Accepted answers: aliases (``alias``), numbers (``numeric``), LaTeX
            (``math``) or option letters such as ``"B"`` (``choice``). At least one is required
            unless ``kind`` is ``custom``.
        kind: How the answer is graded (see :data:`AnswerKind`).
        choices: The options of a ``choice`` item, lettered A, B, C... in order.
        metadata: Free-form JSON-serialisable facts (source split, subject, difficulty tier...).

    Examples:
        >>> item = DatasetItem(id="q3", question="2 + 2 = ?", choices=["3", "4"], references=["B"],
        ...                    kind="choice")
        >>> item.correct_choices
        ['4']
    """

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    id: str = Field(min_length=1)
    question: str = Field(min_length=1)
    kind: AnswerKind
    choices: list[str] | None = Field(default=None, validate_default=True)
    references: list[str] = Field(
        default_factory=list,
        validation_alias=AliasChoices("references", "aliases", "answers"),
        validate_default=True,
    )
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _expand_answer_shorthand(
        cls, data: Any, handler: ModelWrapValidatorHandler[DatasetItem]
    ) -> DatasetItem:
        if not (isinstance(data, dict) and "answer" in data):
            return handler(data)
        if any(key in data for key in ("references", "aliases", "answers")):
            raise ValueError("give either 'answer' or 'references', not both")
        data = dict(data)
        answer = data.pop("answer")
        data["references"] = [answer] if isinstance(answer, str) else answer
        try:
            return handler(data)
        except ValidationError as exc:  # errors in the references the line gave as `answer` name it
            errors: list[Any] = [_as_answer(error, answer) for error in exc.errors()]
            raise ValidationError.from_exception_data(exc.title, errors) from None

    @field_validator("choices")
    @classmethod
    def _check_choices(cls, choices: list[str] | None, info: ValidationInfo) -> list[str] | None:
        kind = info.data.get("kind")
        if choices is not None and kind not in ("choice", "custom"):
            raise ValueError(f"choices are only allowed for kind 'choice' (or 'custom'); got kind {kind!r}")
        if kind == "choice" and (choices is None or not 2 <= len(choices) <= len(CHOICE_LETTERS)):
            got = None if choices is None else len(choices)
            raise ValueError(f"a 'choice' item needs between 2 and 26 choices; got {got}")
        return choices

    @field_validator("references")
    @classmethod
    def _check_references(cls, references: list[str], info: ValidationInfo) -> list[str]:
        kind = info.data.get("kind")
        if kind is None:  # kind itself failed validation; that error is reported
            return references
        if kind != "custom" and not references:
            raise ValueError(f"an item of kind {kind!r} needs at least one reference answer")
        if any(not ref.strip() for ref in references):
            raise ValueError("references must be non-empty strings")
        choices = info.data.get("choices")
        if kind == "choice" and choices:
            valid = CHOICE_LETTERS[: len(choices)]
            bad = [ref for ref in references if len(ref) != 1 or ref not in valid]
            if bad:
                raise ValueError(
                    f"references of a 'choice' item must be option letters in {valid!r}; got {bad!r}"
                )
        return references

    @property
    def letters(self) -> str:
        """The option letters of a ``choice`` item (``"ABCD"`` for four choices); empty otherwise."""
        return CHOICE_LETTERS[: len(self.choices)] if self.choices else ""

    @property
    def correct_choices(self) -> list[str]:
        """The texts of the correct options of a ``choice`` item; empty otherwise."""
        if not self.choices:
            return []
        return [self.choices[CHOICE_LETTERS.index(ref)] for ref in self.references if ref in self.letters]


def _as_answer(error: Any, answer: Any) -> Any:
    """A validation error of ``references`` made from the ``answer`` shorthand, located at ``answer``."""
    loc = tuple(error["loc"])
    if loc[:1] != ("references",):
        return error
    return {**error, "loc": ("answer", *loc[1:]), **({"input": answer} if len(loc) == 1 else {})}
