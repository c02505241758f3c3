"""Bands of a dataset: consecutive structures sharing ``info["path_id"]``, checked as one.

A nudged elastic band is a path of images, each an ``ase.Atoms`` of the dataset; the
images of one band share ``atoms.info["path_id"]`` and follow each other in image order
(endpoints first and last).  Everything that feeds or builds batches keeps a band
whole -- the sampler takes it as one unit -- and everything is checked here before any
model call, so a bad band is an error naming the band and the fix, not a crash mid-run.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ..core.errors import StructureError

#: the ``atoms.info`` key naming a structure's band
PATH_KEY = "path_id"


def path_of(atoms: Any) -> int | None:
    """The band an ``ase.Atoms`` belongs to (``info["path_id"]``), None outside a band."""
    value = atoms.info.get(PATH_KEY)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise StructureError(
            f"info['path_id'] must be an integer naming the structure's band, got {value!r}; "
            f"build bands with alchemi_lit.workflows.make_band"
        )
    return int(value)


def band_runs(items: Sequence[Any]) -> list[tuple[int, int, int]]:
    """``(path_id, start, stop)`` of each band of ``items`` (dataset positions ``start:stop``),
    in order; a ``path_id`` seen again after another structure is an error."""
    return runs_of_paths((k, path_of(atoms)) for k, atoms in enumerate(items))


def runs_of_paths(paths: Iterable[tuple[int, int | None]]) -> list[tuple[int, int, int]]:
    """:func:`band_runs` from ``(position, path_id)`` pairs in ascending position (a
    streamed pass keeps these, not the structures)."""
    runs: list[tuple[int, int, int]] = []
    for k, p in paths:
        if p is None:
            continue
        if runs and runs[-1][0] == p and runs[-1][2] == k:
            runs[-1] = (p, runs[-1][1], k + 1)
            continue
        earlier = [r for r in runs if r[0] == p]
        if earlier:
            raise StructureError(
                f"band path_id {p}: its images are not contiguous (structures "
                f"{earlier[0][1]}-{earlier[0][2] - 1} and again from {k}); put the images of a "
                f"band one after another in image order, or give the second band another path_id",
                k,
            )
        runs.append((p, k, k + 1))
    return runs


def check_band(images: Sequence[Any], path_id: int, start: int = 0) -> None:
    """Refuse a band NEB cannot run: fewer than 3 images, or images whose atom counts,
    species order, boundary conditions or periodic cell vectors differ (ASE's checks)."""
    where = f"band path_id {path_id} (structures {start}-{start + len(images) - 1})"
    if len(images) < 3:
        raise StructureError(
            f"{where} has {len(images)} image(s); a band needs the two endpoints and at least "
            f"one image between them (make_band(initial, final, n_images=...))",
            start,
        )
    first = images[0]
    for i, img in enumerate(images[1:], 1):
        what = None
        if len(img) != len(first):
            what = f"{len(img)} atoms where image 0 has {len(first)}"
        elif not np.array_equal(img.numbers, first.numbers):
            what = "its atoms in another species order than image 0"
        elif not np.array_equal(img.pbc, first.pbc):
            what = f"pbc {img.pbc.tolist()} where image 0 has {first.pbc.tolist()}"
        elif any(
            p and np.abs(a - b).max() > 1e-8 for p, a, b in zip(first.pbc, img.cell, first.cell)
        ):
            what = "another periodic cell than image 0 (NEB keeps the cell fixed)"
        if what is not None:
            raise StructureError(
                f"{where}: image {i} has {what}; every image of a band must be the same atoms "
                f"in the same order and cell (build it with make_band from matching endpoints)",
                start + i,
            )


def check_bands(items: Sequence[Any]) -> list[tuple[int, int, int]]:
    """Check every band of ``items`` (:func:`band_runs`, :func:`check_band`); returns the runs."""
    runs = band_runs(items)
    for p, start, stop in runs:
        check_band(items[start:stop], p, start)
    return runs
