"""Results of a run: every system's final state, in input (``system_id``) order."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .state import EXIT_REASONS, Batch


class Results:
    """Final states of the systems a run processed, sorted by ``system_id``.

    With a bounded :class:`~alchemi_lit.sinks.HostMemory` first in the sinks, these are
    the systems it kept; once it filled up, the rest went to the later sinks (the repr
    says how many, and where; ``stats["systems"]`` counts them all).

    ``results.batch`` is the tensor view; :meth:`to_atoms` gives ``ase.Atoms`` with a
    single-point calculator (energy, forces, stress) and ``info`` (system_id, steps,
    converged, exit_reason), so ASE tools work on them directly.
    """

    def __init__(
        self,
        batch: Batch | None,
        stats: dict[str, Any] | None = None,
        sinks: Sequence[Any] = (),
    ) -> None:
        if batch is not None and batch.num_systems:
            order = torch.argsort(batch.system_id.cpu(), stable=True).to(batch.device)
            batch = batch.select(order)
        self._batch = batch
        self.sinks = list(sinks)
        self.stats = dict(stats or {})
        # read lazily from a store that earlier runs appended to, this run's systems are
        # the rows of the store's latest run, pinned now (later runs may append more)
        pin = batch is None
        self._runs = [getattr(s, "latest_run", lambda: None)() if pin else None for s in sinks]

    @classmethod
    def from_sinks(
        cls,
        sinks: Sequence[Any],
        in_memory: Sequence[Batch],
        overflow: Sequence[Batch],
        stats: dict[str, Any],
    ) -> Results:
        """Results of a run: what it wrote to in-memory sinks (plus any overflow); with
        no in-memory sink, read lazily from the first sink that can be read back."""
        parts = [*in_memory, *overflow]
        batch = Batch.concatenate(parts) if len(parts) > 1 else (parts[0] if parts else None)
        return cls(batch, stats, sinks)

    @property
    def batch(self) -> Batch | None:
        """All result systems as one Batch (read from a sink on first access if needed)."""
        if self._batch is None:
            for sink, run in zip(self.sinks, self._runs):
                try:
                    b = sink.read_batch() if run is None else sink.read_batch(run=run)
                except TypeError:
                    continue
                if b is not None:
                    self._batch = b
                    break
        return self._batch

    def __len__(self) -> int:
        return 0 if self.batch is None else self.batch.num_systems

    def to_atoms(self) -> list[Any]:
        return [] if self.batch is None else self.batch.to_atoms(results=True)

    @property
    def system_id(self) -> torch.Tensor:
        return self.batch.system_id

    @property
    def energy(self) -> torch.Tensor:
        """Final potential energy per system (eV)."""
        return self.batch.energy

    @property
    def converged(self) -> torch.Tensor:
        """Every optimizer stage the system went through met its criterion."""
        return self.batch.converged

    @property
    def steps(self) -> torch.Tensor:
        """Total steps taken per system, all stages together."""
        return self.batch.total_steps

    @property
    def stage_steps(self) -> torch.Tensor:
        """Steps each system spent in each stage ``[S, k]`` (one column per stage)."""
        return self.batch.stage_steps

    @property
    def stage_energy(self) -> torch.Tensor:
        """Potential energy (eV) of each system when it left each stage ``[S, k]``; NaN
        for a stage it did not leave (quarantined before, or never reached)."""
        return self.batch.stage_energy

    @property
    def exit_reasons(self) -> list[str]:
        return [EXIT_REASONS.get(int(c), "unknown") for c in self.batch.exit_code.tolist()]

    def __repr__(self) -> str:
        if self.batch is None:
            return f"Results(systems=0, stats={self.stats})"
        return (
            f"Results(systems={len(self)}{self._elsewhere()}, "
            f"converged={int(self.converged.sum())}, steps={int(self.steps.sum())})"
        )

    def _elsewhere(self) -> str:
        """Where the run's other systems are, when an in-memory sink filled up and these
        results hold only its share (so a short count does not read as a loss)."""
        total = self.stats.get("systems")
        if total is None or int(total) <= len(self):
            return ""
        stores = [str(s.path) for s in self.sinks if hasattr(s, "path")]
        where = f" in {', '.join(stores)}" if stores else ""
        return f" of {int(total)}; the other {int(total) - len(self)} went to later sinks{where}"
