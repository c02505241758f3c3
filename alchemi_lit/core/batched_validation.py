"""Checks of many input structures at once, with the messages of the one-structure checks.

A workflow validates hundreds of few-atom cells (strained or displaced copies) and a
dataset is validated a chunk of thousands at a time.  :func:`~.validation.validate_atoms`
checks one structure with a dozen small numpy calls, so per structure that fixed cost,
not the arithmetic, was the price (most of the host time of an EMT elastic run).  Here
the cheap checks (finite coordinates, momenta and cell, atomic numbers, positive
masses, cell thickness, constraints) run once over every structure's arrays together, and the
closest pairs of small periodic cells are searched together; only a structure these
flag is checked again alone by ``validate_atoms``, which raises the message naming it.
So messages, warnings and their order are those of checking one structure after the
other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .errors import StructureError
from .geometry import (
    SMALL_CELL_CANDIDATES,
    all_pairs_candidates,
    closest_pairs_of_small_cells,
    image_reach,
    periodic_heights,
)
from .validation import (
    MIN_CELL_HEIGHT,
    NOT_SEARCHED,
    check_distances,
    distance_cutoff,
    is_element,
    system_name,
    validate_atoms,
)


def validate_structures(
    structures: Sequence[Any],
    system_ids: Sequence[int | None],
    min_distance: float = 0.5,
    first_index: int = 0,
    errors: list[tuple[int, str]] | None = None,
) -> None:
    """:func:`~.validation.validate_atoms` of every structure, in order.  The first
    failing structure raises, or with ``errors`` each failure is appended as (index,
    message) and the others are checked.  ``first_index``: the index of
    ``structures[0]`` in the messages."""
    facts = _Facts(structures)
    found = _small_cells_closest_pairs(facts, min_distance)
    for k, (atoms, sid) in enumerate(zip(structures, system_ids)):
        index, closest = first_index + k, found.get(k, NOT_SEARCHED)
        try:
            if facts.suspect[k]:  # validate_atoms finds what and says it
                validate_atoms(atoms, index, min_distance, sid, closest=closest)
            else:
                check_distances(
                    facts.positions(k), facts.cells[k], facts.pbc[k], facts.heights[k],
                    min_distance, system_name(index, sid), index, sid, closest,
                )  # fmt: skip
        except StructureError as exc:
            if errors is None:
                raise
            errors.append((index, str(exc)))


class _Facts:
    """Every structure's arrays side by side and, per structure, whether anything but
    the distances could fail (``suspect``) and its periodic heights."""

    def __init__(self, structures: Sequence[Any]) -> None:
        from ase.data import atomic_masses

        n = len(structures)
        self.counts = np.fromiter((len(a) for a in structures), np.int64, n)
        self.ends = np.cumsum(self.counts)
        arrays = [a.arrays for a in structures]
        self.pos = _joined([x["positions"] for x in arrays], (0, 3))
        self.cells = np.asarray([a.cell.array for a in structures], np.float64).reshape(n, 3, 3)
        self.pbc = np.asarray([a.pbc for a in structures], bool).reshape(n, 3)
        numbers = _joined([x["numbers"] for x in arrays], (0,)).astype(np.int64)
        element = is_element(numbers)
        masses = atomic_masses[np.where(element, numbers, 0)]
        momenta = np.zeros_like(self.pos)
        for k, x in enumerate(arrays):  # (explicit masses and momenta are the rarer case)
            lo, hi = self.ends[k] - self.counts[k], self.ends[k]
            if "masses" in x:
                masses[lo:hi] = x["masses"]
            if "momenta" in x:
                momenta[lo:hi] = x["momenta"]
        finite = np.isfinite(self.pos).all(1)
        atom_ok = (
            element & finite & np.isfinite(momenta).all(1) & np.isfinite(masses) & (masses > 0)
        )
        cell_ok = np.isfinite(self.cells).all((1, 2))
        self.heights, self.closed_heights, self.closed = _heights(self.cells, self.pbc, cell_ok)
        thick = np.array([h.size == 0 or h.min() >= MIN_CELL_HEIGHT for h in self.heights])
        constrained = np.fromiter((bool(a.constraints) for a in structures), bool, n)
        owner = np.repeat(np.arange(n), self.counts)
        self.finite_positions = np.bincount(owner[~finite], minlength=n) == 0
        atoms_bad = np.bincount(owner[~atom_ok], minlength=n) > 0
        self.suspect = atoms_bad | (self.counts == 0) | ~cell_ok | ~thick | constrained

    def positions(self, k: int) -> np.ndarray:
        return self.pos[self.ends[k] - self.counts[k] : self.ends[k]]


def _joined(parts: list[np.ndarray], empty: tuple[int, ...]) -> np.ndarray:
    return np.concatenate(parts).astype(np.float64) if parts else np.zeros(empty)


def _heights(
    cells: np.ndarray, pbc: np.ndarray, cell_ok: np.ndarray
) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """:func:`~.geometry.periodic_heights` of every cell: the fully periodic ones at
    once by its closed form (the same operations in the same order, so the same
    floats), the others (and degenerate cells) one by one.  Also the closed form's
    ``[S, 3]`` and where it holds."""
    a, b, c = cells[:, 0], cells[:, 1], cells[:, 2]
    faces3 = np.stack([_cross(b, c), _cross(c, a), _cross(a, b)], 1)  # [S, 3 faces, 3]
    faces = np.sqrt(faces3[..., 0] * faces3[..., 0] + faces3[..., 1] * faces3[..., 1]
                    + faces3[..., 2] * faces3[..., 2])  # fmt: skip
    bc = faces3[:, 0]
    volume = np.abs(a[:, 0] * bc[:, 0] + a[:, 1] * bc[:, 1] + a[:, 2] * bc[:, 2])
    with np.errstate(invalid="ignore", divide="ignore"):
        closed = volume[:, None] / faces
        usable = pbc.all(1) & cell_ok & (faces.min(1) > 1e-12 * faces.max(1))
    out = []
    for k, ok in enumerate(usable.tolist()):
        if ok:
            out.append(closed[k])
        elif cell_ok[k]:
            out.append(periodic_heights(cells[k], pbc[k]))
        else:  # (validate_atoms names the non-finite cell)
            out.append(np.zeros(0))
    return out, closed, usable


def _cross(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Row-wise ``u x v`` in :func:`~.geometry.periodic_heights`' operation order."""
    return np.stack([u[:, 1] * v[:, 2] - u[:, 2] * v[:, 1], u[:, 2] * v[:, 0] - u[:, 0] * v[:, 2],
                     u[:, 0] * v[:, 1] - u[:, 1] * v[:, 0]], 1)  # fmt: skip


