"""Data files shipped with capgate (the default model's labels and probe)."""
