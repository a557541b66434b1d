"""Policies: bands and a fail-safe, per-step and per-tool overrides, and the decision engine."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, model_validator

from capgate._util.validate import check_unit_interval
from capgate.core.types import Decision, Estimate, Mode
from capgate.policies import _templates as tpl
from capgate.policies._actions import (
    AnyAction,
    DegradedAction,
    EscalateAction,
    ResampleAction,
    RouteAction,
    message_template,
    render,
)
from capgate.policies._bands import AnyBand, BandList, band_edges
from capgate.policies._base import Loc, PolicyIssueError, Strict, expand_shorthand, fmt
from capgate.policies._yaml import load_policy_file, parse_policy


class Override(Strict):
    """Bands and/or fail-safe that replace the policy's for one agent step or one tool.

    Attributes:
        bands: Bands used instead of the policy's (inherited when omitted).
        on_degraded: Fail-safe used instead of the policy's (inherited when omitted).
    """

    bands: BandList | None = None
    on_degraded: DegradedAction | None = None

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        return expand_shorthand("override", data)

    @model_validator(mode="after")
    def _not_empty(self) -> Override:
        if self.bands is None and self.on_degraded is None:
            raise ValueError("an override needs bands, on_degraded, or both")
        return self


@dataclass(frozen=True)
class Rule:
    """The bands and fail-safe in force for one (step, tool), after overrides.

    Attributes:
        bands: The ordered bands.
        on_degraded: The fail-safe action.
        scope: Human-readable origin (``policy 'x'``, ``tool 'send_email' of policy 'x'``).
        edges: ``(lower, upper)`` of each band.
    """

    bands: tuple[AnyBand, ...]
    on_degraded: AnyAction
    scope: str
    edges: tuple[tuple[float, float], ...]

    def band_index(self, p: float) -> int:
        """Index of the band holding ``p`` (each band is ``[lower, upper)``, the last ``[lower, 1]``)."""
        for i, (_, upper) in enumerate(self.edges[:-1]):
            if p < upper:
                return i
        return len(self.edges) - 1

    @property
    def answer_edge(self) -> float | None:
        """The lowest p from which this rule answers (its top bands all answer), or ``None`` when
        its top band does not answer."""
        edge: float | None = None
        for band, (lower, _) in zip(reversed(self.bands), reversed(self.edges), strict=True):
            if band.action != "answer":
                break
            edge = lower
        return edge

    def route_edge(self, spec: RouteAction) -> float:
        """The edge a route action's choices must clear: its own, or this rule's answer edge.

        Raises:
            ValueError: Neither is set.
        """
        edge = spec.edge if spec.edge is not None else self.answer_edge
        if edge is None:
            raise ValueError(
                f"a route action of {self.scope} needs `edge`: the rule's top band does not answer, "
                "so there is no answer edge to default to"
            )
        return edge

    def interval(self, index: int) -> str:
        """The band's interval in math notation."""
        lower, upper = self.edges[index]
        close = "]" if index == len(self.edges) - 1 else ")"
        return f"[{fmt(lower)}, {fmt(upper)}{close}"


@dataclass(frozen=True)
class Match:
    """Which action spec a policy picked for an estimate, and why.

    Attributes:
        spec: The action with its settings (a band, or the fail-safe).
        rule: The rule it came from.
        band: Index of the band that fired, or ``None`` for the fail-safe.
        degraded: Whether the fail-safe fired.
        reason: The decision's reason text.
    """

    spec: AnyAction
    rule: Rule
    band: int | None
    degraded: bool
    reason: str


