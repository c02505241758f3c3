"""Old import paths of modules that moved (issue #28), kept for one release.

The package's folders show its layers (``core/``, ``io/``, ``report/``, ...); code that
imports a module by its old path (``alchemi_lit.state``) still works: a finder on
``sys.meta_path`` answers the old name with the module at its new path -- the *same*
module object, so a setting changed through either name (``tensor_ops.CPU_READS_FREE``)
is one setting -- and warns once per old name (DeprecationWarning).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import Any

#: old module path -> new module path
MOVED = {
    "alchemi_lit.errors": "alchemi_lit.core.errors",
    "alchemi_lit.version": "alchemi_lit.core.version",
    "alchemi_lit.units": "alchemi_lit.core.units",
    "alchemi_lit.tensor_ops": "alchemi_lit.core.tensor_ops",
    "alchemi_lit.segments": "alchemi_lit.core.segments",
    "alchemi_lit.random": "alchemi_lit.core.random",
    "alchemi_lit.linalg": "alchemi_lit.core.linalg",
    "alchemi_lit.backends": "alchemi_lit.core.backends",
    "alchemi_lit.info_codec": "alchemi_lit.core.info_codec",
    "alchemi_lit.fields": "alchemi_lit.core.fields",
    "alchemi_lit.geometry": "alchemi_lit.core.geometry",
    "alchemi_lit.validation": "alchemi_lit.core.validation",
    "alchemi_lit.atoms_codec": "alchemi_lit.core.atoms_codec",
    "alchemi_lit.state": "alchemi_lit.core.state",
    "alchemi_lit.registry": "alchemi_lit.core.registry",
    "alchemi_lit.compiling": "alchemi_lit.core.compiling",
    "alchemi_lit.heap": "alchemi_lit.core.heap",
    "alchemi_lit.results": "alchemi_lit.io.results",
    "alchemi_lit.results_store": "alchemi_lit.io.results_store",
    "alchemi_lit.serialize": "alchemi_lit.io.serialize",
    "alchemi_lit.trajectory_store": "alchemi_lit.io.trajectory_store",
    "alchemi_lit.hooks": "alchemi_lit.engine.hooks",
    "alchemi_lit.stages": "alchemi_lit.integrators.stages",
    "alchemi_lit.convergence": "alchemi_lit.integrators.convergence",
    "alchemi_lit.report_plots": "alchemi_lit.report.plots",
    "alchemi_lit.report_runs": "alchemi_lit.report.runs",
    "alchemi_lit.workflows.bands": "alchemi_lit.io.bands",
}


class _Forwarder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old path as the module at its new path."""

    def __init__(self) -> None:
        self._own_spec: dict[str, Any] = {}

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: Any) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} moved to {new}; import it from there (the old path goes in the "
            f"next release)", DeprecationWarning, stacklevel=2,
        )
        module = importlib.import_module(new)
        self._own_spec[new] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # (already executed at its new path; the import system has just given it the
        # old name's spec: its own goes back, or its relative imports would warn)
        module.__spec__ = self._own_spec.pop(module.__name__, module.__spec__)


def old_attribute(package: ModuleType, name: str) -> ModuleType | None:
    """``alchemi_lit.<name>`` for an old module name (``al.stages``), imported through
    its old path (so it warns), or None."""
    if f"{package.__name__}.{name}" not in MOVED:
        return None
    return importlib.import_module(f"{package.__name__}.{name}")


def install() -> None:
    """Put the forwarder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _Forwarder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Forwarder())


__all__ = ["MOVED", "install", "old_attribute"]
