"""One streamed pass over a dataset for what a sampler needs of each structure.

:class:`~alchemi_lit.data.SizeAwareSampler` plans batches from per-structure numbers --
atom counts, system ids, the bands structures belong to -- and reads a structure's
atoms only when a take hands it to the run.  :func:`scan` reads the dataset once, a
chunk at a time, and keeps those numbers (arrays of 8 bytes a structure), so a
sampler over a million-frame file holds megabytes, not the gigabytes of its Atoms.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..core.batched_validation import validate_structures
from ..core.errors import ConfigError, StructureError
from ..core.structure_hash import StructureHashes
from .bands import path_of, runs_of_paths
from .datasets import Subset, parse_shard, shard_range
from .replicas import group_of, group_runs

#: structures read together in a streamed pass (few enough that a lazily read dataset
#: is never all in memory)
SCAN_CHUNK = 4096


@dataclasses.dataclass
class Scanned:
    """Per-structure facts of a dataset: ``sizes`` (atoms), ``ids`` (the system ids the
    structures carry in ``info["system_id"]`` when all carry distinct integers, else
    None), ``bands`` (``(path_id, start, stop)`` runs of consecutive band images) and
    ``elements`` (the atomic numbers that occur, for a model's element check), the
    structures that failed validation (``(index, message)``, checked in the same pass)
    and the content ``hashes`` in dataset order (the run's input digest)."""

    sizes: np.ndarray
    ids: np.ndarray | None
    bands: list[tuple[int, int, int]]
    elements: set[int]
    bad: list[tuple[int, str]]
    hashes: StructureHashes
    #: replica groups as ``(group, start, stop)`` runs (:mod:`.replicas`)
    groups: list[tuple[int, int, int]] = dataclasses.field(default_factory=list)
    #: class names of the ASE constraints that occur (a pipeline's wire schema needs them)
    constraints: set[str] = dataclasses.field(default_factory=set)


def scan(dataset: Sequence[Any], owner: str) -> Scanned:
    """Read every structure of ``dataset`` once, ``SCAN_CHUNK`` at a time, keeping only
    its :class:`Scanned` facts (validation failures are kept, not raised: the sampler
    reports them when it is bound); an item that is not an ``ase.Atoms`` is an error
    naming its index."""
    from ase import Atoms

    n = len(dataset)
    sizes = np.empty(n, dtype=np.int64)
    ids = np.empty(n, dtype=np.int64)
    carried = True  # every structure so far carries an integral info["system_id"]
    paths: list[tuple[int, int | None]] = []
    groups: list[tuple[int, int | None]] = []
    elements: set[int] = set()
    constraints: set[str] = set()
    bad: list[tuple[int, str]] = []
    hashes = StructureHashes()
    for start in range(0, n, SCAN_CHUNK):
        chunk = [dataset[k] for k in range(start, min(start + SCAN_CHUNK, n))]
        for k, atoms in enumerate(chunk, start):
            if not isinstance(atoms, Atoms):
                raise StructureError(
                    f"{owner}: structure {k} is of type {type(atoms).__name__}, not ase.Atoms; "
                    f"read structure files with alchemi_lit.data.read_structures (or pass the "
                    f"path)",
                    k,
                )
            sizes[k] = len(atoms)
            elements.update(np.unique(atoms.numbers).tolist())
            constraints.update(type(c).__name__ for c in atoms.constraints)
            sid = atoms.info.get("system_id")
            if carried and isinstance(sid, numbers.Integral) and not isinstance(sid, bool):
                ids[k] = int(sid)
            else:
                carried = False
            p = path_of(atoms)
            if p is not None:
                paths.append((k, p))
            g = group_of(atoms)
            if g is not None:
                groups.append((k, g))
            hashes.add(atoms)
        validate_structures(chunk, [None] * len(chunk), first_index=start, errors=bad)
    unique = carried and n > 0 and len(np.unique(ids)) == n
    return Scanned(
        sizes, ids if unique else None, runs_of_paths(paths), elements, bad, hashes,
        group_runs(groups), constraints,
    )  # fmt: skip


def sharded(
    dataset: Sequence[Any], shard: str | tuple[int, int], system_ids: Sequence[int] | None
) -> tuple[Sequence[Any], int, Sequence[int] | None, tuple[int, int]]:
    """Shard ``shard`` (``"i/n"`` or ``(i, n)``) of ``dataset``: its structures (a
    :class:`~alchemi_lit.data.datasets.Subset`, nothing read), the global position of
    its first (so default ids stay global), its slice of ``system_ids`` and ``(i, n)``.  A shard
    boundary inside a band is an error: a band runs whole, in one shard."""
    from .datasets import check_shard

    if isinstance(shard, str):
        index, count = parse_shard(shard)
    else:
        if not isinstance(shard, (tuple, list)) or len(shard) != 2:
            raise ConfigError(f"shard must be 'i/n' or (i, n), got {shard!r}")
        index, count = shard
        check_shard(index, count)
    rows = shard_range(len(dataset), index, count)
    if len(rows) == 0:
        raise ConfigError(
            f"shard {index}/{count} holds no structure: the dataset has {len(dataset)}, "
            f"fewer than {count} shards; use at most {len(dataset)} shards"
        )
    for edge in (rows.start, rows.stop):
        if 0 < edge < len(dataset):
            before, after = path_of(dataset[edge - 1]), path_of(dataset[edge])
            if before is not None and before == after:
                raise ConfigError(
                    f"shard {index}/{count} starts or ends inside band path_id {before} "
                    f"(structures {edge - 1} and {edge}); a band runs in one shard: choose "
                    f"a shard count that does not split it, or run the bands unsharded"
                )
    if system_ids is not None:
        system_ids = list(system_ids)
        if len(system_ids) != len(dataset):
            raise ConfigError(
                f"system_ids must be one per structure of the whole dataset ({len(dataset)}) "
                f"when sharding, got {len(system_ids)}"
            )
        system_ids = system_ids[rows.start : rows.stop]
    return Subset(dataset, rows), rows.start, system_ids, (int(index), int(count))
