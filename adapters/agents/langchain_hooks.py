"""capgate in LangChain's own hooks: approval on low capability, a decision model, model routing.

* :class:`CapabilityApproval`: a ``when`` predicate for ``HumanInTheLoopMiddleware``'s
  ``InterruptOnConfig`` that asks a human only when capability is low, or unknown (fail closed).
* :class:`CapgateDecisionModel`: a ``langchain_core.decisions.BaseDecisionModel`` answering with
  capability estimates, so capgate stands wherever LangChain takes a decision model.
* :func:`choose_model_by_capability`: LangChain's ``ModelRouterMiddleware`` with that decision
  model as its classifier: each run goes to the cheapest model choice predicted capable (one
  estimator per choice, ``routes``), else to the strongest.

The *edge* is the lower edge of the policy's answer band for the step or tool (``edge=`` sets it
instead). Install with ``pip install 'capgate[langchain]'``.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Unpack

from langchain.agents.middleware import ModelChoice, ModelRouterMiddleware
from langchain_core.decisions import (
    BaseDecisionModel,
    Choice,
    ChoiceAnswer,
    ClassifierResponse,
    Noul,
    NoulAnswer,
    Question,
    Score,
    ScoreAnswer,
    State,
)
from langchain_core.messages import BaseMessage
from pydantic import ConfigDict, PrivateAttr

from capgate.adapters.agents.hitl import tool_call_query
from capgate.core.backend import Prompt
from capgate.core.messages import as_query, chat_messages
from capgate.core.types import Estimate, RoutePlan
from capgate.errors import CapgateError, SettingsError
from capgate.gate import Gate, GateOptions, Verdict
from capgate.gate.flow import Assess, Flow, Record, Route, adrive, drive

__all__ = [
    "ROUTER_INSTRUCTIONS",
    "CapabilityApproval",
    "CapabilityUnavailableError",
    "CapgateDecisionModel",
    "choose_model_by_capability",
]

ROUTER_INSTRUCTIONS = (
    "Choose the least costly model predicted to answer this correctly; the choices are listed cheapest first."
)
"""The router's ``instructions`` (capgate routes by its estimators and does not read them)."""


class CapabilityUnavailableError(CapgateError, RuntimeError):
    """No capability estimate could be had, so a probability cannot be given (never a silent 0.5)."""


def _edge(gate: Gate, edge: float | None, *, tool: str | None = None) -> float:
    if edge is not None:
        return edge
    rule = gate.resolve_policy().rule(step=gate.settings.step, tool=tool or gate.settings.tool)
    found = rule.answer_edge
    if found is None:
        raise SettingsError(
            f"the top band of {rule.scope} does not answer, so it has no answer edge; pass edge=..."
        )
    return found


def _check_edge(edge: object) -> float | None:
    if edge is None:
        return None
    if isinstance(edge, bool) or not isinstance(edge, int | float) or not 0.0 <= edge <= 1.0:
        raise SettingsError(f"`edge` must be a number in [0, 1] or None; got {edge!r}")
    return float(edge)


def _clears(estimate: Estimate, edge: float) -> bool:
    return estimate.p is not None and not estimate.degraded and estimate.p >= edge


def _assess_flow(gate: Gate, query: Prompt) -> Flow[Verdict]:
    verdict: Verdict = yield Assess(gate, query)
    yield Record(gate, verdict, samples_used=0)
    return verdict


