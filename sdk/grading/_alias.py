"""Short free-text answers matched against reference aliases (TriviaQA, Natural Questions)."""

from __future__ import annotations

import re
import string
import unicodedata
from dataclasses import dataclass

from capgate._util.text import last_boxed
from capgate.datasets import DatasetItem
from capgate.grading._base import Grader

_PUNCTUATION = set(string.punctuation) | {"‘", "’", "´", "`", "“", "”", "–", "—"}
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_ANSWER_IS = re.compile(
    r"(?:final answer|the answer|answer)\s*(?:is|:)\s*:?\s*(?P<answer>[^\n]+)", re.IGNORECASE
)
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")


def normalize_text(text: str) -> str:
    """TriviaQA's answer normalization: lowercase, punctuation to spaces, drop articles, squeeze spaces.

    Examples:
        >>> normalize_text("The Sunset  Blvd.")
        'sunset blvd'
    """
    text = unicodedata.normalize("NFKC", text).lower().replace("_", " ")
    text = "".join(" " if ch in _PUNCTUATION else ch for ch in text)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def final_answer_text(response: str) -> str | None:
    """The final-answer span of a free-text response, not yet normalized.

    In order: the last ``\\boxed{}``; the text after the last "answer is" / "Answer:"; else the
    first non-empty line. Markdown emphasis, quotes and a trailing full stop are stripped.

    Examples:
        >>> final_answer_text("I think so.\\nFinal answer: **Sunset Boulevard**.")
        'Sunset Boulevard'
    """
    boxed = last_boxed(response)
    if boxed is not None:
        span = _TEXT_WRAPPER.sub(r"\1", boxed)
    else:
        matches = list(_ANSWER_IS.finditer(response))
        if matches:
            span = matches[-1].group("answer")
        else:
            lines = [line for line in response.splitlines() if line.strip()]
            if not lines:
                return None
            span = lines[0]
    span = span.strip().strip("*_\"'`. ")
    return span or None


@dataclass(kw_only=True, eq=False)
class AliasGrader(Grader):
    """Accepts a short answer equal to any reference alias after :func:`normalize_text`.

    Args:
        contains: Also accept an answer that contains an alias as a whole-word phrase
            ("It is Sunset Boulevard" for "Sunset Boulevard"). Off by default, as in TriviaQA's
            exact-match metric.

    Examples:
        >>> item = DatasetItem(id="q", question="Which musical?", kind="alias",
        ...                    references=["Sunset Boulevard", "Sunset Blvd"])
        >>> AliasGrader().judge("Answer: sunset blvd.", item)
        Judgement(answer='sunset blvd', correct=True)
    """

    kind = "alias"
    contains: bool = False

    def extract(self, response: str) -> str | None:
        span = final_answer_text(response)
        if span is None:
            return None
        return normalize_text(span) or None

    def match(self, answer: str, item: DatasetItem) -> bool:
        references = [normalize_text(ref) for ref in item.references]
        if answer in references:
            return True
        if self.contains:
            padded = f" {answer} "
            return any(ref and f" {ref} " in padded for ref in references)
        return False
