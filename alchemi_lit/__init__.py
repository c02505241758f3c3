"""alchemi_lit: relax and simulate thousands of atomic structures at once."""

from .errors import AlchemiError, ConfigError, ModelError, StructureError
from .state import Batch

__version__ = "0.1.0"

__all__ = ["AlchemiError", "Batch", "ConfigError", "ModelError", "StructureError", "__version__"]
