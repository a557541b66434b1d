"""Policy files and the decision engine: format, validation errors located by line and field, presets."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
import yaml
from pydantic import ValidationError

from capgate import Estimate
from capgate.errors import DataError
from capgate.policies import (
    PRESETS,
    AbstainAction,
    AbstainBand,
    AnswerBand,
    ClarifyBand,
    EscalateAction,
    EscalateBand,
    Policy,
    PolicyError,
    ResampleAction,
    ResampleBand,
    StopSettings,
    load_policy,
    policy_json_schema,
    preset_path,
)
from capgate.policies import _templates as tpl
from capgate.policies._base import expand_shorthand


def est(p: float | None, **kw: object) -> Estimate:
    if p is None:
        return Estimate.unavailable("probe", str(kw.get("reason", "server down")))
    return Estimate(p=p, method="probe", **kw)


def errors_of(text: str) -> list[DataError]:
    with pytest.raises(PolicyError) as info:
        Policy.from_yaml_text(textwrap.dedent(text), source="p.yaml")
    return list(info.value.errors)


def only_error(text: str) -> DataError:
    errors = errors_of(text)
    assert len(errors) == 1, [str(e) for e in errors]
    return errors[0]


# ----------------------------------------------------------------------------- presets


@pytest.mark.parametrize("name", PRESETS)
def test_presets_load_by_name_and_are_documented(name: str) -> None:
    policy = load_policy(name)
    assert policy.name == name
    assert policy.description
    text = preset_path(name).read_text(encoding="utf-8")
    comments = [line for line in text.splitlines() if line.lstrip().startswith("#")]
    assert len(comments) >= 5, "presets explain themselves in comments"
    # every band of every preset is reachable and decides its own action
    rule = policy.rule()
    for index, (lower, upper) in enumerate(rule.edges):
        decision = policy.decide(est((lower + upper) / 2))
        assert decision.action == rule.bands[index].action
        assert decision.policy == name
    assert policy.decide(est(None)).degraded


def test_presets_differ_in_the_expected_direction() -> None:
    conservative, balanced, saver = (load_policy(n) for n in ("conservative", "balanced", "cost-saver"))
    # the answer band starts highest for conservative and lowest for cost-saver
    starts = [p.rule().edges[-1][0] for p in (conservative, balanced, saver)]
    assert starts == sorted(starts, reverse=True)
    assert conservative.on_degraded.action == "escalate"
    assert any(b.action == "resample" for b in saver.bands)


def test_load_policy_by_path_and_unknown_name(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("name: mine\nbands: 0.5\non_degraded: abstain\n", encoding="utf-8")
    assert load_policy(path).name == "mine"
    assert load_policy(str(path)).name == "mine"
    with pytest.raises(DataError, match="no policy preset or file named 'nope'"):
        load_policy("nope")
    with pytest.raises(KeyError):
        preset_path("nope")


# ----------------------------------------------------------------------------- the engine


BALANCED = Policy(
    name="demo",
    bands=[AbstainBand(below=0.3), ClarifyBand(below=0.6, question="Which one, p={p:.2f}?"), AnswerBand()],
    on_degraded=EscalateAction(to="support"),
)


@pytest.mark.parametrize(
    ("p", "action"),
    [
        (0.0, "abstain"),
        (0.299, "abstain"),
        (0.3, "clarify"),
        (0.599, "clarify"),
        (0.6, "answer"),
        (1.0, "answer"),
    ],
)
def test_bands_are_closed_below_and_open_above(p: float, action: str) -> None:
    assert BALANCED.decide(est(p)).action == action


def test_decision_records_band_reason_and_rendered_text() -> None:
    decision = BALANCED.decide(est(0.45), step="plan", tool="search")
    assert decision.action == "clarify"
    assert decision.message == "Which one, p=0.45?"
    assert decision.reason == "p=0.450 is in band 1 [0.3, 0.6) of policy 'demo': clarify"
    assert (decision.step, decision.tool, decision.policy, decision.degraded) == (
        "plan",
        "search",
        "demo",
        False,
    )
    assert decision.budget is None
    assert BALANCED.decide(est(0.9)).reason.endswith("band 2 [0.6, 1] of policy 'demo': answer")
    abstain = BALANCED.decide(est(0.123))
    assert abstain.message == tpl.ABSTAIN_MESSAGE.replace("{p:.0%}", "12%")


@pytest.mark.parametrize("estimate", [est(None), est(0.95, degraded=True, reason="fallback estimator")])
def test_degraded_estimates_go_to_the_fail_safe(estimate: Estimate) -> None:
    decision = BALANCED.decide(estimate, tool="refund")
    assert decision.action == "escalate"
    assert decision.degraded is True
    assert estimate.reason is not None
    assert estimate.reason in decision.reason
    assert "on_degraded" in decision.reason
    assert decision.message is not None
    assert f"predicted capability {'unavailable' if estimate.p is None else '0.950'}" in decision.message
    assert "tool: refund" in decision.message


def test_overrides_tool_wins_over_step_and_inherits_fail_safe() -> None:
    policy = Policy.model_validate(
        {
            "name": "o",
            "bands": 0.5,
            "on_degraded": "abstain",
            "steps": {"plan": {"bands": 0.2}, "act": {"on_degraded": "escalate"}},
            "tools": {"pay": 0.9},
        }
    )
    assert policy.decide(est(0.3)).action == "abstain"
    assert policy.decide(est(0.3), step="plan").action == "answer"
    assert policy.decide(est(0.3), step="plan", tool="pay").action == "abstain"
    assert policy.decide(est(0.95), step="plan", tool="pay").action == "answer"
    assert "tool 'pay'" in policy.decide(est(0.95), tool="pay").reason
    # step 'act' only replaces the fail-safe; its bands are inherited
    assert policy.decide(est(0.3), step="act").action == "abstain"
    assert policy.decide(est(None), step="act").action == "escalate"
    assert policy.decide(est(None), step="plan").action == "abstain"
    # unknown step/tool names fall back to the policy
    assert policy.decide(est(0.3), step="other", tool="other").action == "abstain"


def test_resample_budget_from_target_pass_at_k() -> None:
    policy = Policy(
        name="r",
        bands=[ResampleBand(below=0.5, max_samples=20, batch_size=4, target_pass_at_k=0.9), AnswerBand()],
        on_degraded=ResampleAction(max_samples=8, batch_size=2),
    )
    # 1 - 0.6^4 = 0.87 < 0.9 <= 1 - 0.6^5 = 0.92: the smallest k reaching the target is 5
    assert policy.decide(est(0.4)).budget == 5
    assert policy.decide(est(0.01)).budget == 20  # capped
    assert policy.decide(est(None)).budget == 8  # no estimate: the whole budget
    assert policy.decide(est(0.7)).budget is None
    for p in (0.05, 0.2, 0.33, 0.5, 0.77, 0.95):
        k = policy.bands[0].budget(p)
        assert k == 20 or 1 - (1 - p) ** k >= 0.9
        assert k == 1 or 1 - (1 - p) ** (k - 1) < 0.9


def test_resample_defaults_and_checks() -> None:
    spec = ResampleAction()
    assert spec.budget(0.5) == spec.max_samples
    assert spec.stop == StopSettings()
    with pytest.raises(ValidationError, match="must be <= max_samples"):
        ResampleAction(max_samples=2, batch_size=4)


def test_stop_settings_build_the_cas_stop_rules() -> None:
    from capgate.cas import DEFAULT_STOP, SamplingState, stop_rule

    assert repr(stop_rule(StopSettings())) == repr(DEFAULT_STOP)  # the defaults are CAS's own
    rule = stop_rule(StopSettings(confidence_gap=None, consensus=0.9, min_samples=5))
    assert rule(SamplingState.build(votes={"4": 4})) is False  # unanimous, but fewer than 5 samples
    assert rule(SamplingState.build(votes={"4": 5})) is True
    assert rule(SamplingState.build(votes={"4": 3, "5": 2})) is False
    never = stop_rule(StopSettings(confidence_gap=None, consensus=None))
    assert never(SamplingState.build(votes={"4": 40})) is False  # only max_samples ends sampling
    gap = StopSettings.model_validate(
        {"confidence_gap": {"margin": 0.2, "mode": "stochastic"}, "consensus": None}
    )
    assert "margin=0.2, mode='stochastic'" in repr(stop_rule(gap))
    with pytest.raises(ValidationError):
        StopSettings.model_validate({"confidence_gap": {"mode": "sometimes"}})
    futile = stop_rule(StopSettings.model_validate({"confidence_gap": None, "futility": 0.05}))
    assert "beta_futility(threshold=0.05)" in repr(futile)
    assert futile(SamplingState.build(votes={answer: 1 for answer in "abcdefg"})) is True
    with pytest.raises(ValidationError):
        StopSettings.model_validate({"futility": 0.7})


def test_a_policy_caps_tokens_and_time_and_the_caps_ignore_min_samples() -> None:
    from capgate.cas import SamplingState, replay, stop_rule

    policy = Policy.from_yaml_text(
        textwrap.dedent(
            """\
            name: capped
            bands:
              - below: 0.5
                action: resample
                max_samples: 16
                stop: {confidence_gap: null, consensus: null, min_samples: 8,
                       max_tokens: 120, max_seconds: 2.5}
              - action: answer
            on_degraded: abstain
            """
        )
    )
    decision = policy.decide(est(0.3))
    assert decision.plan is not None
    rule = stop_rule(decision.plan.stop)
    assert repr(rule) == (
        "stop_any(stop_all(stop_after_samples(8), stop_never()), stop_after_tokens(120), "
        "stop_after_delay(2.5))"
    )
    assert rule(SamplingState.build(votes={"4": 2}, tokens=120)) is True  # before min_samples
    assert rule(SamplingState.build(votes={"4": 2}, elapsed_s=2.5)) is True
    assert rule(SamplingState.build(votes={"4": 7}, tokens=119, elapsed_s=2.4)) is False
    result = replay([("4", True, None, 50)] * 16, stop=rule, batch_size=1)
    assert (result.samples_used, result.stopped_by) == (3, "stop_after_tokens(120)")
    error = only_error(
        """\
        name: x
        bands:
          - below: 0.5
            action: resample
            stop: {max_tokens: 0}
          - action: answer
        on_degraded: abstain
        """
    )
    assert (error.line, error.field) == (5, "bands[0].stop.max_tokens")
    with pytest.raises(ValidationError, match="max_seconds"):
        StopSettings.model_validate({"max_seconds": float("inf")})


def test_the_yaml_reader_does_not_import_the_policy_model_even_for_types() -> None:
    """policies/_yaml.py validates as the model it is given: no circle with _policy.py, not even one
    hidden behind TYPE_CHECKING or a lazy import."""
    import ast

    import capgate.policies._yaml as reader

    tree = ast.parse(Path(reader.__file__).read_text(encoding="utf-8"))
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert "capgate.policies._policy" not in imported
    assert "capgate.policies" not in imported


def test_python_api_mirrors_the_file_format() -> None:
    text = """
    name: demo
    bands:
      - {below: 0.3, action: abstain}
      - {below: 0.6, action: clarify, question: "Which one, p={p:.2f}?"}
      - {action: answer}
    on_degraded: {action: escalate, to: support}
    """
    assert Policy.from_yaml_text(textwrap.dedent(text)) == BALANCED


def test_bands_given_bottom_up_with_at_least() -> None:
    policy = Policy.model_validate(
        {
            "name": "b",
            "bands": [
                {"action": "abstain"},
                {"at_least": 0.2, "action": "clarify"},
                {"at_least": 0.7, "action": "answer"},
            ],
            "on_degraded": "abstain",
        }
    )
    assert policy.rule().edges == ((0.0, 0.2), (0.2, 0.7), (0.7, 1.0))
    assert policy.decide(est(0.2)).action == "clarify"


def test_shorthands_expand_in_one_place() -> None:
    assert expand_shorthand("bands", 0.25) == [{"below": 0.25, "action": "abstain"}, {"action": "answer"}]
    assert expand_shorthand("action", "clarify") == {"action": "clarify"}
    assert expand_shorthand("override", 0.4) == {"bands": expand_shorthand("bands", 0.4)}
    assert expand_shorthand("bands", [1]) == [1]  # anything else is left for validation
    for bad in (0, 1, 1.5, -0.1):
        with pytest.raises(ValueError, match="bare threshold must be a number in"):
            expand_shorthand("bands", bad)
    policy = Policy(name="s", bands=0.25, on_degraded="clarify")
    assert policy.rule().edges == ((0.0, 0.25), (0.25, 1.0))
    assert [b.action for b in policy.bands] == ["abstain", "answer"]
    assert policy.on_degraded.action == "clarify"


def test_templates_render_and_are_checked() -> None:
    assert AbstainAction(message="{policy} says no ({p:.1%}, {method}, {step}, {tool})")
    with pytest.raises(ValidationError, match=r"unknown placeholder \{user\}"):
        AbstainAction(message="hi {user}")
    with pytest.raises(ValidationError, match="not a valid text template"):
        AbstainAction(message="unbalanced {")
    with pytest.raises(ValidationError, match="does not render"):
        AbstainAction(message="{p:.2q}")
    policy = Policy(
        name="t",
        bands=[AbstainBand(below=0.5, message="{p:.0%} {step} {tool}"), AnswerBand()],
        on_degraded=AbstainAction(message="p={p:.0%}"),
    )
    assert policy.decide(est(0.25)).message == f"25% {tpl.NOT_GIVEN} {tpl.NOT_GIVEN}"
    assert policy.decide(est(None)).message == f"p={tpl.UNAVAILABLE}"


# ----------------------------------------------------------------------------- editing and dumping


def test_with_answer_threshold_moves_the_answer_edge() -> None:
    policy = load_policy("conservative")  # abstain <0.4, clarify <0.7, escalate <0.85, answer
    raised, notes = policy.with_answer_threshold(0.9)
    assert raised.rule().edges[-2:] == ((0.7, 0.9), (0.9, 1.0))
    assert notes == ["escalate band [0.7, 0.85) now ends at 0.9"]
    lowered, notes = policy.with_answer_threshold(0.5)
    assert [b.action for b in lowered.bands] == ["abstain", "clarify", "answer"]
    assert lowered.rule().edges == ((0.0, 0.4), (0.4, 0.5), (0.5, 1.0))
    assert any(n.startswith("dropped escalate band [0.7, 0.85)") for n in notes)
    everything, _ = policy.with_answer_threshold(0.0)
    assert [b.action for b in everything.bands] == ["answer"]
    # ... and back up: a rule that answers everything gets an abstain band below the threshold
    # (the certified threshold must take effect, never a policy that still answers p = 0.01)
    raised_again, notes = everything.with_answer_threshold(0.788)
    assert [(b.action, e) for b, e in zip(raised_again.bands, raised_again.rule().edges, strict=True)] == [
        ("abstain", (0.0, 0.788)),
        ("answer", (0.788, 1.0)),
    ]
    assert notes == ["added an abstain band [0, 0.788): the rule answered every p"]
    assert raised_again.decide(est(0.01)).action == "abstain"
    assert everything.with_answer_threshold(0.0)[0] == everything
    # texts and settings of kept bands survive
    assert lowered.bands[0] == policy.bands[0].model_copy(update={"below": 0.4})
    with pytest.raises(ValueError, match=r"`threshold` must be a number in \[0, 1\]; got 1.5"):
        policy.with_answer_threshold(1.5)
    with pytest.raises(ValueError, match="top band of policy 'x' must answer"):
        Policy(
            name="x", bands=[AnswerBand(below=0.5), AbstainBand()], on_degraded="abstain"
        ).with_answer_threshold(0.3)


def test_with_answer_threshold_on_overrides() -> None:
    policy = Policy.model_validate(
        {"name": "o", "bands": 0.5, "on_degraded": "abstain", "steps": {"plan": {"on_degraded": "escalate"}}}
    )
    moved, _ = policy.with_answer_threshold(0.8, tool="pay")
    assert moved.rule(tool="pay").edges == ((0.0, 0.8), (0.8, 1.0))
    assert moved.rule().edges == ((0.0, 0.5), (0.5, 1.0))  # the policy's own bands are untouched
    moved, _ = policy.with_answer_threshold(0.7, step="plan")
    assert moved.rule(step="plan").edges == ((0.0, 0.7), (0.7, 1.0))
    assert moved.steps["plan"].on_degraded is not None  # the override keeps its fail-safe


def test_with_answer_threshold_keeps_stop_rules_turned_off() -> None:
    """A setting written as null (a CAS stop rule turned off) stays off in the moved policy; the
    policy written by `capgate calibrate --risk` used to turn the paper rule and consensus back on.
    Policies from a file and policies built in Python (their action tags left at the default)."""
    resample = {"action": "resample", "max_samples": 8, "stop": {"confidence_gap": None, "consensus": None}}
    bands = [{"below": 0.5, **resample}, {"action": "answer"}]
    from_file = Policy.model_validate(
        {
            "name": "off",
            "bands": [{"below": 0.3, "action": "abstain"}, {"below": 0.6, **resample}, {"action": "answer"}],
            "on_degraded": "abstain",
            "tools": {"pay": {"bands": bands}},
            "steps": {"plan": {"bands": bands}},
        }
    )
    off = StopSettings(confidence_gap=None, consensus=None)
    in_python = Policy(
        name="off",
        bands=[AbstainBand(below=0.3), ResampleBand(below=0.6, max_samples=8, stop=off), AnswerBand()],
        on_degraded=EscalateAction(to="ops"),
        tools={"pay": {"bands": [ResampleBand(below=0.5, max_samples=8, stop=off), AnswerBand()]}},
        steps={"plan": {"bands": [ResampleBand(below=0.5, max_samples=8, stop=off), AnswerBand()]}},
    )
    for policy in (from_file, in_python):
        for threshold, scope in ((0.8, {}), (0.9, {"tool": "pay"}), (0.7, {"step": "plan"})):
            moved = policy.with_answer_threshold(threshold, **scope)[0]
            assert moved.rule(**scope).edges[-1] == (threshold, 1.0)
            stop = moved.rule(**scope).bands[-2].stop
            assert (stop.confidence_gap, stop.consensus) == (None, None)
            assert Policy.from_yaml_text(moved.to_yaml()).rule(**scope).bands[-2].stop == stop


def test_yaml_round_trip() -> None:
    complex_policy = Policy.model_validate(
        {
            "name": "c",
            "description": "all features",
            "mode": "shadow",
            "bands": [
                {"below": 0.2, "action": "abstain", "message": "no: {p:.0%}"},
                {
                    "below": 0.4,
                    "action": "resample",
                    "max_samples": 8,
                    "batch_size": 2,
                    "target_pass_at_k": 0.9,
                    "stop": {
                        "consensus": 0.8,
                        "min_samples": 3,
                        "confidence_gap": {"rule": "paper", "epsilon": 0},
                    },
                },
                {"below": 0.6, "action": "escalate", "to": "ops"},
                {"below": 0.7, "action": "clarify"},
                {"action": "answer"},
            ],
            "on_degraded": {"action": "escalate", "summary": "look at {tool}"},
            "steps": {"plan": 0.3, "act": {"on_degraded": "abstain"}},
            "tools": {"pay": {"bands": 0.95, "on_degraded": "escalate"}},
        }
    )
    for policy in (complex_policy, *(load_policy(n) for n in PRESETS)):
        text = policy.to_yaml(header="made by a test\nsecond line")
        assert text.startswith("# made by a test\n# second line\n")
        assert Policy.from_yaml_text(text) == policy
        assert (
            yaml.safe_load(text)["bands"][0]["below"] == policy.rule().edges[0][1] or len(policy.bands) == 1
        )


@pytest.mark.parametrize(
    "gap",
    [
        {"rule": "paper", "epsilon": 0},
        {"rule": "paper"},
        {"rule": "capgate"},
        {"rule": "capgate", "level": 0.9},
        None,
    ],
)
def test_yaml_round_trip_keeps_the_stop_rule(gap: dict[str, object] | None) -> None:
    """A stop rule is written with its `rule` tag: without it, a paper rule with its own ε was read back
    as capgate's rule (the default when `rule` is absent), which has no ε, and the file did not load."""
    resample = {"action": "resample", "max_samples": 8, "stop": {"confidence_gap": gap}}
    policy = Policy.model_validate(
        {
            "name": "s",
            "bands": [{"below": 0.6, **resample}, {"action": "answer"}],
            "on_degraded": resample,
            "tools": {"pay": {"bands": [{"below": 0.8, **resample}, {"action": "answer"}]}},
        }
    )
    moved, moved_tool = policy.with_answer_threshold(0.7)[0], policy.with_answer_threshold(0.9, tool="pay")[0]
    for written in (policy, moved, moved_tool):
        assert Policy.from_yaml_text(written.to_yaml(), source="written.yaml") == written
    if gap == {"rule": "paper", "epsilon": 0}:
        stop = yaml.safe_load(policy.to_yaml())["bands"][0]["stop"]
        assert stop == {"confidence_gap": {"rule": "paper", "epsilon": 0.0}}


