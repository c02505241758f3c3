"""The sink interface, the in-memory sink, and the error a buffering sink raises.

Sinks receive *host* batches of graduated systems (see :mod:`alchemi_lit.sinks`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from ..core.errors import BatchError, ConfigError
from ..core.state import Batch
from ..io.results import Results
from ..io.serialize import batch_from_state, batch_state


class Sink:
    """Base class.  Subclasses implement :meth:`write` and may limit :meth:`free`."""

    def open(self, run_info: dict[str, Any]) -> None:
        """Called once at run start with the resolved configuration and versions."""

    def free(self) -> float:
        """How many more systems this sink accepts (``math.inf`` if unbounded)."""
        return math.inf

    def write(self, batch: Batch) -> None:
        raise TypeError(f"{type(self).__name__} does not implement write()")

    def flush(self) -> None:
        """Make everything written so far durable (before checkpoints and at close)."""

    def close(self) -> None:
        """Flush and release resources (called at run end, also after a failure)."""
        self.flush()

    def read_batch(self) -> Batch | None:
        raise TypeError(f"{type(self).__name__} cannot be read back")

    def read(self) -> Results:
        """What the sink holds as :class:`~alchemi_lit.io.results.Results` (``system_id``
        order; a sequence of ``ase.Atoms`` with energies and info)."""
        return Results(self.read_batch())

    def __len__(self) -> int:
        return 0

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must remember to resume writing exactly once."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Return to the state of :meth:`state_dict` (roll back later writes)."""


class HostMemory(Sink):
    """Keep finished systems in host memory, up to ``capacity`` systems (None: no limit)."""

    def __init__(self, capacity: int | None = None) -> None:
        if capacity is not None and int(capacity) < 1:
            raise ConfigError(f"HostMemory capacity must be >= 1, got {capacity}")
        self.capacity = None if capacity is None else int(capacity)
        self._parts: list[Batch] = []
        self._count = 0

    def free(self) -> float:
        return math.inf if self.capacity is None else self.capacity - self._count

    def write(self, batch: Batch) -> None:
        if batch.num_systems > self.free():
            raise ConfigError(f"HostMemory is full ({self._count}/{self.capacity} systems)")
        self._parts.append(batch.to(device="cpu"))
        self._count += batch.num_systems

    def latest(self) -> Batch:
        """The host copy of what the last :meth:`write` kept (results hold it, not the
        device's tensors: a GPU run's results must not pin device memory)."""
        return self._parts[-1]

    def __len__(self) -> int:
        return self._count

    def state_dict(self) -> dict[str, Any]:
        batch = self.read_batch()
        return {"batch": None if batch is None else batch_state(batch)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        batch = state.get("batch")
        self._parts = [] if batch is None else [batch_from_state(batch)]
        self._count = sum(b.num_systems for b in self._parts)

    def clear(self) -> None:
        """Forget every stored system (e.g. between runs that reuse system_ids)."""
        self._parts, self._count = [], 0

    def read_batch(self) -> Batch | None:
        if not self._parts:
            return None
        try:
            merged = Batch.concatenate(self._parts) if len(self._parts) > 1 else self._parts[0]
        except BatchError as exc:
            raise BatchError(
                f"HostMemory holds systems of several runs that share system_ids ({exc}); "
                f"read it after each run and call clear(), or give each run its own HostMemory"
            ) from exc
        self._parts = [merged]
        order = torch.argsort(merged.system_id, stable=True)
        return merged.select(order)


class SinkFlushError(RuntimeError):
    """A buffered sink could not write; ``batch`` holds every system it had buffered."""

    def __init__(self, message: str, batch: Batch) -> None:
        super().__init__(message)
        self.batch = batch


def id_list(ids: Sequence[int], shown: int = 10) -> str:
    """``"0, 1, 2 ..."``: the first ``shown`` ids of a list, for messages."""
    return ", ".join(str(int(i)) for i in ids[:shown]) + (" ..." if len(ids) > shown else "")
