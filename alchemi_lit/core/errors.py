"""Exception types.

Every error a user can cause derives from ``ValueError`` (bad value) so callers
can catch broadly, while the subclass tells which layer rejected the input.  Each
message names the offending item (system index, parameter, config key) and the fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class AlchemiError(Exception):
    """Base of all alchemi_lit errors."""


class StructureError(AlchemiError, ValueError):
    """An input structure cannot be simulated (NaN coordinates, zero mass, ...)."""

    def __init__(self, message: str, system_index: int | None = None) -> None:
        super().__init__(message)
        self.system_index = system_index

    def __reduce__(self) -> tuple[Any, ...]:  # keeps system_index across processes
        return (type(self), (str(self), self.system_index))


class ConfigError(AlchemiError, ValueError):
    """A parameter or configuration value is invalid."""


class ModelError(AlchemiError, ValueError):
    """A model cannot evaluate the given batch (unsupported element, ...)."""


class BatchError(AlchemiError, ValueError):
    """Batches cannot be combined or selected as asked (a repeated ``system_id``, a field
    declared differently in two batches)."""


class StructureWarning(UserWarning):
    """An input structure that can be simulated but looks wrong (atoms closer than
    ``min_distance``, momenta on fixed atoms ...).

    A warning, not an error, because such structures are sometimes intended; filter it
    with :mod:`warnings` (``warnings.simplefilter("error", StructureWarning)`` makes it
    fatal).  ``system_index`` and ``system_id`` say which system it is about.
    """

    def __init__(
        self, message: str, system_index: int | None = None, system_id: int | None = None
    ) -> None:
        super().__init__(message)
        self.system_index = system_index
        self.system_id = system_id


class UnitWarning(UserWarning):
    """A parameter whose value is far outside its usual range, most likely given in
    another unit (``dt=0.002``: ps for fs; ``fmax=50``: meV/Å for eV/Å).

    A warning, not an error, because unusual values are sometimes meant (a 0.01 fs step
    for a hydrogen plasma).  The message names the parameter, its unit and the value
    most likely meant; each parameter and value is reported once per process.  Filter it
    with :mod:`warnings` (``warnings.simplefilter("ignore", UnitWarning)``).
    """


def first_line(exc: BaseException, limit: int = 200) -> str:
    """The first line of an exception's message, cut to ``limit`` characters: what a
    one-line warning about a fallback quotes."""
    return (str(exc).strip().splitlines() or [""])[0][:limit]


def system_name(index: int, system_id: int | None = None) -> str:
    """How every message names a system: ``system 2 (system_id 30)``.

    ``index`` is the position in the caller's input, ``system_id`` the global id; the id
    is left out when unknown or equal to the index (the default ids): ``system 2``.
    """
    if system_id is None or int(system_id) == int(index):
        return f"system {index}"
    return f"system {index} (system_id {int(system_id)})"


def row_names(batch: Any, rows: Sequence[int], limit: int = 5) -> str:
    """The :func:`system_name` of a batch's ``rows``, the first ``limit`` of them, for a
    message that refuses them (``system 0, system 3 (system_id 7)``)."""
    return ", ".join(system_name(r, int(batch.system_id[r])) for r in list(rows)[:limit])
