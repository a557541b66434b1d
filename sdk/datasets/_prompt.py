"""How a dataset item is put to a model: one template per answer kind.

The templates ask for the answer in the form the kind's grader extracts (a final ``\\boxed{}``
for math and numbers, a bare short answer for aliases, an option letter for choices).
"""

from __future__ import annotations

from collections.abc import Mapping

from capgate.datasets._item import AnswerKind, DatasetItem

BOXED_TEMPLATE = "{question}\n\nPlease reason step by step, and put your final answer within \\boxed{{}}."
ALIAS_TEMPLATE = (
    "Answer the following question with just the answer (a name, number or short phrase), "
    "without explanation.\n\nQuestion: {question}\nAnswer:"
)
CHOICE_TEMPLATE = "{question}\n\n{choices}\n\nAnswer with the letter of the correct option ({letters})."
CUSTOM_TEMPLATE = "{question}"

PROMPT_TEMPLATES: Mapping[AnswerKind, str] = {
    "math": BOXED_TEMPLATE,
    "numeric": BOXED_TEMPLATE,
    "alias": ALIAS_TEMPLATE,
    "choice": CHOICE_TEMPLATE,
    "custom": CUSTOM_TEMPLATE,
}
"""Default template per answer kind. Placeholders: ``{question}``, and for choices ``{choices}``
(lines ``A. text``) and ``{letters}`` (``"A, B, C or D"``)."""


def build_prompt(item: DatasetItem, *, templates: Mapping[str, str] | None = None) -> str:
    """The user prompt that asks ``item``'s question in the answer format its grader expects.

    Args:
        item: The query.
        templates: Per-kind overrides of :data:`PROMPT_TEMPLATES`.

    Examples:
        >>> item = DatasetItem(id="q", question="2 + 2 = ?", choices=["3", "4"], references=["B"],
        ...                    kind="choice")
        >>> print(build_prompt(item))
        2 + 2 = ?
        <BLANKLINE>
        A. 3
        B. 4
        <BLANKLINE>
        Answer with the letter of the correct option (A or B).
    """
    template = (templates or {}).get(item.kind, PROMPT_TEMPLATES[item.kind])
    letters = item.letters
    options = "\n".join(
        f"{letter}. {text}" for letter, text in zip(letters, item.choices or [], strict=False)
    )
    spoken = ", ".join(letters[:-1]) + f" or {letters[-1]}" if len(letters) > 1 else letters
    return template.format(question=item.question, choices=options, letters=spoken)
