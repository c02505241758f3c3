"""Reading the rows of a results store (layout: :mod:`.results_store`): the arrays a
system is stored in, the rows a run wrote, and :class:`StoreRows`, the lazy view a
:class:`~alchemi_lit.io.results.Results` read from a store holds."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..core.errors import ConfigError
from ..core.info_codec import info_from_json
from ..core.state import MODEL_ERROR_KEY, Batch
from .store_constraints import drop_if_unconstrained, stored_columns

ATOM_COLUMNS = ("positions", "forces", "velocities", "masses", "atomic_numbers", "tags", "fixed")
SYSTEM_COLUMNS = (
    "system_id",
    "energy",
    "stress",
    "cell",
    "pbc",
    "n_atoms",
    "status",
    "total_steps",
    "converged",
    "exit_code",
    "stage_steps",
    "stage_exit",
    "stage_energy",
    "stage_volume",
    "stage_pressure",
    "nan_flags",
    "spacegroup_initial",
    "spacegroup_final",
)
#: a Monte Carlo stage's chain statistics (:mod:`alchemi_lit.integrators.mc_ops`): system
#: columns a store holds only where the run had them
MC_COLUMNS = (
    "mc_attempts", "mc_accepted", "mc_energy_sum", "mc_energy_sq_sum", "mc_species",
    "mc_pair_attempts", "mc_pair_accepted", "mc_species_attempts", "mc_species_accepted",
    "mc_count_sum",
)  # fmt: skip
#: a replica exchange's fields (:mod:`alchemi_lit.integrators.exchange`): system columns a
#: store holds only where the run had them
REPLICA_COLUMNS = (
    "rex_group", "rex_rung", "rex_temperature", "rex_round_trips", "rex_end", "rex_attempts",
    "rex_accepts",
)  # fmt: skip
#: the chain and copy of a row of ``SwapMC`` / ``SemiGrandMC(proposals=k)``
#: (:mod:`alchemi_lit.integrators.proposals`), where the run had them
CHAIN_COLUMNS = ("mc_chain", "mc_copy")
SCHEMA = "alchemi_lit.io.results/1"


class StoreRows:
    """The committed rows of a store (or of one of its runs) that a lazy
    :class:`~alchemi_lit.io.results.Results` reads: their count from the commit
    marker, their systems a chunk at a time, or all at once.  The rows are fixed when
    this is made: systems a later run appends are not among them."""

    def __init__(self, path: str | Path, run: int | None = None) -> None:
        self.path, self.run = Path(path), run
        self.group = open_store(path)
        n_sys = int(self.group.attrs.get("n_systems", 0))
        self.rows = _run_rows(self.group, run, n_sys, path) if run is not None else (0, n_sys)

    def __len__(self) -> int:
        return max(0, self.rows[1] - self.rows[0])

    def refuse_repeated_ids(self) -> None:
        """A clear error for rows that hold a ``system_id`` twice (runs that appended to
        the store numbered their systems alike): read them one run at a time."""
        lo, hi = self.rows
        if hi <= lo:
            return
        ids = np.asarray(self.group["systems/system_id"][lo:hi])
        if len(np.unique(ids)) != len(ids):
            raise ConfigError(
                f"results store {str(self.path)!r} holds some system_id(s) more than once "
                f"(runs that appended to it numbered their systems alike); read one run at a "
                f"time with read_results(path, run=k) / ZarrSink(path).read(run=k)"
            )

    def column(self, name: str) -> np.ndarray:
        """One per-system array of the rows (``systems/NAME``), nothing else read."""
        return np.asarray(self.group[f"systems/{name}"][self.rows[0] : self.rows[1]])

    def stage_columns(self) -> int:
        """Width of the stage history (0 without one)."""
        key = "systems/stage_steps"
        return int(self.group[key].shape[1]) if key in self.group else 0

    def batches(self, chunk_systems: int = 4096) -> Iterator[Batch]:
        """The rows as Batches of at most ``chunk_systems`` systems, in row order."""
        return iter_store_batches(self.path, chunk_systems, rows=self.rows)

    def read_batch(self) -> Batch | None:
        """Every row as one Batch in ``system_id`` order (None without rows)."""
        if not len(self):
            return None
        self.refuse_repeated_ids()
        batch = read_rows(self.group, *self.rows)
        return batch.select(torch.argsort(batch.system_id, stable=True))


def read_rows(group: Any, lo: int, hi: int) -> Batch:
    """Committed system rows ``[lo, hi)`` of an open store as one Batch, in row order
    (the atoms of those systems only: the span their offsets cover)."""
    n_atoms = int(group.attrs.get("n_atoms", 0))
    ids = np.asarray(group["systems/system_id"][lo:hi])
    system = {
        k: torch.from_numpy(np.asarray(group[f"systems/{k}"][lo:hi]))
        for k in (*SYSTEM_COLUMNS, *MC_COLUMNS, *REPLICA_COLUMNS, *CHAIN_COLUMNS)
        if f"systems/{k}" in group
    }
    constraints = stored_columns(group)  # (a store that held a constrained system)
    for k in (k for k, kind in constraints.items() if kind == "system"):
        system[k] = torch.from_numpy(np.asarray(group[f"systems/{k}"][lo:hi]))
    atom_columns = (*ATOM_COLUMNS, *(k for k, kind in constraints.items() if kind == "atom"))
    offsets = np.asarray(group["systems/atom_offset"][lo:hi])
    counts = system["n_atoms"].numpy()
    # systems are stored in write order; gather their atoms (from the span they cover)
    first, end = int(offsets.min()), min(int((offsets + counts).max()), n_atoms)
    atom = {k: torch.from_numpy(np.asarray(group[f"atoms/{k}"][first:end])) for k in atom_columns}
    packed = np.concatenate([[0], np.cumsum(counts)[:-1]])
    if end - first != int(counts.sum()) or not np.array_equal(offsets - first, packed):
        index = np.concatenate([np.arange(o, o + c) for o, c in zip(offsets - first, counts)])
        atom = {k: v[torch.as_tensor(index, dtype=torch.long)] for k, v in atom.items()}
    drop_if_unconstrained(atom, system)  # (fields only where a system is constrained)
    atom["system_idx"] = torch.repeat_interleave(torch.arange(hi - lo), system["n_atoms"])
    info: dict[int, dict[str, Any]] = {}
    if "systems/info" in group:  # stores written before info was kept have none
        texts = np.asarray(group["systems/info"][lo:hi]).tolist()
        for sid, text in zip(ids.tolist(), texts):
            if text:
                info[int(sid)] = info_from_json(str(text))
    errors = dict(group.attrs.get("errors", {}))
    if errors:  # (the per-row info holds the error text too, where kept)
        for sid in ids.tolist():
            if str(sid) in errors:
                info.setdefault(int(sid), {}).setdefault(MODEL_ERROR_KEY, errors[str(sid)])
    return Batch(atom, system, info)


def iter_store_batches(
    path: str | Path, chunk_systems: int = 4096, rows: tuple[int, int] | None = None
) -> Iterator[Batch]:
    """The committed systems of a store, ``chunk_systems`` at a time, in row order (not
    sorted by ``system_id``): memory bounded by one chunk whatever the store's size.
    ``rows``: only rows ``[first, end)``."""
    if int(chunk_systems) < 1:
        raise ConfigError(f"chunk_systems must be >= 1, got {chunk_systems!r}")
    group = open_store(path)
    n_sys = int(group.attrs.get("n_systems", 0))
    lo, hi = (0, n_sys) if rows is None else (max(0, rows[0]), min(rows[1], n_sys))
    for start in range(lo, hi, int(chunk_systems)):
        yield read_rows(group, start, min(start + int(chunk_systems), hi))


def store_size(path: str | Path) -> int:
    """How many systems a store has committed (read from its commit marker only)."""
    return int(open_store(path).attrs.get("n_systems", 0))


def open_store(path: str | Path) -> Any:
    """The zarr group of an existing store, read-only (a missing one is named)."""
    import zarr

    p = Path(path)
    if not p.exists():
        raise ConfigError(f"results store {str(p)!r} does not exist")
    return zarr.open_group(str(p), mode="r")


def _run_rows(group: Any, run: int, n_sys: int, path: str | Path) -> tuple[int, int]:
    """Rows ``[first, end)`` the ``run``-th run wrote (from the ``runs`` attribute)."""
    starts = [r.get("first_row") for r in group.attrs.get("runs", [])]
    if not -len(starts) <= run < len(starts):
        raise ConfigError(
            f"results store {str(path)!r} was written by {len(starts)} run(s); run={run} "
            f"does not exist (0 is the first, -1 the last)"
        )
    k = run % len(starts)
    ends = [*starts[1:], n_sys]
    if starts[k] is None or ends[k] is None:
        raise ConfigError(
            f"results store {str(path)!r} does not record where run {run} starts (written "
            f"by an older version); read it whole with run=None"
        )
    return int(starts[k]), min(int(ends[k]), n_sys)
