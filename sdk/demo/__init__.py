"""``capgate demo``: the live part (a gated agent on the embedded model, :mod:`capgate.demo.live`),
the embedded model taught by C3RL stating its confidence beside the probe
(:mod:`capgate.demo.verbalized`), the replay of recorded data from a real 20B model
(:mod:`capgate.demo.replay`) and the comparison of answering with and without the gate
(:mod:`capgate.demo.comparison`)."""

from capgate.demo.comparison import Comparison, compare
from capgate.demo.live import DEMO_POLICY, DemoQuestion, DemoReport, DemoRow, demo_questions, run_demo
from capgate.demo.replay import ReplayReport, replay_math500
from capgate.demo.verbalized import VerbalizedReport, VerbalizedRow, run_verbalized

__all__ = [
    "DEMO_POLICY",
    "Comparison",
    "DemoQuestion",
    "DemoReport",
    "DemoRow",
    "ReplayReport",
    "VerbalizedReport",
    "VerbalizedRow",
    "compare",
    "demo_questions",
    "replay_math500",
    "run_demo",
    "run_verbalized",
]