class CapabilityApproval:
    """A ``when`` predicate for ``InterruptOnConfig``: ask a human only when capability is low.

    ``HumanInTheLoopMiddleware(interrupt_on={"send_email": InterruptOnConfig(
    allowed_decisions=["approve", "reject"], when=CapabilityApproval(estimator=probe))})``
    interrupts a ``send_email`` call when the predicted capability of the step (the conversation,
    then the call) is below the edge, or when no estimate can be had (a degraded estimate, or an
    estimator that raised: fail closed; a :class:`~capgate.SettingsError` is raised, not asked).
    Each estimate is a gate decision (counted, logged, traced) with ``tool=`` the call's name, so
    the policy's ``tools:`` overrides apply. In shadow mode no call asks: the decision is made and
    logged beside it.

    LangChain calls the predicate again when the run resumes; the answer for a tool call id is
    kept (per thread, the last 512), so it does not flip between the interrupt and the resume.
    The predicate is synchronous (LangChain's ``when`` is): in an async run the estimator's
    sync ``estimate`` runs.

    Args:
        gate: A ready :class:`~capgate.Gate` (or give the settings instead).
        edge: The capability below which a human approves (default: the lower edge of the
            answer band of the policy's rule for the tool).
        messages_key: State key of the conversation.
        **settings: The gate settings (:class:`~capgate.gate.GateOptions`).

    Attributes:
        last_verdict: The verdict of the latest call estimated; ``None`` when its decision could
            not be had (a remembered answer on resume leaves it as it was).

    Raises:
        SettingsError: A bad setting, or (at call time) a rule without an answer band and no
            ``edge``.
    """

    def __init__(
        self,
        *,
        gate: Gate | None = None,
        edge: float | None = None,
        messages_key: str = "messages",
        **settings: Unpack[GateOptions],
    ) -> None:
        self.gate = Gate.coerce(gate, **settings)
        self.edge = _check_edge(edge)
        self.messages_key = messages_key
        self._memo: OrderedDict[tuple[str | None, str], bool] = OrderedDict()
        self.last_verdict: Verdict | None = None

    def __repr__(self) -> str:
        return f"CapabilityApproval(gate={self.gate!r}, edge={self.edge!r})"

    @staticmethod
    def _thread(request: Any) -> str | None:
        config = getattr(getattr(request, "runtime", None), "config", None) or {}
        value = config.get("configurable", {}).get("thread_id") if isinstance(config, Mapping) else None
        return None if value is None else str(value)

    def __call__(self, request: Any) -> bool:
        """True (ask a human) when the call's predicted capability is below the edge or unknown."""
        call = request.tool_call
        key = (self._thread(request), str(call.get("id")))
        if key in self._memo:
            return self._memo[key]
        tool = str(call["name"])
        edge = _edge(self.gate, self.edge, tool=tool)
        state = request.state
        messages = state.get(self.messages_key) if isinstance(state, Mapping) else None
        gate = self.gate.with_options(tool=tool)
        self.last_verdict = None  # set below only when this call's decision is had
        try:
            verdict = drive(_assess_flow(gate, tool_call_query(messages or [], call)))
        except SettingsError:  # a misconfigured gate is an error, not a reason to ask
            raise
        except Exception:  # no decision could be had (say, a fail-closed log down): a human decides
            ask = True
        else:
            self.last_verdict = verdict
            # shadow mode: the call proceeds (the real decision is made and logged beside it)
            ask = verdict.pending is None and not _clears(verdict.estimate, edge)
        self._memo[key] = ask
        while len(self._memo) > 512:
            self._memo.popitem(last=False)
        return ask


def _state_query(state: State) -> Prompt:
    """The query a decision model estimates: text, a message, messages, or ``{"messages": ...}``."""
    if isinstance(state, str):
        return as_query(state, where="state")
    if isinstance(state, BaseMessage):
        return chat_messages([state], where="state")
    if isinstance(state, Mapping) and "messages" in state:
        return chat_messages(state["messages"], where="state['messages']")
    if isinstance(state, Sequence) and state and all(isinstance(m, BaseMessage) for m in state):
        return chat_messages(list(state), where="state")
    raise ValueError(
        "capgate's decision model estimates a query: give the state as text, a message, a list of "
        f"messages or a mapping with 'messages'; got {type(state).__name__}"
    )


def _score(p: float, levels: int) -> ScoreAnswer:
    """p on a rubric of ``levels`` ordered levels: Binomial(levels - 1, p) over the levels."""
    n = levels - 1
    probabilities = {k: math.comb(n, k) * p**k * (1.0 - p) ** (n - k) for k in range(levels)}
    return ScoreAnswer(
        type="score",
        score=n * p,
        legend={},
        probabilities=probabilities,
        confidence=max(probabilities.values()),
    )


