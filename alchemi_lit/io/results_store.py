"""The results store a ZarrSink writes: its layout, and reading it back.

Layout (zarr v3, one store for all systems; ragged per-atom data kept flat)::

    atoms/{positions, forces, velocities, masses, atomic_numbers, tags, fixed}   [A, ...]
    systems/{system_id, energy, stress, cell, pbc, n_atoms, atom_offset, status,
             total_steps, converged, exit_code, stage_steps, stage_exit, stage_energy,
             stage_volume, stage_pressure, nan_flags}                           [S, ...]
    systems/info   [S] strings: each system's info as JSON (input ase.Atoms.info,
                   error texts; "" when none -- see alchemi_lit.core.info_codec)
    attrs: n_systems, n_atoms (the commit marker), schema,
           runs (one entry per run that wrote here: plan, stage_names, model, config,
                 versions, first_row -- its first system row -- and, once it finished,
                 stats: wall_time_s, systems, steps, forward_calls, started, ended),
           errors (system_id -> why it was quarantined)

Rows beyond ``attrs["n_systems"]`` / ``attrs["n_atoms"]`` are uncommitted (a write
interrupted mid-way); readers ignore them and the next write overwrites them, so a
store stays valid whatever happens to the process.  Writing is
:class:`~alchemi_lit.sinks.ZarrSink`'s job; this module only reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..core.errors import ConfigError
from ..core.info_codec import info_from_json
from ..core.state import MODEL_ERROR_KEY, Batch

if TYPE_CHECKING:
    from .results import Results

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
)
SCHEMA = "alchemi_lit.io.results/1"


def read_results(path: str | Path, run: int | None = None) -> Results:
    """The committed systems of a results store as :class:`~alchemi_lit.io.results.Results`
    (``system_id`` order; empty when nothing is committed yet).

    ``run``: only the systems the ``run``-th run that wrote the store added (0 = the
    first; negative counts from the last).  ``stats`` are the statistics that run
    recorded (those of the only run, when ``run`` is None and one run wrote the store).
    """
    from .results import Results

    group = open_store(path)
    runs = list(group.attrs.get("runs", []))
    batch = read_store_batch(path, run=run)
    chosen = runs[run] if run is not None else (runs[0] if len(runs) == 1 else None)
    stats = dict(chosen.get("stats") or {}) if chosen else {}
    width = (
        int(batch.stage_steps.shape[1])
        if batch is not None and batch.has_field("stage_steps")
        else 0
    )
    candidates = [chosen] if chosen else runs
    names = merged_stage_names(
        r["stage_names"]
        for r in candidates
        if isinstance(r.get("stage_names"), list) and len(r["stage_names"]) == width
    )
    return Results(batch, stats, stage_names=names)


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
    group = open_store(path)
    n_sys, n_atoms = int(group.attrs.get("n_systems", 0)), int(group.attrs.get("n_atoms", 0))
    lo, hi = _run_rows(group, run, n_sys, path) if run is not None else (0, n_sys)
    if hi <= lo:
        return None
    ids = np.asarray(group["systems/system_id"][lo:hi])
    if len(np.unique(ids)) != len(ids):
        raise ConfigError(
            f"results store {str(path)!r} holds some system_id(s) more than once (runs that "
            f"appended to it numbered their systems alike); read one run at a time with "
            f"read_results(path, run=k) / ZarrSink(path).read(run=k)"
        )
    system = {
        k: torch.from_numpy(np.asarray(group[f"systems/{k}"][lo:hi]))
        for k in SYSTEM_COLUMNS
        if f"systems/{k}" in group
    }
    offsets = np.asarray(group["systems/atom_offset"][lo:hi])
    counts = system["n_atoms"].numpy()
    # systems are stored in write order; gather their atoms (from the span they cover)
    first, end = int(offsets.min()), min(int((offsets + counts).max()), n_atoms)
    atom = {k: torch.from_numpy(np.asarray(group[f"atoms/{k}"][first:end])) for k in ATOM_COLUMNS}
    index = np.concatenate([np.arange(o, o + c) for o, c in zip(offsets - first, counts)])
    atom = {k: v[torch.as_tensor(index, dtype=torch.long)] for k, v in atom.items()}
    atom["system_idx"] = torch.repeat_interleave(torch.arange(hi - lo), system["n_atoms"])
    info: dict[int, dict[str, Any]] = {}
    if "systems/info" in group:  # stores written before info was kept have none
        texts = np.asarray(group["systems/info"][lo:hi]).tolist()
        for sid, text in zip(ids.tolist(), texts):
            if text:
                info[int(sid)] = info_from_json(str(text))
    wanted = set(ids.tolist())  # (the per-row info holds the error text too, where kept)
    for k, v in dict(group.attrs.get("errors", {})).items():
        if int(k) in wanted:
            info.setdefault(int(k), {}).setdefault(MODEL_ERROR_KEY, v)
    batch = Batch(atom, system, info)
    return batch.select(torch.argsort(batch.system_id, stable=True))


def stored_system_ids(path: str | Path) -> np.ndarray:
    """The ``system_id`` of every committed system of a results store, in row order."""
    group = open_store(path)
    n_sys = int(group.attrs.get("n_systems", 0))
    if n_sys == 0 or "systems/system_id" not in group:
        return np.zeros(0, dtype=np.int64)
    return np.asarray(group["systems/system_id"][:n_sys])


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
