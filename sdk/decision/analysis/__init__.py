"""What capgate reads out of a decision log: the report (:mod:`capgate.decision.analysis.report`),
the calibration monitor, risk-controlled thresholds and the replay of a policy over labelled data.
Import the public names from :mod:`capgate.decision`."""
