"""Going on after an interruption when there is no checkpoint to resume from.

A run stopped before its first checkpoint (or without a Checkpoint callback) still
left every finished system in its results stores.  Each system's path depends only on
its own keys (seed, system_id, step), so the run goes on by computing the systems the
stores do not hold yet -- after checking that the stores were written by this very run
(:mod:`.fingerprint`) -- and the stores end exactly as an uninterrupted run leaves them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from loguru import logger

from ..core.state import Batch, default_system_ids
from ..io.results_store import read_store_batch, stored_system_ids
from .fingerprint import refuse_mismatch


def checkpoint_to_resume(
    resume: str | os.PathLike[str] | bool | None, checkpoint_folders: Sequence[Path]
) -> str | None:
    """The checkpoint file or folder a resume continues, or None when there is none
    (``resume=True``: the first Checkpoint callback's folder)."""
    if resume in (None, False):
        return None
    if resume is True:
        if not checkpoint_folders:
            return None
        resume = checkpoint_folders[0]
    path = Path(resume)
    found = path.is_file() or (path.is_dir() and any(path.glob("**/*.ckpt")))
    return str(path) if found else None


def continue_from_stores(
    data: Any,
    resume: Any,
    stores: Sequence[Any],
    fingerprint: dict[str, Any] | None,
    salvage: Callable[[], None],
    read_back: bool = True,
) -> tuple[Any, Batch | None]:
    """A resume with no checkpoint: warn, then leave out the systems the results
    ``stores`` (ZarrSinks) already hold, after checking that the run that wrote them was
    this one; ``salvage`` first gathers what ranks left elsewhere.  Returns the data
    still to run (None when nothing is left) and the stored results of the others
    (None without ``read_back``: a run whose Results read the stores needs no copy in
    memory, which for a campaign's store would be all of it)."""
    where = "the Checkpoint callback's folder" if resume is True else repr(str(resume))
    salvage()
    stores = [s for s in stores if s.path.exists()]
    for store in stores:
        refuse_mismatch(store.recorded_fingerprint(), fingerprint, f"{str(store.path)!r}")
    ids = input_system_ids(data)
    done: set[int] = set()
    for store in stores:
        done |= set(np.intersect1d(stored_system_ids(store.path), ids).tolist())
        store.continue_run()
    logger.warning(
        f"no checkpoint to resume from in {where}: starting afresh; "
        f"{len(done)} of {len(ids)} systems are already in the results store(s) and are "
        f"kept, the other {len(ids) - len(done)} are computed"
    )
    if not done:
        return data, None
    return without_systems(data, done), stored_results(stores, done) if read_back else None


def stored_results(stores: Sequence[Any], done: set[int]) -> Batch:
    """The systems ``done`` as the stores hold them, each from the first store that
    has it: a system reaches a later store of the chain when an earlier one failed."""
    parts, taken = [], set()
    for store in stores:
        stored = read_store_batch(store.path)
        ids = stored.system_id.tolist() if stored is not None else []
        rows = [r for r, sid in enumerate(ids) if sid in done and sid not in taken]
        if rows:
            parts.append(stored.select(rows))
            taken.update(ids[r] for r in rows)
    return Batch.concatenate(parts)


def input_system_ids(data: Any) -> list[int] | None:
    """The ``system_id`` each system of a run's input will have (None for what is not
    a run input: :meth:`Simulator.run` reports that)."""
    from ase import Atoms

    from ..data import SizeAwareSampler

    if isinstance(data, Batch):
        return data.system_id.tolist()
    if isinstance(data, SizeAwareSampler):
        return data.system_ids.tolist()
    if isinstance(data, Atoms):
        return default_system_ids([data])
    if isinstance(data, (list, tuple)) and all(isinstance(a, Atoms) for a in data):
        return default_system_ids(data)  # what Batch.from_atoms will give them
    return None


def without_systems(data: Any, ids: set[int]) -> Any:
    """``data`` less the systems whose ``system_id`` is in ``ids`` (None if none is left)."""
    from ase import Atoms

    from ..data import SizeAwareSampler

    if isinstance(data, SizeAwareSampler):
        return data.without(ids) if len(ids) < len(data) else None
    if isinstance(data, Batch):
        keep = [r for r, sid in enumerate(data.system_id.tolist()) if sid not in ids]
        return data.select(keep) if keep else None
    atoms = [data] if isinstance(data, Atoms) else list(data)
    all_ids = default_system_ids(atoms)
    kept = [(a, sid) for a, sid in zip(atoms, all_ids) if sid not in ids]
    if not kept:
        return None
    return Batch.from_atoms([a for a, _ in kept], system_ids=[sid for _, sid in kept])
