"""LangGraph integration: capability nodes, a branch on the decision, a gated answer subgraph with human
escalation, and a tool-call gate for ``ToolNode``.

* :func:`capability_node` estimates the capability of the step's query (read from graph state)
  and writes the estimate and the policy's decision into state (as JSON dicts).
* :func:`branch_on_decision` (or :func:`decision_branch` for another key) branches on the
  decided action in ``add_conditional_edges``.
* :func:`capability_subgraph` returns an **uncompiled** ``StateGraph`` (estimate → answer | abstain
  | clarify | escalate | resample) to compile with your checkpointer. With a durable one
  (``SqliteSaver``) a pending escalation survives the process: a new process resumes it from the
  same ``thread_id``.
* :class:`ToolCallGate` gates tool calls in ``ToolNode(..., wrap_tool_call=...)``.

Install with ``pip install 'capgate[langgraph]'``.

Examples:
    >>> from langchain_core.messages import AIMessage, HumanMessage
    >>> from langgraph.checkpoint.memory import InMemorySaver
    >>> from langgraph.types import Command
    >>> from capgate import Estimate
    >>> from capgate.estimators import CapabilityEstimator, query_text
    >>> class Hard(CapabilityEstimator):
    ...     method = "demo"
    ...     def estimate(self, queries):
    ...         return [Estimate(p=0.75 if "prove" in query_text(q) else 0.95, method=self.method)
    ...                 for q in queries]
    >>> def answer(state):
    ...     return {"messages": [AIMessage("It is 4.")]}
    >>> graph = capability_subgraph(answer, policy="conservative", estimator=Hard())
    >>> app = graph.compile(checkpointer=InMemorySaver())
    >>> config = {"configurable": {"thread_id": "t1"}}
    >>> out = app.invoke({"messages": [HumanMessage("Please prove it.")]}, config)
    >>> out["__interrupt__"][0].value["kind"]
    'escalate'
    >>> out = app.invoke(Command(resume={"decision": "reply", "message": "A human says: yes."}), config)
    >>> out["messages"][-1].content
    'A human says: yes.'
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Annotated, Any, TypeAlias, Unpack, cast

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langchain_core.runnables import Runnable, RunnableConfig, RunnableLambda
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Command
from typing_extensions import TypedDict

from capgate._util.validate import check_int_at_least
from capgate.adapters.agents.hitl import (
    ClarifyRequest,
    ClarifyResponse,
    EscalationRequest,
    EscalationResponse,
    ToolCallGate,
    ask_clarification,
    ask_review,
    decision_records,
    read_decision,
    review_reply,
    state_value,
)
from capgate.adapters.backends.function import response_text
from capgate.core.backend import Prompt
from capgate.core.messages import as_query, chat_messages
from capgate.core.types import Action, Decision
from capgate.errors import SettingsError
from capgate.gate import Gate, Gated, GateOptions, Verdict
from capgate.gate.flow import Assess, Flow, Invoke, Record, Sample, adrive, drive

__all__ = [
    "ACTIONS",
    "CapabilityState",
    "ClarifyRequest",
    "ClarifyResponse",
    "EscalationRequest",
    "EscalationResponse",
    "QuerySource",
    "ToolCallGate",
    "branch_on_decision",
    "capability_node",
    "capability_subgraph",
    "decision_branch",
    "read_decision",
]

ACTIONS: tuple[Action, ...] = ("answer", "abstain", "clarify", "escalate", "resample", "route")
"""The routes out of a capability node, one per policy action."""

QuerySource: TypeAlias = str | Callable[[Mapping[str, Any]], object]
"""Where a node finds the query: a state key (its value is a prompt string or messages), or a
function of the state returning one."""


class CapabilityState(TypedDict, total=False):
    """Graph state used by :func:`capability_subgraph` (extend it for your own graph).

    Attributes:
        messages: The conversation (LangGraph's ``add_messages`` reducer).
        capgate_estimate: The last capability estimate, as JSON.
        capgate_decision: The last decision, as JSON (read it with :func:`read_decision`).
        capgate_human: The last human response (clarification or review), as JSON.
        capgate_cas: Summary of the last resample run (answer, votes, samples used), as JSON.
        capgate_clarifications: Clarifying questions answered so far in the current step.
    """

    messages: Annotated[list[AnyMessage], add_messages]
    capgate_estimate: dict[str, Any] | None
    capgate_decision: dict[str, Any] | None
    capgate_human: dict[str, Any] | None
    capgate_cas: dict[str, Any] | None
    capgate_clarifications: int


_ROUNDS = "capgate_clarifications"
_MISSING = object()


def _reader(query: QuerySource | None) -> Callable[[Any], Prompt]:
    source: QuerySource = "messages" if query is None else query
    if isinstance(source, str):
        key = source

        def read(state: Any) -> Prompt:
            value = state_value(state, key, _MISSING)
            if value is _MISSING:
                raise KeyError(f"the capability node reads the query from state[{key!r}], which is missing")
            return as_query(value, where=f"state[{key!r}]")

        return read
    if callable(source):
        fn = source
        return lambda state: as_query(fn(state), where="the query function's value")
    raise TypeError(f"`query` must be a state key or a function of the state; got {query!r}")


def capability_node(
    *,
    gate: Gate | None = None,
    query: QuerySource | None = None,
    estimate_key: str = "capgate_estimate",
    decision_key: str = "capgate_decision",
    **settings: Unpack[GateOptions],
) -> Runnable[Any, dict[str, Any]]:
    """A node that estimates the step's capability and writes the estimate and decision to state.

    The node works in sync and async graphs (``invoke`` / ``ainvoke``; the async path uses the
    estimator's ``aestimate``). Its state (a ``TypedDict``, dataclass or Pydantic model) must have
    the two keys (see :class:`CapabilityState`).
    The decision is self-contained: branch on it (:func:`branch_on_decision`) and act on it later,
    also in another process, without the policy.

    Args:
        gate: A ready :class:`~capgate.Gate` (or give the settings instead).
        **settings: The gate settings (:class:`~capgate.gate.GateOptions`: ``policy``,
            ``estimator``, ``step``, ``tool``, ``on_block``, ``log``, ``extract``), as for
            :func:`capgate.guard`.
        query: Where the query is (default: ``state["messages"]``).
        estimate_key: State key for the estimate (JSON).
        decision_key: State key for the decision (JSON).

    Returns:
        A runnable to pass to ``StateGraph.add_node``.
    """
    the_gate = Gate.coerce(gate, **settings)
    return _estimate_node(the_gate, _reader(query), estimate_key, decision_key)


def _estimate_node(
    gate: Gate, read: Callable[[Any], Prompt], estimate_key: str, decision_key: str, *, rounds: bool = False
) -> Runnable[Any, dict[str, Any]]:
    """The capability node; with ``rounds``, a decision other than ``clarify`` ends the step's
    clarifications (``capgate_clarifications`` back to 0)."""

    def flow(state: Any) -> Flow[dict[str, Any]]:
        verdict = yield Assess(gate, read(state))
        yield Record(gate, verdict)
        records = decision_records(verdict)
        update = {estimate_key: records["capgate_estimate"], decision_key: records["capgate_decision"]}
        if rounds and verdict.action != "clarify":
            update[_ROUNDS] = 0
        return update

    async def aestimate(state: Any) -> dict[str, Any]:
        return await adrive(flow(state))

    return RunnableLambda(lambda state: drive(flow(state)), afunc=aestimate, name="capgate_estimate")


def decision_branch(decision_key: str = "capgate_decision") -> Callable[[Any], Action]:
    """A path function for ``add_conditional_edges``: the action of the decision in state
    (named "branch", not "route": ``route`` is the policy action that chooses a model).

    Examples:
        >>> decision_branch("d")({"d": {"action": "clarify"}})
        'clarify'
    """

    def route(state: Any) -> Action:
        value = state_value(state, decision_key)
        if value is None:
            raise KeyError(f"no decision in state[{decision_key!r}]; run a capability node before routing")
        action = value.action if isinstance(value, Decision) else value.get("action")
        if action not in ACTIONS:
            raise ValueError(f"state[{decision_key!r}] has no valid action; got {action!r}")
        return action

    return route


branch_on_decision = decision_branch()
"""Branch on ``state["capgate_decision"]``: returns ``"answer"``, ``"abstain"``, ``"clarify"``,
``"escalate"``, ``"resample"`` or ``"route"``."""


AnswerNode: TypeAlias = Callable[..., Any] | Runnable[Any, Any]


def _update_text(update: object) -> str:
    """The text of an answer node's update: its last message's content (or a plain string)."""
    if isinstance(update, Mapping) and "messages" in update:
        messages = update["messages"]
        last = messages[-1] if isinstance(messages, Sequence) and messages else messages
        if isinstance(last, Mapping):
            return str(last.get("content", ""))
        return response_text(last)
    return response_text(update)


def _cas_summary(verdict: Verdict, cas: Any) -> dict[str, Any]:
    return {
        "answer": cas.answer,
        "votes": dict(cas.votes),
        "samples_used": cas.samples_used,
        "stop_reason": cas.stop_reason,
        "stopped_by": cas.stopped_by,
        "decision_id": verdict.decision.id,
    }


def capability_subgraph(
    answer: AnswerNode,
    *,
    gate: Gate | None = None,
    query: QuerySource | None = None,
    to_text: Callable[[Any], str] | None = None,
    state_schema: type[Any] = CapabilityState,
    max_clarifications: int = 2,
    **settings: Unpack[GateOptions],
) -> StateGraph[Any, Any, Any, Any]:
    """An uncompiled graph that answers only when the policy lets it.

    Nodes: ``estimate`` (a :func:`capability_node`) routes to

    * ``answer``: your node (a function of the state, sync or async, or a runnable) runs;
    * ``route``: your node runs too, and reads the model choice to call from the decision in
      state (``read_decision(state["capgate_decision"]).route``; the gate's ``routes`` give one
      estimator per choice);
    * ``resample``: your node runs repeatedly under CAS (each call one sample, answers grouped by
      ``extract`` over the text of the update's last message), within the decision's sampling
      plan; the winning update is applied and ``capgate_cas`` summarizes the vote;
    * ``abstain``: the policy's message is added as an AI message;
    * ``clarify``: ``interrupt()`` with a :class:`ClarifyRequest`; resume with
      ``Command(resume={"answer": "..."})``: the question and the answer join the conversation and
      the step is estimated again (a ``query`` state key other than ``messages`` is estimated
      followed by them), up to ``max_clarifications`` rounds; then the question is put to the
      user as the reply instead of another interrupt;
    * ``escalate``: ``interrupt()`` with an :class:`EscalationRequest` (its ``to`` is the
      decision's); resume with ``Command(resume={"decision": "reply" | "approve" | "reject",
      "message": ...})``: a reply is the answer, approve lets your node answer, reject declines.

    With ``on_block="raise"``, abstain / clarify / escalate (and a resample that found no answer)
    raise the matching :class:`~capgate.GateBlocked` out of the graph instead.

    Compile it yourself, with your checkpointer (interrupts need one)::

        app = capability_subgraph(answer, estimator=probe).compile(checkpointer=SqliteSaver(conn))

    Args:
        answer: The node that calls the model and returns a state update (``{"messages": [...]}``).
        gate: A ready gate (or give the settings instead).
        **settings: The gate settings, as for :func:`capability_node`.
        query: Where the query is (default: ``state["messages"]``).
        to_text: Reads the text of an update for voting (default: its last message's content).
        state_schema: The graph's state type (must have the keys of :class:`CapabilityState`).
        max_clarifications: Clarifying questions per step before the question is the reply.

    Returns:
        The uncompiled ``StateGraph``.

    Raises:
        SettingsError: A bad setting (``max_clarifications`` included).
    """
    the_gate = Gate.coerce(gate, **settings)
    if not (callable(answer) or isinstance(answer, Runnable)):
        raise TypeError(f"`answer` must be a node (a function of the state or a runnable); got {answer!r}")
    try:
        most = check_int_at_least("max_clarifications", max_clarifications, 0, "a non-negative integer")
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    read = _reader(query)
    own_key = isinstance(query, str) and query != "messages"

    def asked(state: Any) -> Prompt:
        """The step's query; a query key other than ``messages`` followed by this step's
        clarifications (the last two messages of each round)."""
        prompt = read(state)
        done = state_value(state, _ROUNDS) or 0
        if not (own_key and done):
            return prompt
        turns = chat_messages(
            list(state_value(state, "messages") or [])[-2 * done :], where="state['messages']"
        )
        return [*([{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt), *turns]

    read_text = to_text or _update_text
    graph: StateGraph[Any, Any, Any, Any] = StateGraph(state_schema)
    graph.add_node(
        "estimate", _estimate_node(the_gate, asked, "capgate_estimate", "capgate_decision", rounds=True)
    )
    graph.add_node("answer", answer)
    # the node as LangGraph runs it (``config`` / ``runtime`` given when it takes them), for the resample
    answer_node = cast("Runnable[Any, Any]", graph.nodes["answer"].runnable)

    def current(state: Any) -> Verdict:
        decision = read_decision(state_value(state, "capgate_decision"))
        if decision is None:
            raise KeyError("no decision in state['capgate_decision']; the estimate node must run first")
        return Verdict(decision=decision, query=read(state))

    def resample_flow(state: Any, config: RunnableConfig) -> Flow[dict[str, Any]]:
        verdict = current(state)
        draw = Invoke(lambda: answer_node.invoke(state, config), lambda: answer_node.ainvoke(state, config))
        sampled = yield Sample(the_gate, verdict, draw, to_text=read_text)
        yield Record(the_gate, verdict, cas=sampled.cas)
        summary = _cas_summary(verdict, sampled.cas)
        if sampled.value is None:
            gated = the_gate.block(verdict, cas=sampled.cas)
            return {"messages": [AIMessage(gated.message)], "capgate_cas": summary}
        update = dict(sampled.value) if isinstance(sampled.value, Mapping) else {"messages": [sampled.value]}
        update["capgate_cas"] = summary
        return update

    def resample(state: Any, config: RunnableConfig) -> dict[str, Any]:
        return drive(resample_flow(state, config))

    async def aresample(state: Any, config: RunnableConfig) -> dict[str, Any]:
        return await adrive(resample_flow(state, config))

    def blocked(state: Any) -> tuple[Verdict, Gated]:
        verdict = current(state)
        return verdict, the_gate.block(verdict)  # raises with on_block="raise"

    def abstain(state: Any) -> dict[str, Any]:
        return {"messages": [AIMessage(blocked(state)[1].message)]}

    def clarify(state: Any) -> Command[str]:
        verdict, gated = blocked(state)
        done = state_value(state, _ROUNDS) or 0
        if done >= most:  # out of rounds: the question is the reply
            return Command(goto=END, update={"messages": [AIMessage(gated.message)], _ROUNDS: 0})
        reply = ask_clarification(verdict)
        return Command(
            goto="estimate",
            update={
                "messages": [AIMessage(gated.message), HumanMessage(reply.answer)],
                "capgate_human": reply.model_dump(mode="json"),
                _ROUNDS: done + 1,
            },
        )

    def escalate(state: Any) -> Command[str]:
        verdict, _ = blocked(state)
        review = ask_review(verdict)
        record = review.model_dump(mode="json")
        if review.decision == "approve":
            return Command(goto="answer", update={"capgate_human": record})
        return Command(
            goto=END, update={"messages": [AIMessage(review_reply(review))], "capgate_human": record}
        )

    graph.add_node("resample", RunnableLambda(resample, afunc=aresample, name="resample"))
    graph.add_node("abstain", abstain)
    graph.add_node("clarify", clarify, destinations=("estimate", END))
    graph.add_node("escalate", escalate, destinations=("answer", END))
    graph.add_edge(START, "estimate")
    # A routed query is answered.
    targets: dict[Hashable, str] = {a: "answer" if a == "route" else a for a in ACTIONS}
    graph.add_conditional_edges("estimate", branch_on_decision, targets)
    for node in ("answer", "resample", "abstain"):
        graph.add_edge(node, END)
    return graph
