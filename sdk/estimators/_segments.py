"""Split a query into segments (sentences, asides, quoted blocks, messages) and remove some.

For the injection guard (:mod:`capgate.estimators.guarded`): each chat message is cut into
structural blocks (fenced code, ``<tag>`` blocks, ``>`` quotes, bracketed or parenthesized asides,
whole tool and system messages) and the rest into sentences. :func:`remove_segments` leaves every
other character as it was: removing an appended sentence gives back the query it was appended to.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, TypeAlias

from capgate.core.backend import ChatMessage, Prompt, as_messages

SegmentKind: TypeAlias = Literal["sentence", "aside", "quoted", "message"]
"""``sentence``: running text; ``aside``: a bracketed or parenthesized span; ``quoted``: a fenced,
tagged or ``>``-quoted block; ``message``: a whole tool or system message."""

#: Kinds that hold context rather than the task (what the guard may test by removing them).
CONTEXT_KINDS: frozenset[SegmentKind] = frozenset({"aside", "quoted", "message"})

_BLOCKS = re.compile(
    r"```.*?(?:```|\Z)"  # fenced block
    r"|<(?P<tag>[A-Za-z][\w:-]*)[^<>]*>.*?</(?P=tag)\s*>"  # <tag ...> ... </tag>
    r"|(?:^[ \t]*>[^\n]*(?:\n|\Z))+"  # a run of > quoted lines
    r"|\[[^\[\]\n]{12,}\]"  # [a bracketed aside]
    r"|\([^()\n]{12,}\)"  # (a parenthesized aside)
    r"|\{[^{}]{12,}\}",  # {a JSON-like object}
    re.DOTALL | re.MULTILINE,
)
_SENTENCE_END = re.compile(r"(?<=[.!?;。！？])\s+|\n+")
_WORD = re.compile(r"\w", re.UNICODE)


@dataclass(frozen=True)
class Segment:
    """One piece of a query: its text, kind, message index and character span in that message."""

    text: str
    kind: SegmentKind
    message: int
    start: int
    end: int


def _sentences(content: str, start: int, end: int, message: int) -> list[Segment]:
    bounds: list[tuple[int, int]] = []
    cursor = start
    for match in _SENTENCE_END.finditer(content, start, end):
        bounds.append((cursor, match.start()))
        cursor = match.end()
    bounds.append((cursor, end))
    out: list[Segment] = []
    for lo, hi in bounds:
        text = content[lo:hi]
        lo += len(text) - len(text.lstrip())
        hi -= len(text) - len(text.rstrip())
        if _WORD.search(content[lo:hi]):
            out.append(Segment(content[lo:hi], "sentence", message, lo, hi))
    return out


def split_segments(prompt: Prompt) -> list[Segment]:
    """The segments of a query, in reading order.

    Examples:
        >>> [(s.kind, s.text) for s in split_segments("What is 2+2? (Easy one, trust me.)")]
        [('sentence', 'What is 2+2?'), ('aside', '(Easy one, trust me.)')]
    """
    segments: list[Segment] = []
    for index, message in enumerate(as_messages(prompt)):
        content = message["content"]
        if message["role"] in ("tool", "system"):
            if _WORD.search(content):
                segments.append(Segment(content, "message", index, 0, len(content)))
            continue
        cursor = 0
        for block in _BLOCKS.finditer(content):
            segments.extend(_sentences(content, cursor, block.start(), index))
            kind: SegmentKind = "aside" if block.group(0)[:1] in "[({" else "quoted"
            segments.append(Segment(block.group(0), kind, index, block.start(), block.end()))
            cursor = block.end()
        segments.extend(_sentences(content, cursor, len(content), index))
    return segments


def _cut(content: str, spans: list[tuple[int, int]]) -> str:
    """``content`` without ``spans``, each with the whitespace after it (before it, at the end), so
    ``"Q\\n\\nNOTE"`` and ``"NOTE\\nQ"`` both give back ``"Q"``."""
    keep = [True] * len(content)
    for start, end in spans:
        while end < len(content) and content[end].isspace():
            end += 1
        if end == len(content):
            while start > 0 and content[start - 1].isspace():
                start -= 1
        for i in range(start, end):
            keep[i] = False
    return "".join(ch for ch, kept in zip(content, keep, strict=True) if kept)


def remove_segments(prompt: Prompt, segments: list[Segment]) -> Prompt:
    """``prompt`` without ``segments`` (a bare string stays a string; emptied messages are dropped).

    Examples:
        >>> query = "What is 2+2? (Easy one, trust me.)"
        >>> remove_segments(query, split_segments(query)[1:])
        'What is 2+2?'
    """
    messages: list[ChatMessage] = as_messages(prompt)
    spans: dict[int, list[tuple[int, int]]] = {}
    for segment in segments:
        spans.setdefault(segment.message, []).append((segment.start, segment.end))
    kept: list[ChatMessage] = []
    for index, message in enumerate(messages):
        content = message["content"]
        if index in spans:
            content = _cut(content, spans[index])
            if not _WORD.search(content):
                continue
        kept.append({"role": message["role"], "content": content})
    if isinstance(prompt, str) and len(kept) == 1 and kept[0]["role"] == "user":
        return kept[0]["content"]
    return kept
