"""The demo's comparison: the agent without the gate against the same agent with it.

Per question the demo knows what the ungated agent answered (one sample, always) and whether it
was right, and what the gated agent did: answered (with or without extra samples; right or wrong)
or stopped the call. :func:`compare` counts, over the same questions:

* **without the gate**: it answers everything; accuracy (right / questions) and its wrong answers;
  one sample per question.
* **with the gate**: coverage (answered / questions), accuracy among answered, the wrong answers
  it stopped (questions the ungated agent got wrong and the gate stopped, also as a share of all
  the ungated agent's wrong answers) and the right answers it stopped (likewise), the samples it
  spent and the time it added (its total time minus the ungated agent's, negative when the time
  saved by abstaining outweighs the estimates).

Every rate comes with its 95% Wilson interval (:func:`capgate.decision.analysis.report.wilson`); a rate
whose denominator is 0 is ``None``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from capgate._util.jsonl import json_ready
from capgate.decision.analysis.report import Rate, wilson

__all__ = ["Compared", "Comparison", "WithGate", "WithoutGate", "compare"]


class Compared(Protocol):
    """What :func:`compare` reads of a question (a :class:`capgate.demo.live.DemoRow` has it)."""

    @property
    def ungated_correct(self) -> bool: ...
    @property
    def correct(self) -> bool | None: ...  # the gated answer's correctness; None when stopped
    @property
    def samples(self) -> int: ...
    @property
    def ungated_seconds(self) -> float: ...
    @property
    def gated_seconds(self) -> float: ...


@dataclass(frozen=True)
class WithoutGate:
    """The ungated agent: it answers every question with one sample."""

    accuracy: Rate | None
    right: int
    wrong: int
    samples: int
    seconds: float


@dataclass(frozen=True)
class WithGate:
    """The gated agent on the same questions."""

    answered: int
    coverage: Rate | None
    accuracy: Rate | None  # among answered
    right: int
    wrong: int
    wrong_stopped: int
    wrong_stopped_share: Rate | None  # of the ungated agent's wrong answers
    right_stopped: int
    right_stopped_share: Rate | None  # of the ungated agent's right answers
    samples: int
    seconds: float
    seconds_added: float


@dataclass(frozen=True)
class Comparison:
    """:func:`compare`'s result."""

    questions: int
    without_gate: WithoutGate
    with_gate: WithGate

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data (a rate is ``{value, low, high, n, method}`` or ``None``)."""
        data: dict[str, Any] = json_ready(self)
        return data


def compare(rows: Sequence[Compared]) -> Comparison:
    """Count the comparison over ``rows`` (see the module docstring).

    Examples:
        >>> from types import SimpleNamespace as Row
        >>> seconds = {"ungated_seconds": 1.0, "gated_seconds": 1.5}
        >>> rows = [Row(ungated_correct=True, correct=True, samples=1, **seconds),
        ...         Row(ungated_correct=False, correct=None, samples=0, **seconds)]
        >>> c = compare(rows)
        >>> c.without_gate.accuracy.value, c.with_gate.coverage.value, c.with_gate.wrong_stopped
        (0.5, 0.5, 1)
    """
    n = len(rows)
    ungated_right = sum(1 for r in rows if r.ungated_correct)
    ungated_wrong = n - ungated_right
    answered = [r for r in rows if r.correct is not None]
    stopped = [r for r in rows if r.correct is None]
    right = sum(1 for r in answered if r.correct)
    wrong_stopped = sum(1 for r in stopped if not r.ungated_correct)
    right_stopped = len(stopped) - wrong_stopped
    ungated_seconds = sum(r.ungated_seconds for r in rows)
    gated_seconds = sum(r.gated_seconds for r in rows)
    return Comparison(
        questions=n,
        without_gate=WithoutGate(
            accuracy=wilson(ungated_right, n),
            right=ungated_right,
            wrong=ungated_wrong,
            samples=n,
            seconds=ungated_seconds,
        ),
        with_gate=WithGate(
            answered=len(answered),
            coverage=wilson(len(answered), n),
            accuracy=wilson(right, len(answered)),
            right=right,
            wrong=len(answered) - right,
            wrong_stopped=wrong_stopped,
            wrong_stopped_share=wilson(wrong_stopped, ungated_wrong),
            right_stopped=right_stopped,
            right_stopped_share=wilson(right_stopped, ungated_right),
            samples=sum(r.samples for r in rows),
            seconds=gated_seconds,
            seconds_added=gated_seconds - ungated_seconds,
        ),
    )