def test_yaml_round_trip_keeps_shadow_mode() -> None:
    """`mode: shadow` is written (it was dropped, so a recalibrated shadow policy came back enforcing)."""
    shadow = Policy.from_yaml_text("name: rollout\nmode: shadow\nbands: 0.5\non_degraded: abstain\n")
    assert yaml.safe_load(shadow.to_yaml())["mode"] == "shadow"
    assert Policy.from_yaml_text(shadow.to_yaml()) == shadow
    moved = shadow.with_answer_threshold(0.7)[0]
    assert moved.mode == "shadow"
    assert Policy.from_yaml_text(moved.to_yaml()) == moved
    assert "mode" not in yaml.safe_load(Policy(name="e", bands=0.5, on_degraded="abstain").to_yaml())


def test_json_schema_exports_the_format() -> None:
    schema = policy_json_schema()
    json.dumps(schema)
    assert set(schema["required"]) == {"name", "bands", "on_degraded"}
    assert schema["additionalProperties"] is False
    assert {"AbstainBand", "ClarifyBand", "EscalateBand", "ResampleBand", "AnswerBand"} <= set(
        schema["$defs"]
    )
    # the shorthand forms are part of the schema
    bands_schema = json.dumps(schema["properties"]["bands"])
    assert '"number"' in bands_schema
    degraded_schema = json.dumps(schema["properties"]["on_degraded"])
    assert '"escalate"' in degraded_schema


