"""Multiple-choice answers: the letter of the chosen option (MMLU, ARC)."""

from __future__ import annotations

import re

from capgate._util.text import last_boxed
from capgate.datasets import DatasetItem
from capgate.grading._alias import final_answer_text, normalize_text
from capgate.grading._base import Grader, Judgement

_LETTER_ONLY = re.compile(r"^\s*(?:\\text\{)?\(?(?P<letter>[A-Z])\)?\}?\s*\.?\s*$")
_ANSWER_IS = re.compile(
    r"answer(?:\s+is)?\s*(?:\*\*)?\s*[:：]?\s*(?:\*\*)?\s*(?:option\s+|choice\s+)?\(?(?P<letter>[A-Z])\)?"
    r"(?![A-Za-z0-9])",
    re.IGNORECASE,
)
_LEADING = re.compile(  # "option" in any case; the letter itself only a capital
    r"^\s*(?:\*\*)?(?:(?i:option)\s+)?\(?(?P<letter>[A-Z])(?:\)|\.|:|\*\*|(?=[ \t]*(?:\n|$)))"
)
_ARTICLE_LIKE = re.compile(r"\s+[a-z]")


class ChoiceGrader(Grader):
    """Accepts the letter of a correct option.

    The letter is found, in order, in the last ``\\boxed{}`` (``\\boxed{B}``,
    ``\\boxed{\\text{(B)}}``), after the last "answer is" / "Answer:" (``The answer is (B).``), or
    at the very start (``B``, ``(B)``, ``B. Paris``, ``**B**``, ``Option B:``). Only capital
    letters count, and "A" or "I" followed by a lowercase word is read as English, not as an
    option. When no letter is found, a response whose answer text equals exactly one option's
    text (after :func:`~capgate.grading.normalize_text`) chooses that option.

    Examples:
        >>> item = DatasetItem(id="q", question="2 + 2 = ?", choices=["3", "4"], references=["B"],
        ...                    kind="choice")
        >>> ChoiceGrader().judge("The answer is (B).", item)
        Judgement(answer='B', correct=True)
    """

    kind = "choice"

    def __repr__(self) -> str:
        return "ChoiceGrader()"

    def extract(self, response: str) -> str | None:
        boxed = last_boxed(response)
        if boxed is not None:
            match = _LETTER_ONLY.match(boxed)
            return match.group("letter") if match else None
        for match in reversed(list(_ANSWER_IS.finditer(response))):
            letter = match.group("letter")
            if letter.isupper() and not self._reads_as_word(response, match.end("letter"), letter):
                return letter
        match = _LEADING.match(response)
        if match and not self._reads_as_word(response, match.end("letter"), match.group("letter")):
            return match.group("letter")
        return None

    @staticmethod
    def _reads_as_word(response: str, end: int, letter: str) -> bool:
        return letter in "AI" and _ARTICLE_LIKE.match(response, end) is not None

    def match(self, answer: str, item: DatasetItem) -> bool:
        return answer in item.references and answer in item.letters

    def judge(self, response: str, item: DatasetItem) -> Judgement:
        answer = self.extract(response)
        if answer is None and item.choices:
            span = final_answer_text(response)
            if span is not None:
                said = normalize_text(span)
                hits = [i for i, text in enumerate(item.choices) if normalize_text(text) == said]
                if len(hits) == 1:
                    answer = item.letters[hits[0]]
        return Judgement(answer=answer, correct=answer is not None and self.match(answer, item))