class CapgateDecisionModel(BaseDecisionModel):
    """A LangChain decision model answering with capgate's capability estimates.

    * ``Noul``: the probability of *yes* is the predicted capability p of the query (the state):
      capgate answers the one question it knows, "will the model answer this correctly?", so
      every Noul asked of it is read as that question.
    * ``Score``: p on the rubric, levels from least to most capable: the level distribution is
      Binomial(levels − 1, p), so the expected score is (levels − 1)·p and 2 levels give p.
    * ``Choice``: the criteria's labels are model choices, cheapest first; the answer is the
      cheapest whose estimator (``routes``) predicts a capability at or above the edge, else the
      strongest (the last). ``probabilities`` are those of that rule (1 for the choice) and
      ``confidence`` is the chosen model's predicted capability (0 when it has none).
    * ``Box``: not answered (``ValueError``).

    A Noul or Score whose estimate cannot be had raises :class:`CapabilityUnavailableError` (LangChain
    propagates classifier failures and ends the run): capgate never answers 0.5 for "unknown".
    Each estimate is a gate decision (counted, logged, traced). Its answer *is* the estimate, so
    there is no call to let proceed beside it: it decides in enforce mode whatever the gate's
    ``mode`` (a shadow gate's stand-in has no estimate).

    Args:
        gate: A ready :class:`~capgate.Gate` (or give the settings, ``routes`` included).
        model: Name reported as the decision model (default: the estimator's target, else
            ``"capgate"``).
        edge: The capability a choice must reach (default: the policy's answer edge).
        **settings: The gate settings (:class:`~capgate.gate.GateOptions`).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    model: str = "capgate"
    edge: float | None = None
    _gate: Gate = PrivateAttr()
    _decider: Gate = PrivateAttr()

    def __init__(
        self,
        *,
        gate: Gate | None = None,
        model: str | None = None,
        edge: float | None = None,
        **settings: Unpack[GateOptions],
    ) -> None:
        the_gate = Gate.coerce(gate, **settings)
        if model is None:
            estimator = the_gate.settings.estimator
            model = the_gate.settings.target or (estimator.target_model if estimator else None) or "capgate"
        super().__init__(model=model, edge=_check_edge(edge))
        self._gate = the_gate
        self._decider = the_gate.with_options(mode="enforce")

    @property
    def gate(self) -> Gate:
        """The gate that estimates and records."""
        return self._gate

    @property
    def _provider(self) -> str:
        return "capgate"

    @property
    def _llm_type(self) -> str:
        return "capgate-decision-model"

    def _plan(self, question: Choice) -> RoutePlan:
        return RoutePlan(choices=tuple(question.criteria), edge=_edge(self._gate, self.edge))

    def _answers(
        self,
        questions: Mapping[str, Question],
        verdict: Verdict | None,
        routes: Mapping[str, tuple[str, RoutePlan, str]],
    ) -> ClassifierResponse:
        answers: dict[str, Any] = {}
        for key, question in questions.items():
            if isinstance(question, Choice):
                name, plan, _ = routes[key]
                probabilities = {label: float(label == name) for label in question.criteria}
                confidence = plan.p.get(name) or 0.0
                answers[key] = ChoiceAnswer(
                    type="choice", choice=name, probabilities=probabilities, confidence=confidence
                )
                continue
            assert verdict is not None
            estimate = verdict.estimate
            if estimate.p is None or estimate.degraded:
                raise CapabilityUnavailableError(
                    f"no capability estimate for question {key!r}: {estimate.reason or 'no value'}"
                )
            if isinstance(question, Noul):
                answers[key] = NoulAnswer(type="noul", noul=estimate.p)
            else:
                assert isinstance(question, Score)
                score = _score(estimate.p, len(question.criteria))
                legend = dict(enumerate(question.criteria))
                answers[key] = score.model_copy(update={"legend": legend})
        usage, request_id = None, None
        if verdict is not None:
            cost = verdict.estimate.cost
            usage = {"input_tokens": cost.prompt_tokens, "output_tokens": cost.completion_tokens}
            request_id = verdict.decision.id
        return ClassifierResponse.model_validate(
            {"model": self.model, "answers": answers, "usage": usage, "request_id": request_id}
        )

    @staticmethod
    def _check(questions: Mapping[str, Question]) -> None:
        if not questions:
            raise ValueError("`questions` must not be empty")
        for key, question in questions.items():
            if not isinstance(question, Noul | Score | Choice):
                raise ValueError(
                    f"question {key!r}: capgate answers Noul, Score and Choice questions; "
                    f"got {type(question).__name__}"
                )

    def _classify_flow(self, state: State, questions: dict[str, Question]) -> Flow[ClassifierResponse]:
        self._check(questions)
        query = _state_query(state)
        verdict = None
        if any(not isinstance(q, Choice) for q in questions.values()):
            verdict = yield from _assess_flow(self._decider, query)
        routes: dict[str, tuple[str, RoutePlan, str]] = {}
        for key, q in questions.items():
            if isinstance(q, Choice):
                routes[key] = yield Route(self._decider, query, self._plan(q))
        return self._answers(questions, verdict, routes)

    def _classify(self, state: State, questions: dict[str, Question]) -> ClassifierResponse:
        return drive(self._classify_flow(state, questions))

    async def _aclassify(self, state: State, questions: dict[str, Question]) -> ClassifierResponse:
        return await adrive(self._classify_flow(state, questions))


def choose_model_by_capability(
    choices: Mapping[str, ModelChoice | Any],
    *,
    gate: Gate | None = None,
    edge: float | None = None,
    instructions: str = ROUTER_INSTRUCTIONS,
    **settings: Unpack[GateOptions],
) -> ModelRouterMiddleware:
    """LangChain's ``ModelRouterMiddleware`` routing by capability: the cheapest capable choice.

    Args:
        choices: Model choices, **cheapest first** (the last is the strongest, the fallback):
            ``ModelChoice`` s, or bare chat models / model strings (their criteria are then their
            names).
        gate: A ready gate whose ``routes`` has an estimator per choice (or give the settings:
            ``routes={name: estimator}``, ``policy``...).
        edge: The capability a choice must reach (default: the policy's answer edge).
        instructions: The router's instructions (capgate does not read them).
        **settings: The gate settings (:class:`~capgate.gate.GateOptions`).

    Returns:
        The middleware; put it in ``create_agent(..., middleware=[...])``. Each run's answer is
        kept in state (``model_route``), the choice's predicted capability as its ``confidence``.

    Raises:
        SettingsError: A choice without an estimator in ``routes``, or a bad setting.
    """
    classifier = CapgateDecisionModel(gate=gate, edge=edge, **settings)
    routes = classifier.gate.settings.routes or {}
    missing = [name for name in choices if name not in routes]
    if missing:
        names = ", ".join(map(repr, missing))
        raise SettingsError(f"each model choice needs a capability estimator in `routes`; none for {names}")
    full = {
        name: choice if isinstance(choice, ModelChoice) else ModelChoice(model=choice, criteria=name)
        for name, choice in choices.items()
    }
    return ModelRouterMiddleware(choices=full, instructions=instructions, classifier=classifier)
