"""Small text helpers shared by datasets (reference extraction) and graders (answer extraction)."""

from __future__ import annotations

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def boxed_contents(text: str) -> list[str]:
    """Contents of every ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, in order.

    Braces nest: ``\\boxed{\\frac{1}{2}}`` yields ``\\frac{1}{2}``. The unbraced form
    ``\\boxed 5`` yields ``5``. An unclosed box is ignored.

    Examples:
        >>> boxed_contents(r"first \\boxed{1}, then \\boxed{\\frac{a}{b}}")
        ['1', '\\\\frac{a}{b}']
    """
    found: list[str] = []
    pos = 0
    while True:
        hits = [(text.find(cmd, pos), cmd) for cmd in _BOX_COMMANDS]
        hits = [(i, cmd) for i, cmd in hits if i >= 0]
        if not hits:
            return found
        start, cmd = min(hits)
        cursor = start + len(cmd)
        if cursor < len(text) and text[cursor].isalpha():  # \boxedx is another command
            pos = cursor
            continue
        while cursor < len(text) and text[cursor] == " ":
            cursor += 1
        if cursor < len(text) and text[cursor] == "{":
            depth = 0
            for end in range(cursor, len(text)):
                if text[end] == "{" and not _escaped(text, end):
                    depth += 1
                elif text[end] == "}" and not _escaped(text, end):
                    depth -= 1
                    if depth == 0:
                        found.append(text[cursor + 1 : end])
                        pos = end + 1
                        break
            else:  # unclosed
                return found
        else:
            # "\boxed 5": the argument runs to the next whitespace or "$"
            end = cursor
            while end < len(text) and not text[end].isspace() and text[end] != "$":
                end += 1
            if end > cursor:
                found.append(text[cursor:end])
            pos = max(end, cursor + 1)


def _escaped(text: str, index: int) -> bool:
    """Whether the character at ``index`` is escaped by an odd run of backslashes (``\\{``)."""
    run = 0
    while index - run - 1 >= 0 and text[index - run - 1] == "\\":
        run += 1
    return run % 2 == 1


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in ``text``, or ``None`` if there is none.

    Examples:
        >>> last_boxed(r"so $x = \\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}$.")
        '\\\\left( 3, \\\\frac{\\\\pi}{2} \\\\right)'
    """
    found = boxed_contents(text)
    return found[-1] if found else None
