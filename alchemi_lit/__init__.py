"""alchemi_lit: relax and simulate thousands of atomic structures at once."""

from .errors import AlchemiError, ConfigError, ModelError, StructureError
from .hooks import Callback, HookStageEnum
from .results import Results
from .simulator import Simulator
from .stages import Fused, Pipeline
from .state import Batch

__version__ = "0.1.0"

__all__ = [
    "AlchemiError",
    "Batch",
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
