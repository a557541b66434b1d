"""Policy actions and their settings, and the rendering of the texts they show."""

from __future__ import annotations

import string
from collections.abc import Mapping
from typing import Annotated, Literal, TypeAlias

from pydantic import AfterValidator, BeforeValidator, Field, model_validator

from capgate.core.plans import Count
from capgate.core.types import Action, Estimate, RoutePlan, SamplingPlan, StopSettings
from capgate.policies import _templates as tpl
from capgate.policies._base import Loc, PolicyIssueError, Strict, expand_shorthand


class _Prob:
    """Formats like a float, or as ``unavailable`` when there is no value."""

    def __init__(self, p: float | None) -> None:
        self.p = p

    def __format__(self, spec: str) -> str:
        return tpl.UNAVAILABLE if self.p is None else format(self.p, spec or ".3f")

    def __str__(self) -> str:
        return tpl.UNAVAILABLE if self.p is None else f"{self.p:.3f}"


def render(template: str, p: float | None, **text: str) -> str:
    """Fill a text template; ``{p}`` renders as ``unavailable`` when there is no value."""
    return template.format_map({"p": _Prob(p), **text})


def _check_template(text: str) -> str:
    try:
        fields = [name for _, name, _, _ in string.Formatter().parse(text) if name is not None]
    except ValueError as exc:
        hint = "write literal braces as {{ and }}"
        raise ValueError(f"not a valid text template ({exc}); {hint}") from None
    for name in fields:
        if name not in tpl.PLACEHOLDERS:
            allowed = ", ".join("{" + p + "}" for p in tpl.PLACEHOLDERS)
            raise ValueError(f"unknown placeholder {{{name}}}; allowed: {allowed}")
    sample = dict.fromkeys(tpl.PLACEHOLDERS, "x")
    for p in (0.5, None):
        try:
            render(text, p, **{k: v for k, v in sample.items() if k != "p"})
        except (ValueError, TypeError) as exc:
            raise ValueError(f"template does not render: {exc}") from None
    return text


Template = Annotated[str, Field(min_length=1), AfterValidator(_check_template)]
"""A user-facing text; may use the placeholders of :data:`capgate.policies._templates.PLACEHOLDERS`."""

Probability = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False, strict=True)]
"""A number in [0, 1]. A policy's numbers are strict: a YAML boolean (``yes``) or quoted number is refused."""


class AnswerAction(Strict):
    """Let the model answer."""

    action: Literal["answer"] = "answer"


class AbstainAction(Strict):
    """Decline to answer, telling the user why.

    Attributes:
        message: Text shown to the user (a template).
    """

    action: Literal["abstain"] = "abstain"
    message: Template = tpl.ABSTAIN_MESSAGE


class ClarifyAction(Strict):
    """Ask the user a clarifying question instead of answering.

    Attributes:
        question: The question put to the user (a template).
    """

    action: Literal["clarify"] = "clarify"
    question: Template = tpl.CLARIFY_QUESTION


class EscalateAction(Strict):
    """Hand the query to a human, with context.

    Attributes:
        to: Who takes over (a queue, team or channel name), if the integration routes by it.
        summary: Hand-off note for the human (a template).
    """

    action: Literal["escalate"] = "escalate"
    to: str | None = Field(default=None, min_length=1)
    summary: Template = tpl.ESCALATE_SUMMARY


class ResampleAction(Strict):
    """Spend more samples on the query through CAS, within a budget.

    Attributes:
        max_samples: Hard cap on the responses drawn for the query.
        batch_size: Responses drawn per round before the stop rule is consulted.
        stop: Early-stop settings.
        target_pass_at_k: Only when a verifier can pick a correct response: draw the smallest k
            whose predicted pass@k, 1 - (1 - p)^k, reaches this target (capped at ``max_samples``).
    """

    action: Literal["resample"] = "resample"
    max_samples: Count = Field(default=16, ge=1)
    batch_size: Count = Field(default=4, ge=1)
    stop: StopSettings = Field(default_factory=StopSettings)
    target_pass_at_k: float | None = Field(default=None, gt=0.0, lt=1.0, strict=True)

    @model_validator(mode="after")
    def _check_budget(self) -> ResampleAction:
        given: list[tuple[Loc, int]] = [
            (("batch_size",), self.batch_size),
            (("stop", "min_samples"), self.stop.min_samples),
        ]
        issues = [
            (loc, f"must be <= max_samples ({self.max_samples}); got {value}")
            for loc, value in given
            if value > self.max_samples
        ]
        if issues:
            raise PolicyIssueError(issues)
        return self

    def budget(self, p: float | None) -> int:
        """Samples to spend on a query with predicted capability ``p`` (``None``: unavailable).

        With ``target_pass_at_k`` the budget is the smallest k reaching the target
        (:func:`capgate.cas.samples_for_target`), else ``max_samples`` (CAS may stop earlier).

        Examples:
            >>> ResampleAction(max_samples=16, target_pass_at_k=0.9).budget(0.5)
            4
        """
        if self.target_pass_at_k is None or p is None:
            return self.max_samples
        from capgate.cas.budget import samples_for_target

        return samples_for_target(p, target=self.target_pass_at_k, max_samples=self.max_samples).k

    def plan(self, p: float | None) -> SamplingPlan:
        """The sampling plan a decision carries for a query with predicted capability ``p``.

        Examples:
            >>> ResampleAction(max_samples=16, batch_size=8, target_pass_at_k=0.9).plan(0.5).batch_size
            4
        """
        budget = self.budget(p)
        return SamplingPlan(max_samples=budget, batch_size=min(self.batch_size, budget), stop=self.stop)


