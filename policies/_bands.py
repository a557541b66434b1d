"""Threshold bands: intervals of p, each with an action, ordered and covering [0, 1]."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, TypeAlias

from pydantic import AfterValidator, BeforeValidator, Field

from capgate.policies._actions import (
    AbstainAction,
    AnswerAction,
    ClarifyAction,
    EscalateAction,
    Probability,
    ResampleAction,
    RouteAction,
)
from capgate.policies._base import Loc, PolicyIssueError, Strict, expand_shorthand, fmt


class _Edges(Strict):
    below: Probability | None = Field(
        default=None, description="Upper edge (exclusive): the band holds p < below. Omit on the last band."
    )
    at_least: Probability | None = Field(
        default=None,
        description="Lower edge (inclusive): the band holds p >= at_least. Optional; defaults to the "
        "previous band's `below` (0 for the first band).",
    )


class AnswerBand(_Edges, AnswerAction):
    """A band of p in which the model answers."""


class AbstainBand(_Edges, AbstainAction):
    """A band of p in which the policy abstains."""


class ClarifyBand(_Edges, ClarifyAction):
    """A band of p in which the policy asks a clarifying question."""


class EscalateBand(_Edges, EscalateAction):
    """A band of p in which the policy escalates to a human."""


class ResampleBand(_Edges, ResampleAction):
    """A band of p in which the policy spends more samples (CAS)."""


class RouteBand(_Edges, RouteAction):
    """A band of p in which the query goes to the cheapest model choice predicted to be capable."""


AnyBand: TypeAlias = AnswerBand | AbstainBand | ClarifyBand | EscalateBand | ResampleBand | RouteBand

Band = Annotated[AnyBand, Field(discriminator="action")]
"""An interval of p and the action taken in it."""


def check_edges(edges: Sequence[tuple[float | None, float | None]]) -> list[tuple[Loc, str]]:
    """Problems with band edges given as ``(below, at_least)`` pairs, each at ``(index, key)``.

    Bands must be ascending in p, each non-empty, without overlaps or gaps, from 0 to 1. The file
    loader also checks the raw edges of a band list whose items have other errors.
    """
    issues: list[tuple[Loc, str]] = []
    last = len(edges) - 1
    if last < 0:
        return issues
    first_at_least = edges[0][1]
    if first_at_least is not None and first_at_least > 0.0:
        msg = f"bands do not cover [0, {fmt(first_at_least)}): the first band must start at 0 (omit at_least)"
        issues.append(((0, "at_least"), msg))
    lower: float | None = 0.0 if first_at_least is None else first_at_least
    for i in range(last):
        below, next_at_least = edges[i][0], edges[i + 1][1]
        if below is None and next_at_least is None:
            msg = (
                f"the edge between bands[{i}] and bands[{i + 1}] is not set: give bands[{i}].below "
                f"(only the last band may omit it) or bands[{i + 1}].at_least"
            )
            issues.append(((i,), msg))
            lower = None
            continue
        if below is not None and next_at_least is not None and below != next_at_least:
            a, b = below, next_at_least
            if b < a:
                msg = (
                    f"bands overlap: bands[{i + 1}].at_least={fmt(b)} is below bands[{i}].below={fmt(a)}, "
                    f"so [{fmt(b)}, {fmt(a)}) falls in two bands"
                )
            else:
                msg = (
                    f"gap between bands: [{fmt(a)}, {fmt(b)}) is in no band "
                    f"(bands[{i}].below={fmt(a)}, bands[{i + 1}].at_least={fmt(b)})"
                )
            issues.append(((i + 1, "at_least"), msg))
            lower = a
            continue
        edge, where, key = (below, i, "below") if below is not None else (next_at_least, i + 1, "at_least")
        assert edge is not None
        if lower is not None and edge <= lower:
            msg = (
                f"bands must be listed in ascending order of p, each non-empty: bands[{where}].{key}="
                f"{fmt(edge)} is not above the lower edge {fmt(lower)} of bands[{i}]"
            )
            issues.append(((where, key), msg))
        lower = edge
    last_below = edges[last][0]
    if last_below is not None:
        if lower is not None and last_below <= lower:
            msg = (
                f"bands must be listed in ascending order of p, each non-empty: bands[{last}].below="
                f"{fmt(last_below)} is not above the lower edge {fmt(lower)} of bands[{last}]"
            )
        else:
            msg = f"bands do not cover [{fmt(last_below)}, 1]: the last band must reach 1 (omit its below)"
        issues.append(((last, "below"), msg))
    return issues


def _check_bands(bands: list[AnyBand]) -> list[AnyBand]:
    issues = check_edges([(band.below, band.at_least) for band in bands])
    if issues:
        raise PolicyIssueError(issues)
    return bands


BandList = Annotated[
    list[Band],
    BeforeValidator(lambda v: expand_shorthand("bands", v), json_schema_input_type=list[Band] | float),
    Field(min_length=1),
    AfterValidator(_check_bands),
]
"""Ordered bands covering [0, 1]; a bare number t is the shorthand for abstain below t, answer above."""


def band_edges(bands: Sequence[AnyBand]) -> list[tuple[float, float]]:
    """``(lower, upper)`` of each band of a validated band list (the last upper is 1, inclusive)."""
    edges: list[tuple[float, float]] = []
    lower = 0.0
    for i, band in enumerate(bands):
        given = band.below if i < len(bands) - 1 else 1.0
        upper = given if given is not None else bands[i + 1].at_least
        if upper is None:
            raise ValueError(f"bands[{i}] has no upper edge; validate the bands first")
        edges.append((lower, upper))
        lower = upper
    return edges
