"""The Gate engine shared by @guard and the agent adapters: queries, verdicts, plans, blocking."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest
from _estimators import KeywordEstimator

from capgate import Decision, Gate, Gated, SamplingPlan, SettingsError
from capgate.cas import stop_rule
from capgate.gate import (
    Abstained,
    Verdict,
    as_query,
    default_extract,
)
from capgate.policies import load_policy


def test_as_query_normalizes_roles_and_content() -> None:
    class LCMessage:
        def __init__(self, type_: str, content: object) -> None:
            self.type = type_
            self.content = content

    query = as_query(
        [
            {"role": "system", "content": "Be brief."},
            LCMessage("human", [{"type": "text", "text": "What is "}, "2+2?"]),
            LCMessage("ai", "4"),
        ]
    )
    assert query == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
    ]
    assert as_query("plain") == "plain"
    with pytest.raises(TypeError, match="where: expected a prompt string"):
        as_query(3.0, where="where")
    with pytest.raises(TypeError, match="message 0: message content must be text"):
        as_query([{"role": "user", "content": {"image": 1}}])


def test_assess_builds_the_sampling_plan_from_the_policy() -> None:
    gate = Gate(policy="cost-saver", estimator=KeywordEstimator({"mid": 0.3}))
    verdict = gate.assess("a mid question")
    assert verdict.action == "resample"
    assert verdict.plan == SamplingPlan(stop=verdict.plan.stop, batch_size=2, max_samples=4)
    assert "beta_consensus(threshold=0.9)" in repr(stop_rule(verdict.plan.stop))
    assert verdict.decision.budget == 4
    assert gate.assess("easy").plan is None


def test_a_decision_carries_its_plan_and_target_through_json() -> None:
    """Decide once: a stored decision is acted on without the policy (graph state, the log)."""
    gate = Gate(policy="cost-saver", estimator=KeywordEstimator({"mid": 0.3}), extract=str.strip)
    verdict = gate.assess("mid")
    restored = Decision.model_validate_json(verdict.decision.model_dump_json())
    assert restored == verdict.decision
    assert restored.plan is not None
    assert restored.plan.max_samples == restored.budget == 4
    # A gate whose policy has nothing to do with it samples the restored decision by its own plan.
    other = Gate(policy="conservative", estimator=KeywordEstimator({}), extract=str.strip)
    sampled = other.sample(lambda q: "x", Verdict(decision=restored, query="mid"))
    # Two batches of 2 (Beta consensus 0.9 is not reached at 2:0), then the plan's budget of 4;
    # the conservative policy has no resample band at all.
    assert sampled.cas.samples_used == restored.plan.max_samples == 4
    escalating = Gate(policy="conservative", estimator=KeywordEstimator({"x": 0.7})).assess("x")
    assert escalating.action == "escalate"
    assert escalating.decision.to == "human-review"
    assert escalating.decision.plan is None


def test_target_pass_at_k_sets_the_budget() -> None:
    policy = load_policy("cost-saver")
    data = policy.model_dump()
    data["bands"][1].update(target_pass_at_k=0.9, max_samples=16)
    gate = Gate(
        policy=type(policy).model_validate(data), estimator=KeywordEstimator({"mid": 0.3, "low": 0.2})
    )
    verdict = gate.assess("mid")
    # 1 - 0.7^k >= 0.9 first at k = 7 (0.7^6 = 0.118, 0.7^7 = 0.082).
    assert verdict.decision.budget == 7
    assert verdict.plan is not None
    assert verdict.plan.max_samples == 7
    # p = 0.2: 0.8^k <= 0.1 first at k = 11.
    assert gate.assess("low").decision.budget == 11


def test_sample_runs_cas_over_a_plain_function() -> None:
    gate = Gate(policy="cost-saver", estimator=KeywordEstimator({"mid": 0.3}), extract=str.strip)
    verdict = gate.assess("mid")
    answers = itertools.cycle(["x", "y"])
    sampled = gate.sample(lambda q: next(answers), verdict)
    assert sampled.cas.samples_used == 4
    assert sampled.value == "x"
    assert gate.stats.samples == 4
    with pytest.raises(ValueError, match="only a resample decision can be sampled"):
        gate.sample(lambda q: "x", gate.assess("easy"))


def test_asample_twin() -> None:
    gate = Gate(policy="cost-saver", estimator=KeywordEstimator({"mid": 0.3}), extract=str.strip)

    async def go() -> tuple[Verdict, str | None]:
        verdict = await gate.aassess("mid")

        async def draw(q: object) -> str:
            return "z"

        sampled = await gate.asample(draw, verdict)
        return verdict, sampled.value

    verdict, value = asyncio.run(go())
    assert verdict.action == "resample"
    assert value == "z"


def test_block_returns_or_raises_and_refuses_answers() -> None:
    gate = Gate(estimator=KeywordEstimator({"hard": 0.1}))
    verdict = gate.assess("hard")
    gated = gate.block(verdict)
    assert isinstance(gated, Gated)
    assert gated.decision is verdict.decision
    with pytest.raises(Abstained):
        gate.with_options(on_block="raise").block(verdict)
    with pytest.raises(ValueError, match="does not block"):
        gate.block(gate.assess("easy"))


def test_constructor_checks_settings() -> None:
    with pytest.raises(ValueError, match="`step` must be a non-empty string"):
        Gate(step="")
    with pytest.raises(TypeError, match="`log`"):
        Gate(log=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="`extract`"):
        Gate(extract="first word")  # type: ignore[arg-type]
    with pytest.raises(SettingsError, match="`on_block`"):
        Gate(on_block="explode")  # type: ignore[arg-type]
    assert "balanced" in repr(Gate())


def test_the_gate_settings_are_declared_once() -> None:
    """GateSettings declares them; GateOptions (the keyword arguments every integration types its
    ``**settings`` with) names the same ones with the same types, and the constructor's signature
    is derived from them."""
    import inspect
    import typing

    from capgate.gate import GateOptions, GateSettings

    fields = {name: f.default for name, f in GateSettings.model_fields.items()}
    assert GateOptions.__required_keys__ | GateOptions.__optional_keys__ == set(fields)
    options = typing.get_type_hints(GateOptions)
    for name, field in GateSettings.model_fields.items():
        assert _plain_type(options[name]) == _plain_type(field.annotation), name
    signature = inspect.signature(Gate)
    assert {name: p.default for name, p in signature.parameters.items()} == fields
    assert all(p.kind is p.KEYWORD_ONLY for p in signature.parameters.values())
    with pytest.raises(SettingsError, match="unknown gate setting"):
        Gate(colour="red")  # type: ignore[call-arg]


def _plain_type(annotation: object) -> object:
    """``annotation`` with its ``Annotated`` metadata (pydantic's ``InstanceOf`` and constraints)
    taken off, unions as sets of their members (so ``A | B`` and ``B | A`` read the same)."""
    import types
    import typing

    if isinstance(annotation, list):  # a Callable's parameters
        return tuple(_plain_type(a) for a in annotation)
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _plain_type(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return frozenset(_plain_type(a) for a in typing.get_args(annotation))
    if origin is not None:
        return (origin, tuple(_plain_type(a) for a in typing.get_args(annotation)))
    return annotation


def test_policy_files_load_once() -> None:
    gate = Gate(policy="conservative", estimator=KeywordEstimator({}))
    assert gate.resolve_policy() is gate.resolve_policy()
    assert gate.with_options(policy="balanced").resolve_policy().name == "balanced"
    assert gate.with_options(policy="conservative").resolve_policy() is gate.resolve_policy()


def test_with_options_takes_every_setting_and_shares_stats() -> None:
    gate = Gate(policy="balanced", estimator=KeywordEstimator({"hard": 0.1}), tool="refund")
    view = gate.with_options(step="draft", tool=None, on_block="raise", extract=str.strip)
    assert (view.settings.step, view.settings.tool, view.settings.on_block) == ("draft", None, "raise")
    assert view.stats is gate.stats
    assert gate.with_options() is gate
    with pytest.raises(Abstained):
        view.block(view.assess("hard"))
    assert gate.stats.calls == 1
    assert gate.stats.last_decision is not None
    assert gate.stats.last_decision.step == "draft"
    with pytest.raises(SettingsError, match="unknown gate setting"):
        gate.settings.replace(colour="red")
    with pytest.raises(SettingsError, match="`policy`"):
        gate.with_options(policy=3)  # type: ignore[arg-type]


def test_coerce_is_the_one_check_of_gate_against_settings() -> None:
    gate = Gate(policy="balanced")
    assert Gate.coerce(gate) is gate
    assert Gate.coerce(None, step="s").settings.step == "s"
    with pytest.raises(SettingsError, match="not both; also got estimator, step"):
        Gate.coerce(gate, estimator=KeywordEstimator({}), step="s", policy="balanced")
    with pytest.raises(SettingsError, match="`gate` must be a capgate Gate"):
        Gate.coerce("balanced")  # type: ignore[arg-type]


def test_coerce_refuses_a_setting_the_gate_does_not_have_even_at_its_default() -> None:
    """A setting given beside gate= is never silently ignored: one that differs from the gate's own
    is refused, even at GateSettings' default; one equal to the gate's own is in force already."""
    shared = Gate(policy="conservative", on_block="raise")
    with pytest.raises(SettingsError, match="not both; also got policy, on_block"):
        Gate.coerce(shared, policy="balanced", on_block="return")
    with pytest.raises(SettingsError, match="not both; also got estimator"):
        Gate.coerce(Gate(estimator=KeywordEstimator({})), estimator=None)
    assert Gate.coerce(shared, policy="conservative", on_block="raise", step=None) is shared


def test_an_empty_log_path_is_refused_when_the_gate_is_made() -> None:
    with pytest.raises(SettingsError, match="`log` must be a DecisionLog, a path or None; got ''"):
        Gate(log="")
    with pytest.raises(SettingsError, match="`log`"):
        Gate().with_options(log="")


def test_default_extract() -> None:
    assert default_extract("The answer is \\boxed{42}") == "42"
    assert default_extract("") is None


def test_the_settings_dump_as_json_with_objects_by_their_repr(tmp_path: Path) -> None:
    # the OpenAI Agents SDK (and any tool that records an agent's configuration) dumps pydantic
    # models it finds with model_dump(mode="json"): settings holding an estimator must survive it
    import json

    from capgate.gate import GateSettings

    estimator = KeywordEstimator({"hard": 0.1})
    settings = GateSettings(estimator=estimator, routes={"small": estimator}, log=tmp_path / "d.db")
    dumped = settings.model_dump(mode="json")
    assert json.loads(json.dumps(dumped)) == dumped
    assert dumped["estimator"] == repr(estimator)
    assert dumped["routes"] == {"small": repr(estimator)}
    assert dumped["log"] == str(tmp_path / "d.db")
    assert dumped["policy"] == "balanced"
    assert settings.model_dump()["estimator"] is estimator  # Python mode keeps the objects
