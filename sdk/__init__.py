"""capgate: predict an LLM's capability on a query, and act on it.

``capgate`` is the ``sdk/`` folder; ``capgate.adapters`` is ``adapters/`` and ``capgate.policies``
is ``policies/``.

The capability µ(x) is the expected accuracy of a response sampled from the model on query x.
capgate estimates it (a probe on hidden states, verbalized confidence, P(True), consistency),
measures how well-calibrated those estimates are, and lets policies act on them.

Importing capgate is light: heavy optional dependencies (torch, transformers, vllm, langgraph,
langchain, openai) load only inside the modules that need them.
"""

from importlib import metadata as _metadata

from capgate._util import moved as _moved
from capgate.core.backend import AsyncBackend, Backend, ChatMessage, Generation, Prompt, SamplingParams
from capgate.core.types import (
    Action,
    ConfidenceGap,
    Cost,
    Decision,
    Estimate,
    Extractor,
    LabelledQuery,
    Outcome,
    PaperConfidenceGap,
    RoutePlan,
    Sample,
    SamplingPlan,
    StopSettings,
)
from capgate.errors import (
    BackendError,
    CapgateError,
    DataError,
    LogUnavailableError,
    MessageError,
    MissingExtraError,
    NotFittedError,
    ProbeMismatchError,
    SettingsError,
)
from capgate.estimators.base import CapabilityEstimator
from capgate.gate import (
    Abstained,
    ClarificationNeeded,
    Escalated,
    Gate,
    GateBlocked,
    Gated,
    GateSettings,
    GateStats,
    ResampleFailed,
    Sampled,
    Verdict,
    default_estimator,
    default_extract,
    set_default_estimator,
)
from capgate.gate.decorator import guard, last_decision
from capgate.loading import load_estimator
from capgate.local.process import ProcessTuning, tune_process
from capgate.policies import Policy, load_policy

_moved.install()

try:
    __version__ = _metadata.version("capgate")
except _metadata.PackageNotFoundError:  # a source tree put on the path without installing it
    __version__ = "0+unknown"
"""The installed version (declared once, in ``pyproject.toml``); ``"0+unknown"`` if never installed."""

__all__ = [
    "Abstained",
    "Action",
    "AsyncBackend",
    "Backend",
    "BackendError",
    "CapabilityEstimator",
    "CapgateError",
    "ChatMessage",
    "ClarificationNeeded",
    "ConfidenceGap",
    "Cost",
    "DataError",
    "Decision",
    "Escalated",
    "Estimate",
    "Extractor",
    "Gate",
    "GateBlocked",
    "GateSettings",
    "GateStats",
    "Gated",
    "Generation",
    "LabelledQuery",
    "LogUnavailableError",
    "MessageError",
    "MissingExtraError",
    "NotFittedError",
    "Outcome",
    "PaperConfidenceGap",
    "Policy",
    "ProbeMismatchError",
    "ProcessTuning",
    "Prompt",
    "ResampleFailed",
    "RoutePlan",
    "Sample",
    "Sampled",
    "SamplingParams",
    "SamplingPlan",
    "SettingsError",
    "StopSettings",
    "Verdict",
    "__version__",
    "default_estimator",
    "default_extract",
    "guard",
    "last_decision",
    "load_estimator",
    "load_policy",
    "set_default_estimator",
    "tune_process",
]
