"""Decision records, the decision log, replay and monitoring."""
