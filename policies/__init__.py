"""Declarative capability policies (YAML files validated by pydantic) and the shipped presets.

``capgate.policies`` is the ``policies/`` folder (the presets are its ``*.yaml`` files).

A policy maps a predicted capability p to an action through ordered threshold bands covering
[0, 1], with per-step and per-tool overrides and a mandatory ``on_degraded`` fail-safe::

    version: 1
    name: support-bot
    bands:
      - {below: 0.3, action: abstain, message: "I can't answer that reliably."}
      - {below: 0.6, action: clarify, question: "Which product do you mean?"}
      - {action: answer}
    on_degraded: {action: escalate, to: tier-2}
    tools:
      refund: 0.9        # shorthand: abstain below 0.9, answer above

Load one with :func:`load_policy` (a preset name or a path) or :meth:`Policy.from_yaml`; the same
models build a policy in Python. ``capgate policy schema`` prints the JSON Schema.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from capgate.core.types import ConfidenceGap, StopSettings
from capgate.errors import DataError
from capgate.policies._actions import (
    AbstainAction,
    ActionSpec,
    AnswerAction,
    ClarifyAction,
    EscalateAction,
    ResampleAction,
    RouteAction,
    choose_route,
)
from capgate.policies._bands import (
    AbstainBand,
    AnswerBand,
    Band,
    ClarifyBand,
    EscalateBand,
    ResampleBand,
    RouteBand,
)
from capgate.policies._policy import Match, Override, Policy, Rule
from capgate.policies._yaml import PolicyError

__all__ = [
    "PRESETS",
    "AbstainAction",
    "AbstainBand",
    "ActionSpec",
    "AnswerAction",
    "AnswerBand",
    "Band",
    "ClarifyAction",
    "ClarifyBand",
    "ConfidenceGap",
    "EscalateAction",
    "EscalateBand",
    "Match",
    "Override",
    "Policy",
    "PolicyError",
    "ResampleAction",
    "ResampleBand",
    "RouteAction",
    "RouteBand",
    "Rule",
    "StopSettings",
    "choose_route",
    "load_policy",
    "policy_json_schema",
    "preset_path",
]

PRESETS: tuple[str, ...] = ("balanced", "conservative", "cost-saver", "demo-smollm2")
"""Names of the policies shipped with capgate (``policies/<name>.yaml``); ``demo-smollm2`` is
tuned for the embedded default model and its shipped probe (``capgate demo``)."""


def preset_path(name: str) -> Path:
    """Where a shipped preset's YAML file lives.

    Raises:
        KeyError: ``name`` is not a preset.
    """
    if name not in PRESETS:
        raise KeyError(f"no preset named {name!r}; presets: {', '.join(PRESETS)}")
    return Path(str(resources.files(__name__).joinpath(f"{name}.yaml")))


def load_policy(name_or_path: str | Path) -> Policy:
    """Load a shipped preset by name, or a policy file by path.

    Args:
        name_or_path: ``"balanced"``, ``"conservative"``, ``"cost-saver"``, or a file path.

    Returns:
        The validated policy.

    Raises:
        PolicyError: The file is not a valid policy (every problem, with line and field).
        DataError: Neither a preset nor an existing file.

    Examples:
        >>> load_policy("balanced").name
        'balanced'
    """
    if isinstance(name_or_path, str) and name_or_path in PRESETS:
        return Policy.from_yaml(preset_path(name_or_path))
    path = Path(name_or_path)
    if not path.is_file():
        raise DataError(
            f"no policy preset or file named {str(name_or_path)!r}; presets: {', '.join(PRESETS)}"
        )
    return Policy.from_yaml(path)


def policy_json_schema() -> dict[str, Any]:
    """The JSON Schema of policy files (shorthand forms included).

    Examples:
        >>> sorted(policy_json_schema()["required"])
        ['bands', 'name', 'on_degraded']
    """
    schema = Policy.model_json_schema(mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "capgate policy"
    return schema
