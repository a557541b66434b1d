"""Shared pieces of the policy format: strict models, multi-issue errors, and the shorthands."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict

Loc: TypeAlias = tuple[str | int, ...]
Shorthand: TypeAlias = Literal["bands", "action", "override"]


class PolicyIssueError(ValueError):
    """Several problems found by one validator, each at a ``loc`` below the validated value (the
    YAML loader locates each by line and field; in plain Python the message lists them all)."""

    def __init__(self, issues: Sequence[tuple[Loc, str]]) -> None:
        self.issues = list(issues)
        super().__init__("; ".join(f"{_loc_text(loc)}: {msg}" if loc else msg for loc, msg in self.issues))


def _loc_text(loc: Loc) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def expand_shorthand(kind: Shorthand, value: Any) -> Any:
    """Expand the shorthand forms of the policy format to the full form (the only place that does).

    * ``bands: 0.7`` (a bare threshold) means ``[{below: 0.7, action: abstain}, {action: answer}]``.
    * ``on_degraded: abstain`` (a bare action name) means ``{action: abstain}`` with default texts.
    * an override given as a bare threshold (``tools: {send_email: 0.9}``) means ``{bands: 0.9}``.

    ``kind`` names the field ``value`` was given for; anything else is returned unchanged.

    Raises:
        ValueError: A bare threshold outside (0, 1).

    Examples:
        >>> expand_shorthand("bands", 0.7)
        [{'below': 0.7, 'action': 'abstain'}, {'action': 'answer'}]
        >>> expand_shorthand("action", "escalate")
        {'action': 'escalate'}
    """
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "override" and is_number:
        return {"bands": expand_shorthand("bands", value)}
    if kind == "bands" and is_number:
        if not 0.0 < value < 1.0:  # compared before float(): a huge integer cannot be one
            raise ValueError(f"a bare threshold must be a number in (0, 1); got {value!r}")
        return [{"below": float(value), "action": "abstain"}, {"action": "answer"}]
    if kind == "action" and isinstance(value, str):
        return {"action": value}
    return value


class Strict(BaseModel):
    """Base of every policy model: immutable, and unknown keys are errors."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def fmt(x: float) -> str:
    """A number as a policy file would write it (``0.3``, ``1``)."""
    return f"{x:g}"
