"""alchemi_lit: relax and simulate thousands of atomic structures at once.

The public names are imported on first use (PEP 562): ``import alchemi_lit`` and
``alchemi-lit --help`` then start without importing torch (over a second on a laptop).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .core.errors import AlchemiError, ConfigError, ModelError, StructureError
from .core.version import __version__

if TYPE_CHECKING:
    from .core.state import Batch
    from .engine.hooks import Callback, HookStageEnum
    from .integrators.stages import Fused, Pipeline
    from .io.results import Results
    from .simulator import Simulator
    from .strategies.buffers import BufferConfig


#: public name -> the module that defines it
_LAZY = {
    "Batch": ".core.state",
    "BufferConfig": ".strategies.buffers",
    "Callback": ".engine.hooks",
    "Fused": ".integrators.stages",
    "HookStageEnum": ".engine.hooks",
    "Pipeline": ".integrators.stages",
    "Results": ".io.results",
    "Simulator": ".simulator",
}

__all__ = [
    "AlchemiError",
    "Batch",
    "BufferConfig",
    "Callback",
    "ConfigError",
    "Fused",
    "HookStageEnum",
    "ModelError",
    "Pipeline",
    "Results",
    "Simulator",
    "StructureError",
    "__version__",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'alchemi_lit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
