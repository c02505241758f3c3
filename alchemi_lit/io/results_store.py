"""The results store a ZarrSink writes: its layout, and reading it back.

Layout (zarr v3, one store for all systems; ragged per-atom data kept flat)::

    atoms/{positions, forces, velocities, masses, atomic_numbers, tags, fixed}   [A, ...]
    systems/{system_id, energy, stress, cell, pbc, n_atoms, atom_offset, status,
             total_steps, converged, exit_code, stage_steps, stage_exit, stage_energy,
             stage_volume, stage_pressure, nan_flags, spacegroup_initial,
             spacegroup_final, and a Monte Carlo run's mc_* statistics
             (store_reader.MC_COLUMNS), a replica exchange's rex_* fields
             (store_reader.REPLICA_COLUMNS)}                                    [S, ...]
    systems/info   [S] strings: each system's info as JSON (input ase.Atoms.info,
                   error texts; "" when none -- see alchemi_lit.core.info_codec)
    atoms/, systems/ {every field of core.constraint_io.stored_fields(): the
                   constraint kinds', constraint_flags, constraint_dof, FixSymmetry's
                   symmetry_*}: only once a constrained system was written (zero:
                   none; see .store_constraints)
    attrs: n_systems, n_atoms (the commit marker), schema,
           runs (one entry per run that wrote here: plan, stage_names, model, config,
                 versions, first_row -- its first system row -- and, once it finished,
                 stats: wall_time_s, systems, steps, forward_calls, started, ended),
           errors (system_id -> why it was quarantined)

Rows beyond ``attrs["n_systems"]`` / ``attrs["n_atoms"]`` are uncommitted (a write
interrupted mid-way); readers ignore them and the next write overwrites them, so a
store stays valid whatever happens to the process.  Writing is
:class:`~alchemi_lit.sinks.ZarrSink`'s job; this module only reads (the row readers
are in :mod:`.store_reader`, which :mod:`.results` uses without this module).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .store_reader import ATOM_COLUMNS as ATOM_COLUMNS  # (public here, with the layout)
from .store_reader import SCHEMA as SCHEMA
from .store_reader import SYSTEM_COLUMNS as SYSTEM_COLUMNS
from .store_reader import StoreRows, open_store
from .store_reader import iter_store_batches as iter_store_batches
from .store_reader import read_rows as read_rows

if TYPE_CHECKING:
    from ..core.state import Batch
    from .results import Results


def read_results(path: str | Path, run: int | None = None) -> Results:
    """The committed systems of a results store as :class:`~alchemi_lit.io.results.Results`
    (``system_id`` order; empty when nothing is committed yet), read lazily: ``len``,
    :meth:`~alchemi_lit.io.results.Results.to_pandas` (``columns=``) and
    :meth:`~alchemi_lit.io.results.Results.iter_atoms` go through the store a chunk at a
    time, so a store of millions of systems is never loaded whole unless ``.batch`` or
    ``to_atoms()`` asks for it.

    ``run``: only the systems the ``run``-th run that wrote the store added (0 = the
    first; negative counts from the last).  ``stats`` are the statistics that run
    recorded (those of the only run, when ``run`` is None and one run wrote the store).
    """
    from .results import Results

    rows = StoreRows(path, run)
    rows.refuse_repeated_ids()
    runs = list(rows.group.attrs.get("runs", []))
    chosen = runs[run] if run is not None else (runs[0] if len(runs) == 1 else None)
    stats = dict(chosen.get("stats") or {}) if chosen else {}
    width = rows.stage_columns() if len(rows) else 0
    candidates = [chosen] if chosen else runs
    names = merged_stage_names(
        r["stage_names"]
        for r in candidates
        if isinstance(r.get("stage_names"), list) and len(r["stage_names"]) == width
    )
    return Results(None, stats, stage_names=names, store=rows)


def merged_stage_names(per_run: Iterable[Sequence[Any]]) -> list[str] | None:
    """Labels of the stage-history columns of rows several runs wrote (each run's labels,
    all of one width): a column every run names alike keeps its name; one they name
    differently lists their names in run order, joined by ``|`` (``"0:FIRE|0:Langevin"``:
    its rows left either stage).  None when no run names the columns."""
    known = [[str(n) for n in names] for names in per_run]
    if not known:
        return None
    return ["|".join(dict.fromkeys(column)) for column in zip(*known)]


def read_store_batch(path: str | Path, run: int | None = None) -> Batch | None:
    """The committed systems of a results store as one Batch (``system_id`` order), None
    when there are none; ``run`` as in :func:`read_results`."""
    return StoreRows(path, run).read_batch()


def stored_system_ids(path: str | Path) -> np.ndarray:
    """The ``system_id`` of every committed system of a results store, in row order."""
    group = open_store(path)
    n_sys = int(group.attrs.get("n_systems", 0))
    if n_sys == 0 or "systems/system_id" not in group:
        return np.zeros(0, dtype=np.int64)
    return np.asarray(group["systems/system_id"][:n_sys])
