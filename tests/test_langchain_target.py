"""CapabilityGate knows which model it gates (issue #24 part 3): it reads the agent's model at its
model calls, records it in each decision (``target``) and refuses an estimator of another model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import FakeListChatModel

from capgate import SamplingParams
from capgate.adapters.agents.langchain import CapabilityGate, CapgateChatModel, model_target
from capgate.decision import DecisionLog
from capgate.errors import SettingsError
from capgate.policies import Policy
from tests._estimators import KeywordEstimator
from tests._fakes import ScriptedBackend, gen


class NamedModel(FakeListChatModel):
    """A fake chat model with a model name, as ``ChatOpenAI`` has."""

    model_name: str = "served-model"


class OfModel(KeywordEstimator):
    def __init__(self, target: str) -> None:
        super().__init__({"LOW": 0.1})
        self._target = target

    @property
    def target_model(self) -> str | None:
        return self._target


def _ask(agent: Any, text: str) -> Any:
    return agent.invoke({"messages": [{"role": "user", "content": text}]})


def test_the_model_name_is_read_from_langchain_and_capgate_chat_models() -> None:
    assert model_target(NamedModel(responses=["x"])) == "served-model"
    backend = ScriptedBackend(lambda text, params: [gen("4")])
    assert model_target(CapgateChatModel(backend=backend, params=SamplingParams(max_tokens=4))) == "scripted"
    assert model_target(FakeListChatModel(responses=["x"])) is None


def test_decisions_record_the_agents_model_once_it_has_been_called(tmp_path: Path) -> None:
    log = DecisionLog(tmp_path / "log.sqlite3")
    gate = CapabilityGate(estimator=KeywordEstimator({"LOW": 0.1}), log=log)
    agent = create_agent(NamedModel(responses=["4", "5"]), middleware=[gate])
    first = _ask(agent, "What is 2 + 2?")
    # the first run's state and stats show the target too, not only its log row
    assert first["capgate_decision"]["target"] == "served-model"
    assert gate.stats.last_decision is not None
    assert gate.stats.last_decision.target == "served-model"
    _ask(agent, "What is 2 + 3?")
    targets = [d.decision.target for d in log.decisions()]
    assert targets == ["served-model", "served-model"]  # the first logged at the first model call


def test_a_first_step_that_never_reaches_the_model_is_logged_at_once(tmp_path: Path) -> None:
    log = DecisionLog(tmp_path / "log.sqlite3")
    agent = create_agent(
        NamedModel(responses=["4"]),
        middleware=[CapabilityGate(estimator=KeywordEstimator({"LOW": 0.1}), log=log)],
    )
    _ask(agent, "LOW: next week's lottery numbers?")
    (logged,) = log.decisions()
    assert (logged.decision.action, logged.decision.target) == ("abstain", None)  # never saw the model


def test_an_estimator_of_another_model_is_refused_before_the_model_is_called() -> None:
    model = NamedModel(responses=["4"])
    agent = create_agent(model, middleware=[CapabilityGate(estimator=OfModel("other-model"))])
    with pytest.raises(SettingsError, match=r"'other-model'.*'served-model'.*allow_other_target"):
        _ask(agent, "What is 2 + 2?")
    assert model.i == 0  # FakeListChatModel's next response index: nothing was drawn
    allowed = CapabilityGate(estimator=OfModel("other-model"), allow_other_target=True)
    agent = create_agent(NamedModel(responses=["4", "5"]), middleware=[allowed])
    _ask(agent, "What is 2 + 2?")
    out = _ask(agent, "What is 2 + 3?")
    decision = out["capgate_decision"]
    assert (decision["target"], decision["target_override"]) == ("served-model", True)


def test_an_explicit_target_wins() -> None:
    gate = CapabilityGate(estimator=KeywordEstimator({}), target="my-deployment")
    agent = create_agent(NamedModel(responses=["4"]), middleware=[gate])
    out = _ask(agent, "What is 2 + 2?")
    assert out["capgate_decision"]["target"] == "my-deployment"


def test_a_first_resample_step_is_logged_once_with_its_samples_and_the_target(tmp_path: Path) -> None:
    policy = Policy.model_validate(
        {
            "name": "resampling",
            "bands": [
                {"below": 0.8, "action": "resample", "max_samples": 4, "batch_size": 2},
                {"action": "answer"},
            ],
            "on_degraded": "abstain",
        }
    )
    log = DecisionLog(tmp_path / "log.sqlite3")
    gate = CapabilityGate(policy=policy, estimator=KeywordEstimator({"MID": 0.5}), log=log)
    agent = create_agent(NamedModel(responses=["4"] * 8), middleware=[gate])
    out = _ask(agent, "MID: what is 2 + 2?")
    (logged,) = log.decisions()
    assert (logged.decision.action, logged.decision.target) == ("resample", "served-model")
    assert out["capgate_decision"]["target"] == "served-model"
    assert logged.decision.stopped_by is not None
    assert logged.samples_used is not None
    assert logged.samples_used >= 2


class Down(FakeListChatModel):
    """A chat model without a model name whose server is down."""

    def _call(self, *args: Any, **kwargs: Any) -> str:
        raise ConnectionError("model server down")


def test_a_resample_step_is_logged_when_the_model_fails_before_showing_its_name(tmp_path: Path) -> None:
    policy = Policy.model_validate(
        {
            "name": "resampling",
            "bands": [{"below": 0.8, "action": "resample"}, {"action": "answer"}],
            "on_degraded": "abstain",
        }
    )
    log = DecisionLog(tmp_path / "log.sqlite3")
    gate = CapabilityGate(policy=policy, estimator=KeywordEstimator({"MID": 0.5}), log=log)
    agent = create_agent(Down(responses=["4"]), middleware=[gate])
    with pytest.raises(ConnectionError):
        _ask(agent, "MID: what is 2 + 2?")
    (logged,) = log.decisions()
    assert logged.decision.action == "resample"
    assert gate.stats.last_decision is not None
    assert logged.decision.id == gate.stats.last_decision.id
