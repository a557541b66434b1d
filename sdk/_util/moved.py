"""Old import paths of modules that moved into folders by job (0.2.0) keep working.

``import capgate.harvest`` still gives the module now at ``capgate.labels.harvesting`` (the same
module object, so patches and ``isinstance`` checks agree), with a :class:`DeprecationWarning`
naming the new path. Only public modules are kept; private ones (``capgate._validate``...) moved
without an alias.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

MOVED_MODULES: dict[str, str] = {
    "capgate.backend": "capgate.core.backend",
    "capgate.decision.calibrations": "capgate.decision.store.calibrations",
    "capgate.decision.features": "capgate.decision.store.features",
    "capgate.decision.log": "capgate.decision.store.log",
    "capgate.decision.monitor": "capgate.decision.analysis.monitor",
    "capgate.decision.outcomes": "capgate.decision.store.outcomes",
    "capgate.decision.postgres": "capgate.decision.store.postgres",
    "capgate.decision.report": "capgate.decision.analysis.report",
    "capgate.decision.risk": "capgate.decision.analysis.risk",
    "capgate.decision.simulate": "capgate.decision.analysis.simulate",
    "capgate.decision.spill": "capgate.decision.store.spill",
    "capgate.demo_compare": "capgate.demo.comparison",
    "capgate.demo_replay": "capgate.demo.replay",
    "capgate.features": "capgate.local.hidden_states",
    "capgate.harvest": "capgate.labels.harvesting",
    "capgate.harvest_ray": "capgate.labels.harvest_ray",
    "capgate.messages": "capgate.core.messages",
    "capgate.models": "capgate.local.models",
    "capgate.plots": "capgate.metrics.plots",
    "capgate.report": "capgate.metrics.table",
    "capgate.telemetry": "capgate.gate.telemetry",
}
"""Old module path -> where the module lives now."""


class _MovedModuleLoader(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self._new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} moved to {self._new}; import it from there (the old path goes in a later release)",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(self._new)

    def exec_module(self, module: ModuleType) -> None:
        """The module was executed under its new name already."""


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds a moved module under its old name (installed once by ``capgate/__init__``)."""

    def find_spec(
        self, fullname: str, path: object = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = MOVED_MODULES.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _MovedModuleLoader(new))


def install() -> None:
    """Put the finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
