"""capgate: predict an LLM's capability on a query, and act on it.

The capability µ(x) is the expected accuracy of a response sampled from the model on query x.
capgate estimates it (a probe on hidden states, verbalized confidence, P(True), consistency),
measures how well-calibrated those estimates are, and lets policies act on them.

Importing capgate is light: heavy optional dependencies (torch, transformers, vllm, langgraph,
langchain, openai) load only inside the modules that need them.
"""

from capgate._types import Cost, Estimate, LabelledQuery, Sample
from capgate.backend import AsyncBackend, Backend, Generation, SamplingParams
from capgate.errors import BackendError, CapgateError, DataError, NotFittedError, ProbeMismatchError
from capgate.estimators.base import CapabilityEstimator
from capgate.gate import Gate, GateBlocked, Gated
from capgate.guard import guard
from capgate.loading import load_estimator
from capgate.policies import Policy, load_policy

__version__ = "0.1.0"

__all__ = [
    "AsyncBackend",
    "Backend",
    "BackendError",
    "CapabilityEstimator",
    "CapgateError",
    "Cost",
    "DataError",
    "Estimate",
    "Gate",
    "GateBlocked",
    "Gated",
    "Generation",
    "LabelledQuery",
    "NotFittedError",
    "Policy",
    "ProbeMismatchError",
    "Sample",
    "SamplingParams",
    "__version__",
    "guard",
    "load_estimator",
    "load_policy",
]
