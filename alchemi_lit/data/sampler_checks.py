"""The checks of :class:`~alchemi_lit.data.SizeAwareSampler`: its arguments, and the one
streamed pass that validates every structure (and counts its edges) before a run."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from loguru import logger

from ..core.batched_validation import validate_structures
from ..core.errors import ConfigError, StructureError
from ..core.geometry import count_pairs
from .scan import SCAN_CHUNK

#: structures validated together (their small cells' closest pairs in one search each),
#: few enough that a lazily read dataset is never all in memory
VALIDATION_CHUNK = SCAN_CHUNK


def check_arguments(
    dataset: Any, max_atoms: Any, max_systems: Any, max_edges: Any, memory_fraction: float
) -> None:
    """The dataset is a non-empty sequence, the budgets numbers >= 1 (``max_atoms`` or
    ``"auto"``), the fraction in (0, 1]."""
    if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
        raise ConfigError(
            f"SizeAwareSampler: the dataset must be indexable (len() and [k]) or a path, "
            f"got a {type(dataset).__name__}; wrap it in list(...)"
        )
    if len(dataset) == 0:
        raise ConfigError("SizeAwareSampler: the dataset is empty")
    if isinstance(max_atoms, str) and max_atoms != "auto":
        raise ConfigError(
            f"SizeAwareSampler: max_atoms must be a number >= 1 or 'auto', got {max_atoms!r}"
        )
    if not isinstance(max_atoms, str) and int(max_atoms) < 1:
        raise ConfigError(f"SizeAwareSampler: max_atoms must be >= 1, got {max_atoms}")
    if not 0.0 < float(memory_fraction) <= 1.0:
        raise ConfigError(
            f"SizeAwareSampler: memory_fraction must be in (0, 1], got {memory_fraction}: "
            f"the share of the free memory a full batch may take (0.8: 80 %)"
        )
    if max_systems is not None and int(max_systems) < 1:
        raise ConfigError(f"SizeAwareSampler: max_systems must be >= 1, got {max_systems}")
    if max_edges is not None and int(max_edges) < 1:
        raise ConfigError(f"SizeAwareSampler: max_edges must be >= 1, got {max_edges}")


def validation_pass(
    dataset: Sequence[Any], cutoff: float | None
) -> tuple[list[tuple[int, str]], np.ndarray | None]:
    """Validate every structure, ``VALIDATION_CHUNK`` at a time, and with a ``cutoff``
    count each one's neighbour pairs in the same pass.  Returns the failures as
    ``(index, message)`` and the edge counts (None without a cutoff)."""
    bad: list[tuple[int, str]] = []
    edges = np.zeros(len(dataset), dtype=np.int64) if cutoff is not None else None
    for start in range(0, len(dataset), VALIDATION_CHUNK):
        stop = min(start + VALIDATION_CHUNK, len(dataset))
        chunk = [dataset[k] for k in range(start, stop)]
        validate_structures(chunk, [None] * len(chunk), first_index=start, errors=bad)
        if edges is not None:
            edges[start:stop] = [count_edges(a, float(cutoff)) for a in chunk]
    return bad, edges


def count_all_edges(dataset: Sequence[Any], cutoff: float) -> np.ndarray:
    """Every structure's neighbour pairs at ``cutoff``, in one streamed pass."""
    edges = np.zeros(len(dataset), dtype=np.int64)
    for start in range(0, len(dataset), VALIDATION_CHUNK):
        stop = min(start + VALIDATION_CHUNK, len(dataset))
        edges[start:stop] = [count_edges(dataset[k], cutoff) for k in range(start, stop)]
    return edges


def count_edges(atoms: Any, cutoff: float) -> int:
    """Neighbour pairs of one ``ase.Atoms`` within ``cutoff``."""
    return count_pairs(atoms.positions, atoms.cell.array, atoms.pbc, cutoff)


def check_bands_fit(sampler: Any) -> None:
    """A band runs in one batch: refuse one larger than the sampler's budget (before the
    run), naming the band and the budget to raise."""
    queued = set(sampler.order.tolist())
    for p, start, stop in sampler.bands:
        if start not in queued:  # skipped (skip_invalid)
            continue
        atoms, count = int(sampler.sizes[start:stop].sum()), stop - start
        edges = int(sampler.edges[start:stop].sum()) if sampler.edges is not None else 0
        measured = None if sampler.max_atoms == "auto" else sampler.max_atoms
        for what, need, limit in (
            ("max_atoms", atoms, measured),
            ("max_systems", count, sampler.max_systems),
            ("max_edges", edges, sampler.max_edges if sampler.edges is not None else None),
        ):
            if limit is not None and need > int(limit):
                raise StructureError(
                    f"band path_id {p} (structures {start}-{stop - 1}) needs {what}={need} "
                    f"in one batch, more than {what}={limit}; a band is never split: "
                    f"raise {what} to at least {need} or use fewer images",
                    start,
                )


def skip_rows(sampler: Any, rows: list[tuple[int, str]]) -> None:
    """Leave dataset rows out of ``sampler`` (``skip_invalid``) with a warning naming
    each and why; the run's summary lists them (its ``skipped``)."""
    if not rows:
        return
    for k, why in rows:
        sampler.skipped.append({"index": k, "system_id": int(sampler.system_ids[k]), "reason": why})
    listing = "; ".join(f"system {k} (system_id {sampler.system_ids[k]}): {why}" for k, why in rows)
    logger.warning(f"skipping {len(rows)} invalid structure(s) (skip_invalid=True): {listing}")
    skip = {k for k, _ in rows}
    for p, start, stop in sampler.bands:  # a band with a skipped image goes whole
        mates = [k for k in range(start, stop) if k not in skip]
        if len(mates) < stop - start:
            for k in mates:
                sampler.skipped.append(
                    {
                        "index": k,
                        "system_id": int(sampler.system_ids[k]),
                        "reason": f"in band path_id {p} with a skipped image",
                    }
                )
            skip.update(mates)
    sampler.order = np.asarray([k for k in sampler.order if k not in skip], dtype=np.int64)