# ----------------------------------------------------------------------------- bad files


def test_wrong_type_is_located() -> None:
    error = only_error(
        """\
        name: x
        bands:
          - below: high
            action: abstain
          - action: answer
        on_degraded: abstain
        """
    )
    assert (error.path, error.line, error.field) == ("p.yaml", 3, "bands[0].below")
    assert "valid number" in error.message
    assert "'high'" in error.message


@pytest.mark.parametrize(
    ("band", "field", "kind"),
    [
        ("{below: yes, action: abstain}", "bands[0].below", "number"),
        ("{below: 0.5, at_least: no, action: abstain}", "bands[0].at_least", "number"),
        ("{below: 0.5, action: route, choices: [a, b], edge: yes}", "bands[0].edge", "number"),
        (
            "{below: 0.5, action: resample, max_samples: yes, batch_size: 1}",
            "bands[0].max_samples",
            "integer",
        ),
        ("{below: 0.5, action: resample, batch_size: yes}", "bands[0].batch_size", "integer"),
        ("{below: 0.5, action: resample, target_pass_at_k: no}", "bands[0].target_pass_at_k", "number"),
        ("{below: 0.5, action: resample, stop: {min_samples: yes}}", "bands[0].stop.min_samples", "integer"),
        ("{below: 0.5, action: resample, stop: {max_tokens: yes}}", "bands[0].stop.max_tokens", "integer"),
        ("{below: 0.5, action: resample, stop: {max_seconds: yes}}", "bands[0].stop.max_seconds", "number"),
        ("{below: 0.5, action: resample, stop: {consensus: yes}}", "bands[0].stop.consensus", "number"),
        ("{below: 0.5, action: resample, stop: {futility: no}}", "bands[0].stop.futility", "number"),
    ],
)
def test_yaml_booleans_are_not_numbers(band: str, field: str, kind: str) -> None:
    """`below: yes` was read as 1 (abstain on everything), `max_samples: yes` as 1: a boolean is refused
    where a number is expected, located like a boolean bare threshold (`bands: yes`) is."""
    bare = only_error("name: x\nbands: yes\non_degraded: abstain\n")
    assert (bare.line, bare.field) == (2, "bands")
    assert bare.message.endswith("; got True")
    error = only_error(f"name: x\nbands:\n  - {band}\n  - {{action: answer}}\non_degraded: abstain\n")
    assert (error.line, error.field) == (3, field)
    assert error.message.startswith(f"Input should be a valid {kind}; got ")
    assert error.message.endswith(("got True", "got False"))