def _small_cells_closest_pairs(facts: _Facts, min_distance: float) -> dict[int, Any]:
    """The closest pair of every fully periodic, finite, small cell, searched in groups
    of equal shape (atoms, images, radius); structures left out search alone later."""
    thinnest = np.where(facts.closed, facts.closed_heights.min(1), 0.0)
    ok = facts.closed & facts.finite_positions & (facts.counts > 0)
    ok &= thinnest >= MIN_CELL_HEIGHT
    cutoff = distance_cutoff(thinnest, min_distance)[0]
    reach = image_reach(np.where(ok[:, None], facts.closed_heights, 1.0), cutoff)
    ok &= all_pairs_candidates(facts.counts, reach) <= SMALL_CELL_CANDIDATES
    groups: dict[tuple[Any, ...], list[int]] = {}
    for k in np.flatnonzero(ok).tolist():
        key = (int(facts.counts[k]), tuple(reach[k].tolist()), float(cutoff[k]))
        groups.setdefault(key, []).append(k)
    found: dict[int, Any] = {}
    for (_, reach_k, cutoff_k), members in groups.items():
        positions = np.stack([facts.positions(k) for k in members])
        pairs = closest_pairs_of_small_cells(positions, facts.cells[members], reach_k, cutoff_k)
        found.update(zip(members, pairs))
    return found


__all__ = ["validate_structures"]
