"""Policies, step by step: load the presets, validate a policy file, decide on estimates, and set
the answer threshold with a risk guarantee on real data.

Data: the paper's Probe-MATH capability estimates for gpt-oss-20b on MATH-500, each question
sampled 100 times (sdk/assets/math500_gpt-oss-20b_probe-math.jsonl; see its README).

Run: .venv/bin/python examples/policy_walkthrough.py
"""

from __future__ import annotations

from collections.abc import Sequence

from capgate import Estimate
from capgate.assets import MATH500_GPT_OSS_20B
from capgate.decision import calibrate_threshold
from capgate.labels import read_labelled
from capgate.policies import PRESETS, Policy, PolicyError, load_policy

DATA = MATH500_GPT_OSS_20B

BROKEN = """\
version: 1
name: broken
bands:
  - {below: 0.5, action: abstain}
  - {below: 0.4, action: answer}
on_degraded: {action: shrug}
"""


def main(argv: Sequence[str] | None = None) -> None:
    # 1. The shipped presets.
    for name in PRESETS:
        policy = load_policy(name)
        rule = policy.rule()
        edges = ", ".join(f"{rule.interval(i)} {band.action}" for i, band in enumerate(rule.bands))
        print(f"preset {name}: {edges}; on_degraded: {policy.on_degraded.action}")

    # 2. Validation: every problem is reported with its line and field.
    try:
        Policy.from_yaml_text(BROKEN, source="broken.yaml")
    except PolicyError as error:
        print(f"invalid policy:\n{error}")

    # 3. Decisions on a few estimates, including an unavailable one (the fail-safe fires).
    balanced = load_policy("balanced")
    for estimate in (
        Estimate(p=0.92, method="probe"),
        Estimate(p=0.45, method="probe"),
        Estimate(p=0.12, method="probe"),
        Estimate.unavailable("probe", "hidden states not available"),
    ):
        decision = balanced.decide(estimate)
        print(f"p={estimate.p}: {decision.action} ({decision.reason})")

    # 4. Calibrate the answer threshold: selective risk <= 3% with probability >= 90%.
    data = read_labelled(DATA, confidence=["probe_conf_raw"])
    control = calibrate_threshold(data.confidences["probe_conf_raw"], data.mu_hat, alpha=0.03, delta=0.1)
    if control.threshold is None:
        print("no threshold certifies the risk target on this data")
        return
    print(
        f"calibrated threshold: {control.threshold:.3f} (answers {control.n_answered} of {control.n} "
        f"questions, their mean accuracy {control.mean_mu:.3f})"
    )
    calibrated, notes = balanced.with_answer_threshold(control.threshold)
    for note in notes:
        print(f"  {note}")
    print(f"calibrated policy bands: {calibrated.rule().edges}")


if __name__ == "__main__":
    main()