def test_python_api_refuses_booleans_as_numbers() -> None:
    with pytest.raises(ValidationError, match="valid number"):
        AbstainBand(below=True)
    with pytest.raises(ValidationError, match="valid integer"):
        ResampleAction(max_samples=True, batch_size=1)
    with pytest.raises(ValidationError, match="valid integer"):
        StopSettings(max_tokens=True)
    # numpy numbers are numbers (a threshold or budget computed with numpy), booleans are not
    numpy_made = ResampleAction(
        max_samples=np.int64(8), batch_size=np.int32(2), target_pass_at_k=np.float64(0.9)
    )
    assert (numpy_made.max_samples, numpy_made.batch_size) == (8, 2)
    assert type(numpy_made.max_samples) is int
    assert StopSettings(min_samples=np.int64(2), max_tokens=np.int16(64)).max_tokens == 64
    assert AbstainBand(below=np.float64(0.25)).below == 0.25
    with pytest.raises(ValidationError, match="valid integer"):
        StopSettings(min_samples=np.bool_(True))


def test_out_of_range_edge_is_located() -> None:
    error = only_error(
        "name: x\nbands:\n  - {below: 1.5, action: abstain}\n  - {action: answer}\non_degraded: abstain\n"
    )
    assert (error.line, error.field) == (3, "bands[0].below")
    assert "less than or equal to 1" in error.message