ChoiceName = Annotated[str, Field(min_length=1)]
"""The name of a model choice (a key of the gate's ``routes``)."""


def _unique(choices: list[str]) -> list[str]:
    seen = [c for i, c in enumerate(choices) if c in choices[:i]]
    if seen:
        raise ValueError(f"each model choice may be named once; {seen[0]!r} is repeated")
    return choices


class RouteAction(Strict):
    """Send the query to the cheapest model choice predicted to clear ``edge``, else the strongest.

    Each choice's capability is predicted by its own estimator (the gate's ``routes``); one whose
    estimate cannot be had does not clear the edge.

    Attributes:
        choices: Model choice names, cheapest first (the last is the strongest).
        edge: The predicted capability a choice must reach; by default the lower edge of the
            rule's answer band (the rule's top band must then answer).
    """

    action: Literal["route"] = "route"
    choices: Annotated[list[ChoiceName], Field(min_length=1), AfterValidator(_unique)]
    edge: Probability | None = None

    def plan(self, edge: float) -> RoutePlan:
        """The route plan a decision carries (``edge``: this action's, or the rule's answer edge)."""
        return RoutePlan(choices=tuple(self.choices), edge=self.edge if self.edge is not None else edge)


def choose_route(plan: RoutePlan, estimates: Mapping[str, Estimate]) -> tuple[str, RoutePlan, str]:
    """The cheapest choice whose estimate clears the plan's edge, else the strongest (the last).

    A missing or degraded estimate never clears the edge (fail closed: the strongest model).

    Args:
        plan: The choices (cheapest first) and the edge.
        estimates: Estimates by choice name (choices after the picked one may be absent).

    Returns:
        The chosen name, the plan with each estimated choice's p, and the reason.

    Examples:
        >>> plan = RoutePlan(choices=("small", "large"), edge=0.7)
        >>> choose_route(plan, {"small": Estimate(p=0.9, method="probe")})[0]
        'small'
        >>> low, mid = Estimate(p=0.4, method="probe"), Estimate(p=0.6, method="probe")
        >>> choose_route(plan, {"small": low, "large": mid})[0]
        'large'
    """
    p: dict[str, float | None] = {}
    for name in plan.choices:
        estimate = estimates.get(name)
        if estimate is None:
            continue
        p[name] = estimate.p
        if estimate.p is not None and not estimate.degraded and estimate.p >= plan.edge:
            seen = ", ".join(f"{n}: {_Prob(v)}" for n, v in p.items())
            reason = f"route to {name!r}: the cheapest choice predicted to reach {plan.edge:g} ({seen})"
            return name, plan.model_copy(update={"p": p}), reason
    strongest = plan.choices[-1]
    seen = ", ".join(f"{n}: {_Prob(v)}" for n, v in p.items()) or "no estimates"
    reason = (
        f"route to {strongest!r}, the strongest choice: none is predicted to reach {plan.edge:g} ({seen})"
    )
    return strongest, plan.model_copy(update={"p": p}), reason


AnyAction: TypeAlias = (
    AnswerAction | AbstainAction | ClarifyAction | EscalateAction | ResampleAction | RouteAction
)

ActionSpec = Annotated[AnyAction, Field(discriminator="action")]
"""One action with its settings, chosen by its ``action`` key."""


DegradedAction = Annotated[
    ActionSpec,
    BeforeValidator(lambda v: expand_shorthand("action", v), json_schema_input_type=ActionSpec | Action),
]
"""The fail-safe action for degraded estimates; a bare action name takes default settings."""


def message_template(spec: AnyAction) -> str | None:
    """The user/human text of an action, if it has one."""
    if isinstance(spec, AbstainAction):
        return spec.message
    if isinstance(spec, ClarifyAction):
        return spec.question
    if isinstance(spec, EscalateAction):
        return spec.summary
    return None
