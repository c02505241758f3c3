"""Exception types.

Every error a user can cause derives from ``ValueError`` (bad value) so callers
can catch broadly, while the subclass tells which layer rejected the input.  Each
message names the offending item (system index, parameter, config key) and the fix.
"""

from __future__ import annotations


class AlchemiError(Exception):
    """Base of all alchemi_lit errors."""


class StructureError(AlchemiError, ValueError):
    """An input structure cannot be simulated (NaN coordinates, zero mass, ...)."""

    def __init__(self, message: str, system_index: int | None = None) -> None:
        super().__init__(message)
        self.system_index = system_index


class ConfigError(AlchemiError, ValueError):
    """A parameter or configuration value is invalid."""


class ModelError(AlchemiError, ValueError):
    """A model cannot evaluate the given batch (unsupported element, ...)."""
