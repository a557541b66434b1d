"""Every text a policy shows to a user, a human reviewer or a log, in one place.

Templates are ``str.format`` strings. The placeholders a policy file may use in its own
``message`` / ``question`` / ``summary`` texts are listed in :data:`PLACEHOLDERS`; ``{p}`` accepts a
format spec (``{p:.0%}``) and renders as ``unavailable`` when the estimate has no value.
"""

from __future__ import annotations

PLACEHOLDERS: tuple[str, ...] = ("p", "method", "reason", "step", "tool", "policy")
"""Names a policy text may use: the predicted capability, the estimator that produced it, the
decision's reason (which band or fail-safe fired, and why the estimate was degraded), the agent
step, the gated tool, and the policy's name."""

UNAVAILABLE = "unavailable"
"""How ``{p}`` renders when the estimate carries no value."""

NOT_GIVEN = "-"
"""How ``{step}`` and ``{tool}`` render when the decision has none."""

ABSTAIN_MESSAGE = (
    "I'm not confident I can answer this correctly (estimated chance {p:.0%}), so I won't guess."
)
"""Default text shown to the user when a policy abstains."""

CLARIFY_QUESTION = (
    "I'm not sure I understand the request well enough to answer it reliably. "
    "Could you add details or narrow it down?"
)
"""Default clarifying question put to the user."""

ESCALATE_SUMMARY = (
    "Escalated for human review by policy '{policy}': predicted capability {p} "
    "(estimator: {method}; step: {step}; tool: {tool}). Why: {reason}"
)
"""Default hand-off note given to the human who takes over."""

BAND_REASON = "p={p:.3f} is in band {index} {interval} of {scope}: {action}"
"""``Decision.reason`` when a band fires; ``interval`` reads ``[0.3, 0.6)`` or ``[0.6, 1]``."""

DEGRADED_REASON = "estimate degraded ({why}); on_degraded fail-safe of {scope}: {action}"
"""``Decision.reason`` when the estimate is unavailable or weakened."""
