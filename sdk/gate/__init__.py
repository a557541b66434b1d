"""The capability gate: estimate a query's capability, let a policy decide, act on the decision.

:class:`Gate` is the object every integration shares (:func:`~capgate.guard`, the LangGraph nodes
of :mod:`capgate.adapters.agents.langgraph`, the LangChain middleware of
:mod:`capgate.adapters.agents.langchain`): they differ only in how they read the query and carry
out the action. The gate estimates (:meth:`Gate.assess` / :meth:`Gate.aassess`), decides through
its :class:`~capgate.policies.Policy` (the :class:`~capgate.Decision` carries all its action
needs), counts (:class:`GateStats`), logs to an optional :class:`~capgate.decision.DecisionLog`,
runs ``resample`` through CAS over any function that draws one response per call
(:meth:`Gate.sample` / :meth:`Gate.asample`), and turns ``abstain`` / ``clarify`` / ``escalate``
into a :class:`Gated` result or a :class:`GateBlocked` exception (:meth:`Gate.block`). Per-call
settings: :meth:`Gate.with_options`.

Learning from traffic (``capgate calibrate``): ``log_features``, ``calibration`` (or the log's
:data:`PROMOTED` version) and ``shadow_calibration`` (or the log's :data:`CANDIDATE`), see
:class:`GateSettings`; every decision records its ``calibration`` version.
"""

from capgate.core.messages import as_query
from capgate.core.types import Extractor
from capgate.gate._defaults import default_estimator, default_extract, set_default_estimator
from capgate.gate._gate import Gate
from capgate.gate._results import (
    RESAMPLE_FAILED_MESSAGE,
    Abstained,
    ClarificationNeeded,
    Escalated,
    GateBlocked,
    Gated,
    ResampleFailed,
    Sampled,
    Verdict,
)
from capgate.gate._settings import (
    CANDIDATE,
    PROMOTED,
    UNSET,
    CalibrationLike,
    CalibrationSetting,
    GateOptions,
    GateSettings,
    OnBlock,
    PolicyLike,
    SharedOptions,
    Unset,
)
from capgate.gate._stats import GateStats

__all__ = [
    "CANDIDATE",
    "PROMOTED",
    "RESAMPLE_FAILED_MESSAGE",
    "UNSET",
    "Abstained",
    "CalibrationLike",
    "CalibrationSetting",
    "ClarificationNeeded",
    "Escalated",
    "Extractor",
    "Gate",
    "GateBlocked",
    "GateOptions",
    "GateSettings",
    "GateStats",
    "Gated",
    "OnBlock",
    "PolicyLike",
    "ResampleFailed",
    "Sampled",
    "SharedOptions",
    "Unset",
    "Verdict",
    "as_query",
    "default_estimator",
    "default_extract",
    "set_default_estimator",
]
