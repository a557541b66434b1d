"""The decision log's storage: :class:`~capgate.decision.store.log.DecisionLog` over SQLite or
PostgreSQL (one schema, :mod:`capgate.decision.store.schema`), outcomes, calibration versions,
logged features and the spill file a log outage writes. Import the public names from
:mod:`capgate.decision`."""
