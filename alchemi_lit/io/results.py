"""Results of a run: every system's final state, in input (``system_id``) order.

One answer wherever results come from: ``Simulator.run``, ``sink.read()`` and
:func:`~alchemi_lit.io.results_store.read_results` all give :class:`Results`.
"""

from __future__ import annotations

import gc
import numbers
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, overload

import torch

from ..core.state import EXIT_REASONS, Batch
from .results_table import COLUMNS as COLUMNS  # (public here too: the table's columns)
from .results_table import join, pick, table_of
from .store_reader import StoreRows


class Results(Sequence[Any]):
    """Final states of the systems a run processed, sorted by ``system_id``.

    A read-only sequence of ``ase.Atoms`` (``len``, ``results[i]``, iteration), each
    with a single-point calculator (energy, forces, stress) and ``info`` (system_id,
    steps, converged, exit_reason ...), so ASE tools work on them directly.  Also:
    ``results.batch`` (the tensor view), per-system tensors (``energy``, ``steps`` ...),
    :meth:`to_pandas` (one row per system), :meth:`write` (any format ``ase.io``
    writes) and ``stats`` (what the run recorded: wall time, steps, forward calls).

    With a bounded :class:`~alchemi_lit.sinks.HostMemory` first in the sinks, these are
    the systems it kept; once it filled up, the rest went to the later sinks (the repr
    says how many, and where; ``stats["systems"]`` counts them all).
    """

    def __init__(
        self,
        batch: Batch | None,
        stats: dict[str, Any] | None = None,
        sinks: Sequence[Any] = (),
        stage_names: Sequence[str] | None = None,
        store: StoreRows | None = None,
    ) -> None:
        if batch is not None and batch.num_systems:
            order = torch.argsort(batch.system_id.cpu(), stable=True).to(batch.device)
            batch = batch.select(order)
        self._batch = batch
        self.sinks = list(sinks)
        self.stats = dict(stats or {})
        #: Labels of the per-stage history columns (``"0:FIRE"``), where known.
        self.stage_names = None if stage_names is None else [str(n) for n in stage_names]
        self._atoms: list[Any] | None = None
        # read lazily from a store that earlier runs appended to, this run's systems are
        # the rows of the store's latest run, pinned now (later runs may append more)
        pin = batch is None
        self._runs = [getattr(s, "latest_run", lambda: None)() if pin else None for s in sinks]
        #: the store rows these results read lazily (None: in memory, or another sink)
        self._store = store
        if pin and store is None:
            self._store = next(
                (StoreRows(s.path, r) for s, r in zip(self.sinks, self._runs) if r is not None),
                None,
            )

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
        """All result systems as one Batch (read from a sink on first access if needed);
        None when there are none."""
        if self._batch is None and self._store is not None:
            self._batch = self._store.read_batch()
        elif self._batch is None:
            for sink, run in zip(self.sinks, self._runs):
                try:
                    b = sink.read_batch() if run is None else sink.read_batch(run=run)
                except TypeError:
                    continue
                if b is not None:
                    self._batch = b
                    break
        return self._batch

    # ------------------------------------------------------------ a sequence of Atoms
    def __len__(self) -> int:
        """The number of systems (read from a store's commit marker: nothing loaded)."""
        if self._batch is None and self._store is not None:
            return len(self._store)
        return 0 if self.batch is None else self.batch.num_systems

    @overload
    def __getitem__(self, index: int) -> Any: ...
    @overload
    def __getitem__(self, index: slice) -> list[Any]: ...
    def __getitem__(self, index: int | slice) -> Any:
        if not isinstance(index, (numbers.Integral, slice)):
            raise TypeError(
                f"Results indices are integers or slices, not {type(index).__name__}; select "
                f"systems by id with results.to_pandas() or results.batch"
            )
        return self._cached_atoms()[index]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._cached_atoms())

    def _cached_atoms(self) -> list[Any]:
        """The Atoms that indexing and iteration hand out: made once, so
        ``results[0]`` is the same object each time, as in a list."""
        if self._atoms is None:
            self._atoms = self.to_atoms()
        return self._atoms

    def to_atoms(self) -> list[Any]:
        """A new list of ``ase.Atoms`` (see :meth:`Batch.to_atoms`), in ``system_id`` order;
        all at once -- for a store of millions of systems, :meth:`iter_atoms`."""
        return [] if self.batch is None else self.batch.to_atoms(results=True)

    def iter_atoms(self, chunk_systems: int = 4096) -> Iterator[Any]:
        """The systems as ``ase.Atoms``, made ``chunk_systems`` at a time: memory bounded
        by one chunk.  Results read from a store that are not loaded yet come in the
        store's row order (each Atoms' ``info["system_id"]`` names it; sorting millions
        would mean loading them); otherwise in ``system_id`` order."""
        for batch in self._chunks(chunk_systems):
            yield from batch.to_atoms(results=True)
            # each Atoms and its calculator reference each other: free the chunk's now,
            # not when a full collection comes round (young generations: cheap)
            gc.collect(1)

    def _chunks(self, chunk_systems: int) -> Iterator[Batch]:
        """The systems a chunk at a time: from the store when not loaded, else slices
        of the batch."""
        if int(chunk_systems) < 1:
            raise ValueError(f"chunk_systems must be >= 1, got {chunk_systems!r}")
        if self._batch is None and self._store is not None:
            yield from self._store.batches(int(chunk_systems))
            return
        batch = self.batch
        for start in range(0, 0 if batch is None else batch.num_systems, int(chunk_systems)):
            stop = min(start + int(chunk_systems), batch.num_systems)
            yield batch.select(torch.arange(start, stop, device=batch.device))

    # ------------------------------------------------------------ tables and files
    def to_pandas(self, columns: Sequence[str] | None = None, chunk_systems: int = 4096) -> Any:
        """One row per system, in ``system_id`` order: a ``pandas.DataFrame``.

        ``columns``: only these (any of the names below), e.g. ``["system_id",
        "energy"]`` for a store of millions of systems.  Results read from a store that
        are not loaded yet are tabulated ``chunk_systems`` at a time, so memory holds the
        table and one chunk, never every system's atoms.

        Columns (:data:`COLUMNS`): ``system_id``, ``formula`` (ASE's Hill formula),
        ``n_atoms``, ``energy`` (eV), ``energy_per_atom``, ``fmax`` (eV/Å: the largest
        force on a free atom), ``volume`` (Å^3; NaN unless periodic in x, y and z),
        ``pressure`` (GPa, ``-trace(stress)/3``; NaN unless periodic in x, y and z),
        ``steps`` (the system's step count: all stages, all runs it went through),
        ``converged``, ``exit_reason``, ``source_file`` (the file the structure came
        from, else None), ``spacegroup_initial`` / ``spacegroup_final`` (spglib's
        number at 1 mÅ as the structure entered and left a relaxation; 0 where not
        periodic or not relaxed) and ``symmetry`` (``kept``, ``broken``, ``raised``,
        ``changed`` or ""); after a replica exchange ``replica_group``, ``temperature``
        (K, the rung each replica ended at) and ``round_trips``; then, per stage of the
        plan, ``steps[NAME]``, ``exit_reason[NAME]`` and ``energy[NAME]`` (eV when it left
        the stage) with ``NAME`` the stage label (``0:FIRE``; ``0:FIRE|0:Langevin`` for a
        column the runs of a store read whole filled with different stages); after a Monte
        Carlo stage (:class:`~alchemi_lit.integrators.SwapMC`, ...) its chain's statistics,
        ``mc_attempts``, ``mc_accepted``, ``mc_acceptance``, ``mc_energy_mean``,
        ``mc_energy_std`` and per species pair or new species
        (:func:`~alchemi_lit.io.results_table.mc_columns`); after ``proposals=k``
        ``mc_chain``, one row per chain (its copy 0; the batch and stores keep all ``k``).
        Energies, forces and stress are NaN for a system never evaluated.
        """
        import pandas as pd

        wanted = None if columns is None else [str(c) for c in columns]
        if self._batch is None and self._store is not None and len(self._store):
            parts = [
                pick(table_of(b, self.stage_names), wanted) for b in self._chunks(chunk_systems)
            ]
            table = pd.DataFrame({k: join([p[k] for p in parts]) for k in parts[0]})
            if "system_id" not in table:
                return table  # (the store's row order: no id to sort by)
            return table.sort_values("system_id", kind="stable", ignore_index=True)
        return pd.DataFrame(pick(table_of(self.batch, self.stage_names), wanted))

    def bands(self) -> Any:
        """The run's nudged elastic bands (:class:`~alchemi_lit.io.bands.BandResults`):
        one :class:`~alchemi_lit.io.bands.Band` per ``path_id`` with its barriers,
        energies along the path and images; ``.to_pandas()`` one row per band."""
        from .bands import band_results

        return band_results(self)

    def write(self, path: str | Path, format: str | None = None, **kwargs: Any) -> None:
        """Write every system with ``ase.io.write`` (extxyz, traj, cif ... any format
        ASE writes; ``format`` guessed from the name when None; ``kwargs`` go to ASE).
        Energies, forces and stress travel as the single-point calculator's results
        and ``info`` as the format keeps it (extxyz and traj keep all of it).  A format
        of one structure per file (POSCAR ...) takes one system: write the others from
        ``for atoms in results``."""
        import ase.io
        from ase.io.formats import filetype, ioformats

        atoms = self.to_atoms()
        if not atoms:
            raise ValueError(f"no systems to write to {str(path)!r}: these Results are empty")
        try:
            name = format or filetype(str(path), read=False)
        except Exception:  # ASE names an unknown format itself, below
            name = None
        if name in ioformats and ioformats[name].single and len(atoms) > 1:
            raise ValueError(
                f"the {name} format holds one structure per file, and these Results hold "
                f"{len(atoms)}: write each to its own file (for atoms in results: "
                f"ase.io.write(name_of(atoms), atoms)), or use extxyz or traj"
            )
        ase.io.write(str(path), atoms, format=format, **kwargs)

    # ------------------------------------------------------------ per-system tensors
    @property
    def system_id(self) -> torch.Tensor:
        return self._field("system_id", torch.int64)

    @property
    def n_atoms(self) -> torch.Tensor:
        return self._field("n_atoms", torch.int64)

    @property
    def energy(self) -> torch.Tensor:
        """Final potential energy per system (eV)."""
        return self._field("energy", torch.float64)

    @property
    def converged(self) -> torch.Tensor:
        """Every optimizer stage the system went through met its criterion."""
        return self._field("converged", torch.bool)

    @property
    def steps(self) -> torch.Tensor:
        """Steps each system has taken, all stages together (runs it continued from a
        results store or a Batch included)."""
        return self._field("total_steps", torch.int64)

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
        return [EXIT_REASONS.get(int(c), "unknown") for c in self._field("exit_code").tolist()]

    def _field(self, name: str, empty: torch.dtype = torch.int64) -> torch.Tensor:
        """A per-system field (an empty tensor when there are no systems)."""
        return torch.zeros(0, dtype=empty) if self.batch is None else self.batch.system[name]

    def __repr__(self) -> str:
        lazy = self._batch is None and self._store is not None and len(self._store) > 0
        if not lazy and self.batch is None:
            return f"Results(systems=0, stats={self.stats})"
        if lazy:  # two columns of the store, not every system (print of a large store)
            converged = int(self._store.column("converged").sum())
            steps = int(self._store.column("total_steps").sum(dtype="int64"))
        else:
            converged, steps = int(self.converged.sum()), int(self.steps.sum())
        return (
            f"Results(systems={len(self)}{self._elsewhere()}, converged={converged}, steps={steps})"
        )

    def _elsewhere(self) -> str:
        """Where the run's other systems are, when an in-memory sink filled up and these
        results hold only its share (so a short count does not read as a loss)."""
        total = self.stats.get("systems")
        if not self.sinks or total is None or int(total) <= len(self):
            return ""
        stores = [str(s.path) for s in self.sinks if hasattr(s, "path")]
        where = f" in {', '.join(stores)}" if stores else ""
        return f" of {int(total)}; the other {int(total) - len(self)} went to later sinks{where}"