@pytest.mark.parametrize(
    ("band", "line", "field", "message"),
    [
        ("{below: 0.5, action: abstian}", 3, "bands[0].action",
         "unknown action 'abstian'; expected one of: answer, abstain, clarify, escalate, resample, route"),
        # a stop rule's tag is `rule`, not `action`: the error names it, with its choices
        ("{below: 0.5, action: resample, stop: {confidence_gap: {rule: foo}}}", 3,
         "bands[0].stop.confidence_gap.rule", "unknown rule 'foo'; expected one of: capgate, paper"),
    ],
)  # fmt: skip
def test_an_unknown_tag_is_located_with_its_key_and_choices(
    band: str, line: int, field: str, message: str
) -> None:
    error = only_error(f"name: x\nbands:\n  - {band}\n  - action: answer\non_degraded: abstain\n")
    assert (error.line, error.field, error.message) == (line, field, message)


def test_unknown_on_degraded_action_and_missing_action() -> None:
    errors = errors_of(
        """\
        name: x
        bands:
          - below: 0.5
          - action: answer
        on_degraded: shrug
        """
    )
    assert [(e.line, e.field) for e in errors] == [(3, "bands[0].action"), (5, "on_degraded")]
    assert errors[0].message == (
        "missing key 'action'; expected one of: answer, abstain, clarify, escalate, resample, route"
    )
    assert "unknown action 'shrug'" in errors[1].message


