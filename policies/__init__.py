"""Declarative capability policies (YAML files validated by pydantic) and the shipped presets."""

__all__: list[str] = []
