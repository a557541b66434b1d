"""Reading a model's completion: reasoning blocks, ``\\boxed{}`` answers, stated probabilities."""

from __future__ import annotations

import re
from collections.abc import Sequence

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_SCALAR = re.compile(rf"^(?P<x>{_NUMBER})\s*(?P<pct>%?)$")
_RANGE = re.compile(rf"^(?P<a>{_NUMBER})\s*(?P<pa>%?)\s*(?:-|–|—|to)\s*(?P<b>{_NUMBER})\s*(?P<pb>%?)$")
_FRAC = re.compile(r"^\\[dt]?frac\{\s*(?P<a>\d+)\s*\}\{\s*(?P<b>\d+)\s*\}$")
_PREFIX = re.compile(r"^(?:p|prob|probability|confidence)\s*[=:]\s*", re.IGNORECASE)


def final_segment(text: str) -> tuple[str | None, str]:
    """``(the part of a completion after its reasoning block, "")``, or ``(None, reason)`` when a
    ``<think>`` block was never closed (the model ran out of tokens while reasoning).

    Examples:
        >>> final_segment("<think>hmm \\\\boxed{0.1}</think> so \\\\boxed{0.8}")
        (' so \\\\boxed{0.8}', '')
    """
    if THINK_CLOSE in text:
        return text.rsplit(THINK_CLOSE, 1)[1], ""
    if THINK_OPEN in text:
        return None, "the reasoning block (<think>) was never closed; raise max_tokens?"
    return text, ""


def boxed_contents(text: str) -> list[str]:
    """Contents of every ``\\boxed{...}`` in ``text`` (nested braces balanced), in order.

    Examples:
        >>> boxed_contents("a \\\\boxed{\\\\frac{1}{2}} b \\\\boxed{0.7}")
        ['\\\\frac{1}{2}', '0.7']
    """
    found: list[str] = []
    start = 0
    marker = "\\boxed{"
    while (at := text.find(marker, start)) != -1:
        depth, i = 1, at + len(marker)
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth:  # unbalanced: the completion was cut off inside the box
            break
        found.append(text[at + len(marker) : i - 1])
        start = i
    return found


def _scalar(number: str, percent: bool) -> float:
    value = float(number)
    return value / 100.0 if percent else value


def _read_probability(content: str) -> tuple[float | None, str]:
    s = content.strip().strip("$").strip()
    s = s.replace("\\%", "%").replace("\\,", "").replace("\\ ", " ")
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", s).strip()
    s = _PREFIX.sub("", s).strip()
    if m := _SCALAR.match(s):
        value = _scalar(m["x"], bool(m["pct"]))
        if not m["pct"] and value > 1.0:
            return None, f"\\boxed{{{content}}}: {value:g} is not in [0, 1] (a percentage needs a % sign)"
    elif m := _RANGE.match(s):
        pct = bool(m["pa"] or m["pb"])
        a, b = _scalar(m["a"], pct), _scalar(m["b"], pct)
        if a > b:
            return None, f"\\boxed{{{content}}}: a range must go from low to high"
        value = (a + b) / 2.0
    elif m := _FRAC.match(s):
        if int(m["b"]) == 0:
            return None, f"\\boxed{{{content}}}: division by zero"
        value = int(m["a"]) / int(m["b"])
    else:
        return None, f"\\boxed{{{content}}} does not hold a probability"
    if not 0.0 <= value <= 1.0:
        return None, f"\\boxed{{{content}}}: {value:g} is not in [0, 1]"
    return value, ""


def parse_probability(
    completion: str, *, question: str | Sequence[str] | None = None
) -> tuple[float | None, str]:
    """Read the probability a model stated as ``\\boxed{P}`` in its own completion.

    Only the completion after its reasoning block (``<think>...</think>``) is read; its *last*
    ``\\boxed{}`` counts. Accepted forms: ``0.7``, ``.7``, ``70%`` (also ``70\\%``), ``P = 0.7``, a
    scale bin ``0.6-0.7`` (its midpoint) and ``\\frac{7}{10}``; a bare number above 1 without ``%``
    is refused rather than guessed at. Verbatim copies of ``question``, if given, are removed
    first, so a model parroting a question containing ``\\boxed{1.0}`` does not answer ``1.0``; pass
    every form the model may echo (the question as given and as shown in the prompt) as a sequence.

    Returns:
        ``(p, "")`` on success, else ``(None, reason)``.

    Examples:
        >>> parse_probability("<think>\\\\boxed{0.9}?</think>I'd say \\\\boxed{70%}")
        (0.7, '')
        >>> parse_probability("I am certain.")
        (None, 'no \\\\boxed{} in the completion')
    """
    text = completion
    forms = [question] if isinstance(question, str) else list(question or ())
    for form in sorted(forms, key=len, reverse=True):
        if len(form.strip()) >= 8:
            text = text.replace(form, " ").replace(form.strip(), " ")
    segment, why = final_segment(text)
    if segment is None:
        return None, why
    boxes = boxed_contents(segment)
    if not boxes:
        return None, "no \\boxed{} in the completion"
    return _read_probability(boxes[-1])


def normalize_answer(text: str) -> str | None:
    """A simple default answer normalizer for :class:`~capgate.estimators.Consistency`.

    Not a grader (use a task grader's ``.extract`` for real work): the last ``\\boxed{}`` after any
    reasoning block, else the last non-empty line, lowercased, whitespace collapsed, surrounding
    punctuation, ``$`` and a leading "answer:" stripped.

    Examples:
        >>> normalize_answer("Thinking...\\nThe answer is \\\\boxed{ 42 }.")
        '42'
        >>> normalize_answer("Paris.")
        'paris'
        >>> normalize_answer("   ") is None
        True
    """
    segment, _ = final_segment(text)
    if segment is None:
        return None
    boxes = boxed_contents(segment)
    if boxes:
        candidate = boxes[-1]
    else:
        lines = [line for line in segment.splitlines() if line.strip()]
        if not lines:
            return None
        candidate = lines[-1]
    candidate = re.sub(r"\s+", " ", candidate).strip().lower()
    candidate = re.sub(r"^(?:the )?(?:final )?answer(?: is)?\s*[:=]?\s*", "", candidate)
    candidate = candidate.strip(" \t.,;:!?\"'`*$")
    return candidate or None