@pytest.mark.parametrize(
    ("text", "line", "field", "allowed"),
    [
        ("name: x\ncolour: red\nbands: 0.5\non_degraded: abstain\n", 2, "colour", "on_degraded"),
        (
            "name: x\nbands:\n  - below: 0.5\n    action: clarify\n    questoin: hi\n  - action: answer\n"
            "on_degraded: abstain\n",
            5,
            "bands[0].questoin",
            "question",
        ),
        (
            "name: x\nbands: 0.5\non_degraded: abstain\ntools:\n  pay:\n    bands: 0.9\n    fallback: no\n",
            7,
            "tools.pay.fallback",
            "on_degraded",
        ),
        (
            "name: x\nbands:\n  - below: 0.5\n    action: resample\n    stop: {consensus: 0.9, patience: 3}\n"
            "  - action: answer\non_degraded: abstain\n",
            5,
            "bands[0].stop.patience",
            "min_samples",
        ),
    ],
)
def test_unknown_keys_are_errors_with_what_is_allowed(text: str, line: int, field: str, allowed: str) -> None:
    error = only_error(text)
    assert (error.line, error.field) == (line, field)
    assert f"unknown key {field.split('.')[-1]!r}" in error.message
    assert allowed in error.message


def test_overlapping_bands() -> None:
    error = only_error(
        """\
        name: x
        bands:
          - {below: 0.5, action: abstain}
          - {at_least: 0.4, action: answer}
        on_degraded: abstain
        """
    )
    assert (error.line, error.field) == (4, "bands[1].at_least")
    assert "bands overlap" in error.message
    assert "[0.4, 0.5)" in error.message