class Policy(Strict):
    """A capability policy: what to do with a query given its predicted capability p.

    Attributes:
        version: Format version (1).
        name: Name recorded in every decision.
        description: What the policy is for.
        bands: Ordered bands of p covering [0, 1]; the first band whose interval holds p fires.
        on_degraded: Mandatory fail-safe for estimates that are unavailable or degraded.
        steps: Overrides by agent step (graph node) name.
        tools: Overrides by gated tool name; a tool override wins over a step override.
        mode: ``"enforce"`` (the gate acts on each decision) or ``"shadow"`` (it decides and logs
            beside the call, which proceeds as if answered; a gate's own ``mode`` overrides it).

    Examples:
        >>> from capgate import Estimate
        >>> from capgate.policies import AbstainBand, AnswerBand, ClarifyBand, EscalateAction
        >>> policy = Policy(
        ...     name="demo",
        ...     bands=[AbstainBand(below=0.3), ClarifyBand(below=0.6), AnswerBand()],
        ...     on_degraded=EscalateAction(to="support"),
        ... )
        >>> policy.decide(Estimate(p=0.45, method="probe")).action
        'clarify'
        >>> policy.decide(Estimate.unavailable("probe", "server down")).action
        'escalate'
    """

    version: Literal[1] = 1
    name: str = Field(min_length=1)
    description: str | None = None
    bands: BandList
    on_degraded: DegradedAction
    steps: dict[str, Override] = Field(default_factory=dict)
    tools: dict[str, Override] = Field(default_factory=dict)
    mode: Mode = "enforce"

    @model_validator(mode="after")
    def _route_edges(self) -> Policy:
        issues: list[tuple[Loc, str]] = []
        scopes: list[tuple[Loc, Rule, Sequence[AnyBand] | None, AnyAction | None]] = [
            ((), self.rule(), self.bands, self.on_degraded)
        ]
        for kind in ("steps", "tools"):
            for key, override in getattr(self, kind).items():
                rule = self.rule(**{kind[:-1]: key})
                scopes.append(((kind, key), rule, override.bands, override.on_degraded))
        for where, rule, bands, on_degraded in scopes:
            specs: list[tuple[Loc, AnyAction | None]] = [
                *(((*where, "bands", i), b) for i, b in enumerate(bands or [])),
                ((*where, "on_degraded"), on_degraded),
            ]
            for loc, spec in specs:
                if isinstance(spec, RouteAction) and spec.edge is None and rule.answer_edge is None:
                    msg = f"a route action needs `edge` here: the top band of {rule.scope} does not answer"
                    issues.append(((*loc, "edge"), msg))
        if issues:
            raise PolicyIssueError(issues)
        return self

    @classmethod
    def from_yaml(cls, path: str | Path) -> Policy:
        """Load and validate a policy file (``yaml.SafeLoader`` only).

        Raises:
            PolicyError: Every problem in the file, each with its line and field.
        """
        return load_policy_file(path, model=cls)

    @classmethod
    def from_yaml_text(cls, text: str, *, source: str = "<string>") -> Policy:
        """Validate a policy given as YAML text; ``source`` names it in error messages."""
        return parse_policy(text, source=source, model=cls)

    def to_yaml(self, *, header: str | None = None) -> str:
        """The policy as a policy file in full form (edges as ``below``; settings left at their
        defaults omitted) that loads back to an equal policy; ``header`` lines become leading
        comments."""
        data: dict[str, Any] = {"version": self.version, "name": self.name}
        if self.description:
            data["description"] = self.description
        if self.mode != "enforce":
            data["mode"] = self.mode
        data |= _rule_body(self.bands, self.on_degraded)
        for table_name in ("steps", "tools"):
            table: dict[str, Override] = getattr(self, table_name)
            if table:
                data[table_name] = {key: _rule_body(o.bands, o.on_degraded) for key, o in table.items()}
        text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100, default_flow_style=False)
        if header:
            text = "".join(f"# {line}".rstrip() + "\n" for line in header.splitlines()) + text
        return text

    def rule(self, *, step: str | None = None, tool: str | None = None) -> Rule:
        """The bands and fail-safe in force for a step and/or tool (tool overrides win)."""
        bands: Sequence[AnyBand] = self.bands
        on_degraded: AnyAction = self.on_degraded
        scope = f"policy '{self.name}'"
        for kind, key, table in (("step", step, self.steps), ("tool", tool, self.tools)):
            override = table.get(key) if key is not None else None
            if override is not None:
                scope = f"{kind} '{key}' of policy '{self.name}'"
                bands = override.bands if override.bands is not None else bands
                on_degraded = override.on_degraded if override.on_degraded is not None else on_degraded
        return Rule(tuple(bands), on_degraded, scope, tuple(band_edges(bands)))

    def match(self, estimate: Estimate, *, step: str | None = None, tool: str | None = None) -> Match:
        """Pick the action spec for an estimate without building a Decision (:meth:`decide` builds
        on it; integrations never need it: a :class:`~capgate.Decision` carries all its action needs)."""
        rule = self.rule(step=step, tool=tool)
        if estimate.p is None or estimate.degraded:
            spec = rule.on_degraded
            why = estimate.reason or "no value"
            reason = tpl.DEGRADED_REASON.format(why=why, scope=rule.scope, action=spec.action)
            return Match(spec, rule, None, True, reason)
        index = rule.band_index(estimate.p)
        spec = rule.bands[index]
        reason = tpl.BAND_REASON.format(
            p=estimate.p, index=index, interval=rule.interval(index), scope=rule.scope, action=spec.action
        )
        return Match(spec, rule, index, False, reason)

    def decide(self, estimate: Estimate, *, step: str | None = None, tool: str | None = None) -> Decision:
        """Decide what to do with a query given its capability estimate.

        Degraded estimates (no value, or ``degraded=True``) go to the ``on_degraded`` fail-safe and
        the decision records ``degraded=True`` with the estimate's reason.

        Args:
            estimate: The capability estimate for the query.
            step: The agent step the query comes from (selects a step override).
            tool: The tool whose call is gated (selects a tool override; wins over the step).

        Returns:
            The decision, self-contained: the user/human text rendered, and for ``resample`` the
            budget and sampling plan, for ``escalate`` the hand-off target ``to``.

        Examples:
            >>> from capgate import Estimate
            >>> policy = Policy(name="t", bands=0.5, on_degraded="abstain")
            >>> policy.decide(Estimate(p=0.8, method="probe")).action
            'answer'
        """
        found = self.match(estimate, step=step, tool=tool)
        spec = found.spec
        texts = {
            "method": estimate.method,
            "reason": found.reason,
            "step": step if step is not None else tpl.NOT_GIVEN,
            "tool": tool if tool is not None else tpl.NOT_GIVEN,
            "policy": self.name,
        }
        template = message_template(spec)
        message = None if template is None else render(template, estimate.p, **texts)
        plan = spec.plan(estimate.p) if isinstance(spec, ResampleAction) else None
        route_plan = spec.plan(found.rule.route_edge(spec)) if isinstance(spec, RouteAction) else None
        return Decision(
            action=spec.action,
            estimate=estimate,
            degraded=found.degraded,
            reason=found.reason,
            message=message,
            budget=plan.max_samples if plan is not None else None,
            plan=plan,
            to=spec.to if isinstance(spec, EscalateAction) else None,
            route_plan=route_plan,
            policy=self.name,
            policy_version=self.version,
            step=step,
            tool=tool,
        )

    def with_answer_threshold(
        self, threshold: float, *, step: str | None = None, tool: str | None = None
    ) -> tuple[Policy, list[str]]:
        """A copy whose answer band starts at ``threshold`` (p >= threshold answers).

        Edits the rule in force for ``tool`` / ``step`` (an override without bands of its own gets a
        copy of the inherited ones), whose top band must answer: the band below it is stretched or
        clipped to end at the threshold, a band wholly at or above the threshold is dropped; a rule
        that answered everything gets an ``abstain`` band below a threshold above 0.

        Returns:
            The new policy and human-readable notes on what changed.

        Raises:
            ValueError: ``threshold`` outside [0, 1], or the top band of the rule does not answer.

        Examples:
            >>> policy = Policy(name="t", bands=0.5, on_degraded="abstain")
            >>> new, notes = policy.with_answer_threshold(0.8)
            >>> new.rule().edges
            ((0.0, 0.8), (0.8, 1.0))
        """
        check_unit_interval("threshold", threshold)
        rule = self.rule(step=step, tool=tool)
        top = rule.bands[-1]
        if top.action != "answer":
            raise ValueError(
                f"the top band of {rule.scope} must answer to set an answer threshold; it is {top.action!r}"
            )
        notes: list[str] = []
        new_bands: list[dict[str, Any]] = []
        lower_bands = list(zip(rule.bands[:-1], rule.edges[:-1], strict=True))
        kept = [(band, edge) for band, edge in lower_bands if edge[0] < threshold]
        for band, (lower, upper) in lower_bands:
            if lower >= threshold:
                notes.append(
                    f"dropped {band.action} band [{fmt(lower)}, {fmt(upper)}): it lies at or above "
                    f"the answer threshold {fmt(threshold)}"
                )
        for i, (band, (lower, upper)) in enumerate(kept):
            new_upper = threshold if i == len(kept) - 1 else upper
            if new_upper != upper:
                notes.append(f"{band.action} band [{fmt(lower)}, {fmt(upper)}) now ends at {fmt(new_upper)}")
            new_bands.append({"below": new_upper, **_band_body(band)})
        if not kept and threshold > 0:  # a rule that answered everything: below the threshold, abstain
            new_bands.append({"below": threshold, "action": "abstain"})
            notes.append(f"added an abstain band [0, {fmt(threshold)}): the rule answered every p")
        new_bands.append(_band_body(top))
        data = self.model_dump(mode="python")  # in full: a setting written as null stays null
        if tool is not None:
            data["tools"].setdefault(tool, {})["bands"] = new_bands
        elif step is not None:
            data["steps"].setdefault(step, {})["bands"] = new_bands
        else:
            data["bands"] = new_bands
        return Policy.model_validate(data), notes


