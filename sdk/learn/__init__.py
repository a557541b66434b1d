"""Learning from the decision log: calibrate the gate's estimator on its own traffic.

:func:`calibrate` (``capgate calibrate --db LOG --out DIR``) reads the logged decisions with
outcomes of one target and one estimator method, holds out the latest ones, fits candidates on
the older ones (isotonic and Platt maps of the logged estimates, a probe on logged reader
features), keeps the previous estimator unless a candidate beats it on the held-out outcomes,
certifies an answer threshold by Learn-then-Test when asked (``risk``), and writes a versioned
:class:`Calibration` folder atomically. ``capgate.load_estimator(..., calibration=DIR)``, or a
gate's ``calibration`` setting, applies it; every decision records its version.

Examples:
    >>> import numpy as np, tempfile, os
    >>> from capgate import Estimate
    >>> from capgate.decision import Decision, DecisionLog
    >>> folder = tempfile.mkdtemp()
    >>> rng = np.random.default_rng(0)
    >>> with DecisionLog(os.path.join(folder, "log.sqlite3")) as log:
    ...     for p in rng.uniform(0.05, 0.95, 300):  # an overconfident estimator: truth is p³
    ...         d = Decision(action="answer", estimate=Estimate(p=float(p), method="verbalized"),
    ...                      reason="test", target="m")
    ...         _ = log.record(d)
    ...         _ = log.record_outcome(d.id, correct=bool(rng.random() < p**3))
    ...     result = calibrate(log, out=os.path.join(folder, "cal"))
    >>> result.kind in ("isotonic", "platt"), result.calibration.version.startswith("cal-")
    (True, True)
"""

from capgate.learn._artefact import Calibration, content_version
from capgate.learn._calibrate import MIN_OUTCOMES, CalibrationResult, calibrate
from capgate.learn._crossfit import CrossFit, Split, cross_fit, fold_blocks, time_split
from capgate.learn._select import SELECTION_LEVEL, HeldOutRow, select, table_rows
from capgate.learn._traffic import CalibrationRefusedError, Traffic, base_method, read_traffic

__all__ = [
    "MIN_OUTCOMES",
    "SELECTION_LEVEL",
    "Calibration",
    "CalibrationRefusedError",
    "CalibrationResult",
    "CrossFit",
    "HeldOutRow",
    "Split",
    "Traffic",
    "base_method",
    "calibrate",
    "content_version",
    "cross_fit",
    "fold_blocks",
    "read_traffic",
    "select",
    "table_rows",
    "time_split",
]