def test_gap_between_bands() -> None:
    error = only_error(
        """\
        name: x
        bands:
          - {below: 0.5, action: abstain}
          - {at_least: 0.6, action: answer}
        on_degraded: abstain
        """
    )
    assert (error.line, error.field) == (4, "bands[1].at_least")
    assert "gap between bands: [0.5, 0.6) is in no band" in error.message


def test_unordered_bands() -> None:
    error = only_error(
        """\
        name: x
        bands:
          - {below: 0.6, action: clarify}
          - {below: 0.3, action: abstain}
          - {action: answer}
        on_degraded: abstain
        """
    )
    assert (error.line, error.field) == (4, "bands[1].below")
    assert "ascending order" in error.message
    assert "0.3 is not above the lower edge 0.6" in error.message


def test_empty_band_is_an_ordering_error() -> None:
    error = only_error(
        "name: x\nbands:\n  - {below: 0, action: abstain}\n  - {action: answer}\non_degraded: abstain\n"
    )
    assert (error.line, error.field) == (3, "bands[0].below")
    assert "each non-empty" in error.message


def test_bands_not_reaching_one() -> None:
    error = only_error(
        """\
        name: x
        bands:
          - {below: 0.5, action: abstain}
          - {below: 0.9, action: answer}
        on_degraded: abstain
        """
    )
    assert (error.line, error.field) == (4, "bands[1].below")
    assert "bands do not cover [0.9, 1]" in error.message


def test_bands_not_starting_at_zero() -> None:
    error = only_error(
        """\
        name: x
        bands:
          - {at_least: 0.1, below: 0.5, action: abstain}
          - {action: answer}
        on_degraded: abstain
        """
    )
    assert (error.line, error.field) == (3, "bands[0].at_least")
    assert "bands do not cover [0, 0.1)" in error.message


def test_missing_edge_between_bands() -> None:
    error = only_error(
        """\
        name: x
        bands:
          - {action: abstain}
          - {action: answer}
        on_degraded: abstain
        """
    )
    assert (error.line, error.field) == (3, "bands[0]")
    assert "edge between bands[0] and bands[1] is not set" in error.message