def _action_body(spec: AnyAction) -> dict[str, Any]:
    """An action as written in a policy file: its tag and the settings not at their defaults (but a stop
    rule's ``rule`` tag, always: read back without it, a paper rule would be taken for capgate's)."""
    settings = spec.model_dump(mode="json", exclude_defaults=True, exclude={"action", "below", "at_least"})
    gap = settings.get("stop", {}).get("confidence_gap")
    if isinstance(spec, ResampleAction) and spec.stop.confidence_gap is not None and isinstance(gap, dict):
        settings["stop"]["confidence_gap"] = {"rule": spec.stop.confidence_gap.rule, **gap}
    return {"action": spec.action, **settings}


def _bands_body(bands: Sequence[AnyBand]) -> list[dict[str, Any]]:
    """Bands as written in a policy file: each with its upper edge as ``below`` but the last."""
    edges = band_edges(bands)
    out: list[dict[str, Any]] = []
    for i, band in enumerate(bands):
        item: dict[str, Any] = {} if i == len(bands) - 1 else {"below": edges[i][1]}
        item.update(_action_body(band))
        out.append(item)
    return out


def _rule_body(bands: Sequence[AnyBand] | None, on_degraded: AnyAction | None) -> dict[str, Any]:
    """The ``bands`` and ``on_degraded`` given (of a policy or an override) as written in a file."""
    body: dict[str, Any] = {}
    if bands is not None:
        body["bands"] = _bands_body(bands)
    if on_degraded is not None:
        body["on_degraded"] = _action_body(on_degraded)
    return body


def _band_body(band: AnyBand) -> dict[str, Any]:
    """A band's action settings, without its edges."""
    return band.model_dump(mode="python", exclude={"below", "at_least"})
