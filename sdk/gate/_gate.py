"""The :class:`Gate`: estimate a query's capability, let the policy decide, count, log and act."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar, Unpack

from capgate.cas.loop import CASResult
from capgate.core.backend import Prompt
from capgate.core.messages import as_query
from capgate.core.types import Estimate, Extractor, RoutePlan
from capgate.errors import SettingsError
from capgate.estimators.base import CapabilityEstimator
from capgate.gate._calibration import Calibrations, calibration_target
from capgate.gate._defaults import default_estimator, default_extract
from capgate.gate._effects import estimates_of
from capgate.gate._limits import Limits, Slots
from capgate.gate._record import spill_full, write_decision
from capgate.gate._results import Gated, Sampled, Verdict, blocked_error
from capgate.gate._settings import (
    PROMOTED,
    CalibrationLike,
    GateOptions,
    GateSettings,
    OnBlock,
    given_settings,
)
from capgate.gate._shadow import Shadows, astart_shadow, start_shadow
from capgate.gate._stats import GateStats
from capgate.gate.flow import (
    Assess,
    Flow,
    Invoke,
    Sample,
    Shadow,
    aperform,
    perform,
)
from capgate.policies import Policy, choose_route, load_policy

if TYPE_CHECKING:
    from capgate.decision.store.log import DecisionLog

T = TypeVar("T")


class _Shared:
    """What a gate and its :meth:`Gate.with_options` views share: stats, loaded policies, logs."""

    def __init__(self, settings: GateSettings) -> None:
        self.stats = GateStats()
        self.lock = threading.Lock()
        self.policies: dict[str, Policy] = {}
        self.logs: dict[str, DecisionLog] = {}
        self.slots = Slots()
        self.shadows = Shadows.for_gate(settings)  # its threads start now, not in a call
        self.calibrations = Calibrations()


class Gate:
    """Estimate, decide, count, log and act: the engine behind every capgate integration.

    The constructor only checks and stores its settings (:class:`~capgate.GateSettings`); the
    policy loads on first use. Per-call settings: :meth:`with_options`.

    Args:
        **settings: The gate's settings, each declared once (type, default, meaning) in
            :class:`~capgate.GateSettings`: ``policy``, ``estimator``, ``log``, ``mode``,
            ``max_concurrency``, ``estimate_timeout_s``, ``routes`` and the rest.

    Raises:
        SettingsError: A setting has a wrong value or type (the message names it), or the
            estimator predicts another model's capability than ``target``.

    Examples:
        >>> from capgate.estimators import ConstantPrior
        >>> gate = Gate(policy="balanced", estimator=ConstantPrior.from_mean(0.2, n_train=1))
        >>> verdict = gate.assess("Prove the Riemann hypothesis.")
        >>> verdict.action, gate.stats.calls
        ('abstain', 1)
        >>> gate.block(verdict).message
        "I can't answer this reliably (estimated chance of a correct answer: 20%)."
    """

    def __init__(self, **settings: Unpack[GateOptions]) -> None:
        self.settings = GateSettings().replace(**settings)
        self._shared = _Shared(self.settings)

    @classmethod
    def from_settings(cls, settings: GateSettings) -> Gate:
        """A gate with the given settings."""
        gate = cls.__new__(cls)
        gate.settings = settings
        gate._shared = _Shared(settings)
        return gate

    @classmethod
    def coerce(cls, gate: Gate | None = None, **settings: Unpack[GateOptions]) -> Gate:
        """``gate`` itself, or a new gate from ``settings``: the one check every integration makes.

        Args:
            gate: A ready gate, or ``None``.
            **settings: The integration's gate settings (:class:`~capgate.gate.GateOptions`),
                defaults for those not given.

        Raises:
            SettingsError: ``gate`` is not a Gate, or is given together with settings other than
                its own (the message names them), or a setting is wrong.
        """
        if gate is None:
            return cls.from_settings(GateSettings().replace(**settings))
        if not isinstance(gate, Gate):
            raise SettingsError(f"`gate` must be a capgate Gate; got {gate!r}")
        given = given_settings(gate.settings, **settings)
        if given:
            msg = f"pass either gate= or the gate settings, not both; also got {', '.join(given)}"
            raise SettingsError(msg)
        return gate

    def with_options(self, **changes: Unpack[GateOptions]) -> Gate:
        """The same gate with some settings changed: shares its stats, loaded policies and logs.

        Takes every setting the constructor takes (:class:`~capgate.gate.GateOptions`); ``None``
        clears ``step`` / ``tool``, :data:`~capgate.gate.UNSET` keeps the gate's value.

        Examples:
            >>> gate = Gate(policy="balanced", tool="refund")
            >>> view = gate.with_options(step="draft", tool=None)
            >>> (view.settings.step, view.settings.tool, view.stats is gate.stats)
            ('draft', None, True)
        """
        settings = self.settings.replace(**changes)
        if settings is self.settings:
            return self
        view = Gate.__new__(Gate)
        view.settings = settings
        view._shared = self._shared
        return view

    def __repr__(self) -> str:
        s = self.settings
        policy = s.policy.name if isinstance(s.policy, Policy) else str(s.policy)
        return (
            f"Gate(policy={policy!r}, estimator={s.estimator!r}, on_block={s.on_block!r}, "
            f"step={s.step!r}, tool={s.tool!r})"
        )

    @property
    def stats(self) -> GateStats:
        """What this gate (and every view of it) has done so far."""
        return self._shared.stats

    @property
    def on_block(self) -> OnBlock:
        """The gate's ``on_block`` setting."""
        return self.settings.on_block

    @property
    def extract(self) -> Extractor:
        """The answer extractor in force for resample votes."""
        return self.settings.extract or default_extract

    @property
    def log(self) -> DecisionLog | None:
        """The decision log in force (a path is opened once and shared by every view)."""
        from capgate.decision.store.log import DecisionLog

        log = self.settings.log
        if log is None or isinstance(log, DecisionLog):
            return log
        key = str(log)
        with self._shared.lock:
            if key not in self._shared.logs:
                self._shared.logs[key] = DecisionLog(log)
            return self._shared.logs[key]

    def resolve_policy(self) -> Policy:
        """The policy in force: a calibration's thresholds (``GateSettings.calibrated_policy``),
        else the ``policy`` setting (a preset or file is loaded once)."""
        calibration = self.calibration()
        if calibration is not None and (
            chosen := self.settings.calibrated_policy(
                calibration.version, self._shared.calibrations.policy(calibration)
            )
        ):
            return chosen
        own = self.settings.policy
        if isinstance(own, Policy):
            return own
        key = str(own)
        with self._shared.lock:
            if key not in self._shared.policies:
                self._shared.policies[key] = load_policy(own)
            return self._shared.policies[key]

    def calibration(self) -> CalibrationLike | None:
        """The calibration the gate decides under (loaded on first use); ``None``: uncalibrated."""
        setting = self.settings.calibration
        if setting is None:
            return None
        return self._shared.calibrations.resolve(
            setting, PROMOTED, self.log, calibration_target(self.settings)
        )

    def resolve_estimator(self) -> CapabilityEstimator:
        """The estimator in force (under the gate's :meth:`calibration`, if any).

        Raises:
            SettingsError: None was given and no default is set.
        """
        own = self.settings.estimator
        chosen = own if own is not None else default_estimator()
        if chosen is None:
            raise SettingsError(
                "no capability estimator: pass estimator=... (any capgate CapabilityEstimator) or "
                "call capgate.set_default_estimator(...)"
            )
        return self._shared.calibrations.applied(self.calibration(), chosen, self.settings)

    @property
    def limits(self) -> Limits:
        """The bounds on each estimate this gate makes (``max_concurrency``, ``estimate_timeout_s``)."""
        s = self.settings
        return Limits(self._shared.slots, s.max_concurrency, s.estimate_timeout_s)

    def estimates_flow(self, estimator: CapabilityEstimator, queries: list[Prompt]) -> Flow[list[Estimate]]:
        """One call of ``estimator`` within :attr:`limits`, failing closed (see ``estimates_of``)."""
        return estimates_of(estimator, queries, self.limits)

    @staticmethod
    def _one(estimates: object, estimator: CapabilityEstimator | None) -> Estimate:
        if not (isinstance(estimates, list) and len(estimates) == 1 and isinstance(estimates[0], Estimate)):
            raise TypeError(
                f"{type(estimator).__name__}.estimate([query]) must return a list of one Estimate; "
                f"got {estimates!r}"
            )
        return estimates[0]

    def decide_on(
        self,
        query: Prompt,
        estimates: object,
        estimator: CapabilityEstimator | None,
        *,
        shadow_of: str | None = None,
    ) -> Verdict:
        """The policy's verdict on ``estimator``'s one estimate of ``query`` (counted in :attr:`stats`);
        ``shadow_of``: a shadow decision, with that id.

        Raises:
            TypeError: ``estimates`` is not a list of one :class:`~capgate.Estimate`.
            SettingsError: The estimator predicts another model than the gate's ``target``.
        """
        estimate = self._one(estimates, estimator)
        target, override = (
            (self.settings.target, False)
            if estimator is None
            else self.settings.target_check(self._shared.calibrations.for_target(estimator))
        )
        decision = self.resolve_policy().decide(estimate, step=self.settings.step, tool=self.settings.tool)
        extra: dict[str, object] = {} if shadow_of is None else {"id": shadow_of, "shadow": True}
        if (calibration := self.calibration()) is not None:
            extra["calibration"] = calibration.version
        if target is not None:
            extra |= {"target": target, "target_override": override}
            if override and estimator is not None:
                note = f"the estimator predicts {estimator.target_model!r}'s capability (allow_other_target)"
                extra["reason"] = f"{decision.reason}; {note}"
        decision = decision.model_copy(update=extra) if extra else decision
        self.stats.decided(decision)
        return Verdict(decision=decision, query=query)

    def in_shadow(self) -> bool:
        """Whether this gate decides in shadow mode (its ``mode``, else its policy's)."""
        return (self.settings.mode or self.resolve_policy().mode) == "shadow"

    def assess_flow(self, query: object, *, where: str | None = None) -> Flow[Verdict]:
        """The flow of :meth:`assess` (:class:`~capgate.gate.flow.Assess`), for integrations that
        compose it; in shadow mode, the stand-in ``answer`` verdict (decided beside the call)."""
        q = as_query(query, where=where or "query")
        if self.in_shadow():
            shadowed: Verdict = yield Shadow(self, q)
            return shadowed
        return (yield from self.decide_flow(q))

    def decide_flow(self, query: Prompt, *, shadow_of: str | None = None) -> Flow[Verdict]:
        """Estimate, decide and route in enforce mode (:class:`~capgate.gate.flow.Decide`)."""
        estimator = self.resolve_estimator()
        estimates = yield from self.estimates_flow(estimator, [query])
        verdict = self.decide_on(query, estimates, estimator, shadow_of=shadow_of)
        plan = verdict.decision.route_plan
        if plan is not None:
            route, filled, why = yield from self.route_flow(query, plan)
            decision = verdict.decision
            update = {"route": route, "route_plan": filled, "reason": f"{decision.reason}; {why}"}
            verdict = Verdict(decision=decision.model_copy(update=update), query=query)
            self.stats.routed(verdict.decision)
        return verdict

    def assess(self, query: object) -> Verdict:
        """Estimate the query's capability and decide (counted in :attr:`stats`, not logged).

        Args:
            query: A prompt string or chat messages (see :func:`capgate.core.messages.as_query`).

        Returns:
            The self-contained decision and the normalized query. Degraded estimates follow the
            policy's ``on_degraded`` and the decision records it.
        """
        verdict: Verdict = perform(Assess(self, query))
        return verdict

    async def aassess(self, query: object) -> Verdict:
        """Async twin of :meth:`assess` (uses the estimator's ``aestimate``)."""
        verdict: Verdict = await aperform(Assess(self, query))
        return verdict

    def shadow(self, query: Prompt) -> Verdict:
        """Start a shadow decision on ``query`` in a worker thread; return the stand-in ``answer``."""
        return start_shadow(self, query, self._shared.shadows)

    async def ashadow(self, query: Prompt) -> Verdict:
        """Async twin of :meth:`shadow` (an estimator with only a native async path: decided by a
        task of the running loop; see :mod:`capgate.gate._shadow`)."""
        return astart_shadow(self, query, self._shared.shadows)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until the shadow decisions made in threads are made and logged (``False``: time-out);
        those made by tasks of an event loop: ``await`` :meth:`aflush`."""
        return self._shared.shadows.wait(timeout)

    async def aflush(self) -> None:
        """Wait until every shadow decision of this gate is made and logged."""
        await self._shared.shadows.await_all()

    def route_estimators(self, plan: RoutePlan) -> list[tuple[str, CapabilityEstimator]]:
        """The estimator of each of a route plan's choices, cheapest first.

        Raises:
            SettingsError: The gate has no ``routes``, or none for some choice.
        """
        routes = self.settings.routes or {}
        missing = [name for name in plan.choices if name not in routes]
        if missing:
            known = ", ".join(routes) or "none (pass routes={name: estimator})"
            raise SettingsError(
                f"the policy routes among {list(plan.choices)}, but the gate has no estimator for "
                f"{', '.join(map(repr, missing))} in `routes`; it has: {known}"
            )
        return [(name, routes[name]) for name in plan.choices]

    def route_flow(self, query: Prompt, plan: RoutePlan) -> Flow[tuple[str, RoutePlan, str]]:
        """Choose a model for a query (:class:`~capgate.gate.flow.Route`): estimate the plan's
        choices cheapest first (within :attr:`limits`) until one clears the edge, else take the
        strongest (:func:`capgate.policies.choose_route`): the name, the plan with each p, the reason."""
        estimates: dict[str, Estimate] = {}
        for name, estimator in self.route_estimators(plan):
            (estimates[name],) = yield from self.estimates_flow(estimator, [query])
            if choose_route(plan, estimates)[0] == name:
                break
        return choose_route(plan, estimates)

    def record(
        self, verdict: Verdict, *, samples_used: int | None = None, cas: CASResult | None = None
    ) -> None:
        """Write the decision to the gate's log (no-op without one).

        After a resample, pass its ``cas`` run: the logged decision then records the samples
        drawn and ``stopped_by``, the stop rule (or cap) that ended sampling. A log that cannot
        store the decision (database down, or no answer within its time limit) does not stop the
        call unless it is ``fail_closed=True``: the failure is counted (``stats.log_failures``, a
        warning) and the decision waits in the log's spill file (``stats.log_spilled``,
        :mod:`capgate.decision.store.spill`), as do async and shadow decisions while the log's
        writer queue is full. Once logged, the decision's features (``log_features``) and a
        candidate's decision beside it (``shadow_calibration``) follow in a shadow thread
        (:meth:`flush`).

        Raises:
            LogUnavailableError: The log could not store the decision and is ``fail_closed``.
        """
        if verdict.pending is not None:  # a shadow decision: logged once made, from the log's thread
            verdict.pending.then(lambda made: self._shared.shadows.write(
                lambda: self._write(made, samples_used, cas),
                lambda: self.spill_queued(made, samples_used, cas),
                self.settings.log,
            ))  # fmt: skip
            return
        self._write(verdict, samples_used, cas)

    def spill_queued(self, verdict: Verdict, samples_used: int | None, cas: CASResult | None) -> None:
        """Keep the decision in the log's spill file: the log's write queue is full."""
        spill_full(self, self.log, verdict, samples_used, cas)

    def _write(self, verdict: Verdict, samples_used: int | None, cas: CASResult | None) -> None:
        shared = self._shared  # then, beside the call: its features, a candidate's decision
        write_decision(
            self, verdict, samples_used, cas,
            shadows=shared.shadows, calibrations=shared.calibrations, make_gate=Gate.from_settings,
        )  # fmt: skip

    def block(self, verdict: Verdict, *, cas: CASResult | None = None) -> Gated:
        """The :class:`~capgate.Gated` result for a blocked decision, or raise it (``on_block="raise"``).

        Raises:
            GateBlocked: The action's subclass, when the gate's ``on_block`` is ``"raise"``.
            ValueError: The decision does not block (answer, or resample with an answer).
        """
        gated = Gated.of(verdict, cas)
        if self.settings.on_block == "raise":
            raise blocked_error(gated)
        return gated

    def sample(
        self,
        draw: Callable[[Prompt], T],
        verdict: Verdict,
        *,
        to_text: Callable[[T], str] | None = None,
        count_tokens: Callable[[T], int] | None = None,
    ) -> Sampled[T]:
        """Carry out a ``resample`` decision: call ``draw`` under CAS and return the vote winner.

        Each call of ``draw(query)`` is one sample; the decision's plan (stop settings, batch
        size, budget) bounds the run.

        Args:
            draw: Draws one response (any object: a string, a chat message, a state update).
            verdict: A resample verdict from :meth:`assess`.
            to_text: Reads a drawn value's text (default: a string, or its ``content``).
            count_tokens: Reads a drawn value's generated tokens, if known.
        """
        call = Invoke(lambda: draw(verdict.query))
        sampled: Sampled[T] = perform(Sample(self, verdict, call, to_text, count_tokens))
        return sampled

    async def asample(
        self,
        draw: Callable[[Prompt], Awaitable[T]],
        verdict: Verdict,
        *,
        to_text: Callable[[T], str] | None = None,
        count_tokens: Callable[[T], int] | None = None,
        concurrent: bool = True,
    ) -> Sampled[T]:
        """Async twin of :meth:`sample`; the draws of one batch run concurrently by default."""
        call = Invoke(lambda: draw(verdict.query))
        sampled: Sampled[T] = await aperform(Sample(self, verdict, call, to_text, count_tokens, concurrent))
        return sampled


Gate.__init__.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    + [
        inspect.Parameter(
            name, inspect.Parameter.KEYWORD_ONLY, default=param.default, annotation=param.annotation
        )
        for name, param in inspect.signature(GateSettings).parameters.items()
    ],
    return_annotation=None,
)