def test_missing_on_degraded_is_an_error() -> None:
    error = only_error("name: x\nbands: 0.5\n")
    assert (error.line, error.field) == (1, "on_degraded")
    assert "missing required key 'on_degraded'" in error.message


def test_missing_and_empty_bands() -> None:
    assert only_error("name: x\non_degraded: abstain\n").field == "bands"
    error = only_error("name: x\nbands: []\non_degraded: abstain\n")
    assert (error.line, error.field) == (2, "bands")
    assert "at least 1 item" in error.message


def test_bad_bare_threshold_in_override() -> None:
    error = only_error("name: x\nbands: 0.5\non_degraded: abstain\nsteps:\n  plan: 1.5\n")
    assert (error.line, error.field) == (5, "steps.plan")
    assert "bare threshold must be a number in (0, 1); got 1.5" in error.message


def test_empty_override() -> None:
    error = only_error("name: x\nbands: 0.5\non_degraded: abstain\ntools:\n  pay: {}\n")
    assert (error.line, error.field) == (5, "tools.pay")
    assert "needs bands, on_degraded, or both" in error.message


def test_bad_placeholder_and_resample_budget_are_located() -> None:
    errors = errors_of(
        """\
        name: x
        bands:
          - below: 0.5
            action: resample
            max_samples: 2
            batch_size: 4
          - action: answer
        on_degraded:
          action: abstain
          message: "sorry {user}"
        """
    )
    assert [(e.line, e.field) for e in errors] == [(6, "bands[0].batch_size"), (10, "on_degraded.message")]
    assert "must be <= max_samples (2); got 4" in errors[0].message
    assert "unknown placeholder {user}" in errors[1].message


def test_every_error_is_reported_in_file_order() -> None:
    errors = errors_of(
        """\
        name: x
        version: 2
        bands:
          - {below: 0.6, action: clarify, questoin: hi}
          - {below: 0.3, action: abstain}
          - {action: answer}
        steps:
          plan:
            bands:
              - {below: 0.5, action: abstain, message: 7}
              - {below: 0.4, action: answer}
        tools:
          pay: {bands: 0.9, extra: 1}
        """
    )
    located = [(e.line, e.field) for e in errors]
    assert located == [
        (1, "on_degraded"),
        (2, "version"),
        (4, "bands[0].questoin"),
        (5, "bands[1].below"),  # the order is judged although bands[0] has another error
        (10, "steps.plan.bands[0].message"),
        (11, "steps.plan.bands[1].below"),
        (13, "tools.pay.extra"),
    ]
    assert "ascending order" in errors[5].message
    text = str(PolicyError(errors))
    assert text.count("\n") == len(errors) - 1
    assert all(line.startswith("p.yaml:") for line in text.splitlines())


def test_duplicate_keys_are_errors() -> None:
    error = only_error("name: x\nbands: 0.5\non_degraded: abstain\nname: y\n")
    assert (error.line, error.field) == (4, "name")
    assert "duplicate key 'name' (first at line 1)" in error.message


def test_yaml_syntax_error_and_non_mapping() -> None:
    error = only_error("name: x\nbands: [0.5\non_degraded: abstain\n")
    assert error.line is not None
    assert error.line >= 2
    assert "not valid YAML" in error.message
    assert "must be a YAML mapping; got a list" in only_error("- a\n- b\n").message
    assert "got an empty file" in only_error("").message


def test_loading_is_safe(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    text = f"name: !!python/object/apply:os.system ['touch {marker}']\nbands: 0.5\non_degraded: abstain\n"
    error = only_error(text)
    assert "not valid YAML" in error.message
    assert not marker.exists()


def test_from_yaml_reads_files_and_reports_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("name: x\nbands: 0.5\non_degraded: escalate\n", encoding="utf-8")
    assert Policy.from_yaml(path).on_degraded.action == "escalate"
    with pytest.raises(PolicyError, match="cannot read policy file"):
        Policy.from_yaml(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nbands: 0.5\n", encoding="utf-8")
    with pytest.raises(PolicyError) as info:
        Policy.from_yaml(bad)
    assert info.value.path == str(bad)
    assert info.value.line == 1
    assert info.value.field == "on_degraded"
    assert isinstance(info.value, DataError)


def test_python_api_errors_name_every_issue() -> None:
    with pytest.raises(ValidationError) as info:
        Policy(
            name="x",
            bands=[AbstainBand(below=0.6), ClarifyBand(below=0.3), AnswerBand(below=0.9)],
            on_degraded="abstain",
        )
    text = str(info.value)
    assert "[1].below" in text
    assert "ascending order" in text
    assert "[2].below" in text
    assert "do not cover [0.9, 1]" in text
    assert EscalateBand().to is None
