"""Geometry of one structure on the host: neighbour pairs and periodic thickness.

Used where a structure is checked or sized before it enters a batch (validation, edge
budgets) as well as by the model's neighbour lists, so it sits below both.  Pairs come
from `vesin <https://github.com/Luthaf/vesin>`_, or, for small non-periodic systems,
from one vectorised all-pairs test that yields vesin's pairs and arithmetic bit for bit.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

#: a non-periodic system of at most this many atoms gets its pairs from one vectorised all-pairs
#: test (:func:`molecule_pairs`): below it a vesin call's fixed cost is most of the search, above it
#: the quadratic test loses (docs/design/04-neighbour-lists-vesin-plus-a-verlet-skin.md)
_ALL_PAIRS_MAX_ATOMS = 48


def all_pairs_suit(num_atoms: int, pbc: Any) -> bool:
    """Whether :func:`molecule_pairs` is the faster search for this system."""
    return num_atoms <= _ALL_PAIRS_MAX_ATOMS and not any(bool(p) for p in pbc)


def molecule_pairs(pos: np.ndarray, radius: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pairs ``i < j`` of a non-periodic system closer than ``radius``, in (i, j) order,
    and their squared distances: vesin's pairs, orientation and arithmetic
    (``(x*x + y*y) + z*z`` of ``r_j - r_i``), so the edges are the same to the bit."""
    iu, ju = _strict_upper_pairs(len(pos))
    d = pos.take(ju, axis=0)
    d -= pos.take(iu, axis=0)
    r2 = d[:, 0] * d[:, 0]
    r2 += d[:, 1] * d[:, 1]
    r2 += d[:, 2] * d[:, 2]
    keep = r2 < radius * radius
    return iu[keep], ju[keep], r2[keep]


@functools.lru_cache(maxsize=_ALL_PAIRS_MAX_ATOMS + 1)
def _strict_upper_pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Pairs i < j of n atoms, row-major (int64)."""
    iu, ju = np.triu_indices(n, 1)
    return iu.astype(np.int64), ju.astype(np.int64)


def count_pairs(positions: Any, cell: Any, pbc: Any, radius: float) -> int:
    """Neighbour pairs (half list) of one system within ``radius`` (edge budgets)."""
    import vesin

    if all_pairs_suit(len(positions), pbc):
        return len(molecule_pairs(np.asarray(positions, dtype=np.float64), radius)[0])
    calc = vesin.NeighborList(cutoff=radius, full_list=False, n_threads=1)
    i = calc.compute(
        np.asarray(positions, dtype=np.float64),
        np.asarray(cell, dtype=np.float64),
        [bool(p) for p in pbc],
        "i",
    )[0]
    return len(i)


#: Atoms closer than this (Å) are one atom given twice: an error whatever ``min_distance``.
COINCIDENT_DISTANCE = 1e-4


def periodic_heights(cell: np.ndarray, pbc: np.ndarray) -> np.ndarray:
    """Thickness of the cell along each periodic direction (Å), in ``pbc`` order.

    How far periodic lattice vector i reaches out of the span of the other periodic
    vectors: the spacing of the lattice planes, 0 where the vectors are dependent.  A
    periodic image of an atom is at least the smallest of these away, and a neighbour
    search needs about cutoff/thickness images.
    """
    vectors = np.asarray(cell, dtype=np.float64)[np.asarray(pbc, dtype=bool)]
    # closed forms (volume over face area, area over edge): validation asks for every
    # structure, and three least-squares solves cost far more
    if len(vectors) == 3:
        a, b, c = vectors.tolist()  # plain floats: np.cross of 3-vectors costs more than this
        bc, ca, ab = _cross(b, c), _cross(c, a), _cross(a, b)
        faces = np.array([math.sqrt(sum(x * x for x in f)) for f in (bc, ca, ab)])
        if faces.min() > 1e-12 * faces.max():
            return abs(sum(x * y for x, y in zip(a, bc))) / faces
    elif len(vectors) == 2:
        edges = np.linalg.norm(vectors, axis=1)
        if edges.min() > 0:
            return np.linalg.norm(np.cross(vectors[0], vectors[1])) / edges[::-1]
    elif len(vectors) == 1:
        return np.linalg.norm(vectors, axis=1)
    heights = np.empty(len(vectors))  # degenerate or no periodic vectors
    for i, v in enumerate(vectors):
        others = np.delete(vectors, i, axis=0).T
        if others.size:
            v = v - others @ np.linalg.lstsq(others, v, rcond=None)[0]
        heights[i] = np.linalg.norm(v)
    return heights


def _cross(u: list[float], v: list[float]) -> tuple[float, float, float]:
    return (u[1] * v[2] - u[2] * v[1], u[2] * v[0] - u[0] * v[2], u[0] * v[1] - u[1] * v[0])


def closest_pair(
    pos: np.ndarray,
    cell: np.ndarray,
    pbc: np.ndarray,
    cutoff: float,
    heights: np.ndarray | None = None,
) -> tuple[float, int, int, bool] | None:
    """Closest pair within ``cutoff`` (an atom and its own periodic images included) as
    (distance, i, j, through a periodic image), or None.  ``heights``: the periodic
    heights of the cell (:func:`periodic_heights`), when the caller has them."""
    import vesin  # vesin accepts degenerate cell vectors along non-periodic axes

    cutoff = max(cutoff, COINCIDENT_DISTANCE)
    if all_pairs_suit(len(pos), pbc):  # a small molecule: one vectorised test
        i, j, r2 = molecule_pairs(pos, cutoff)
        if len(r2) == 0:
            return None
        k = int(np.argmin(r2))
        return float(np.sqrt(r2[k])), int(i[k]), int(j[k]), False
    # vesin bins space by its cutoff: searching 0.5 Å in a 21 Å crystal means 80 000 bins
    # for 256 atoms, nearly all empty, so search wider and keep the closest -- no wider
    # than twice the thinnest periodic height, which bounds the images
    if heights is None:
        heights = periodic_heights(cell, pbc)
    reach = min(_CLOSEST_PAIR_SEARCH, 2 * heights.min()) if heights.size else _CLOSEST_PAIR_SEARCH
    i, j, shifts, d = vesin.NeighborList(
        cutoff=max(cutoff, reach), full_list=False, n_threads=1
    ).compute(pos, cell, pbc.tolist(), "ijSd")
    if len(d) == 0:
        return None
    k = int(np.argmin(d))
    if d[k] >= cutoff:
        return None
    return float(d[k]), int(i[k]), int(j[k]), bool(np.any(shifts[k]))


#: radius (Å) of the closest-pair search of structure validation (see closest_pair)
_CLOSEST_PAIR_SEARCH = 3.0


#: a fully periodic cell with at most this many (pair, image) candidates joins the
#: batched search of :func:`closest_pairs_of_small_cells`: a vesin call's fixed cost per
#: structure was most of validating a few-atom cell, and a workflow validates hundreds
#: of them (strained or displaced copies; figures: BENCHMARKS.md, "EMT after the
#: validation and heights work")
SMALL_CELL_CANDIDATES = 2048


def image_reach(heights: np.ndarray, cutoff: Any) -> np.ndarray:
    """Lattice translations per direction within which an atom pair of a cell, both
    wrapped into it (fractional difference below 1), can come within ``cutoff``: a
    cell's ``[3]`` heights and a number, or ``[S, 3]`` and ``[S]``."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        reach = np.asarray(cutoff, dtype=np.float64)[..., None] / heights + 1.0
    return np.where(np.isfinite(reach), reach, 0.0).astype(np.int64)  # (truncated: > 0)


def all_pairs_candidates(n_atoms: Any, reach: Any) -> Any:
    """Pairs ``i <= j`` times lattice images ``|S_a| <= reach[a]`` an enumerated search
    of a small cell checks (a cell's, or ``[rows]`` of them): validation's closest pair
    and the models' small-cell neighbour lists."""
    return n_atoms * (n_atoms + 1) / 2 * np.prod(2 * np.asarray(reach) + 1, axis=-1)


def closest_pairs_of_small_cells(
    positions: np.ndarray, cells: np.ndarray, reach: tuple[int, ...], cutoff: float
) -> list[tuple[float, int, int, bool] | None]:
    """:func:`closest_pair` of G fully periodic cells of n atoms each at once
    (``positions [G, n, 3]``, ``cells [G, 3, 3]``), by enumerating every pair ``i <= j``
    with every lattice image in ``reach`` (:func:`image_reach` of each cell's heights;
    the largest over the G cells)."""
    frac = np.einsum("gnx,gxy->gny", positions, np.linalg.inv(cells))
    wrap = np.floor(frac)
    inside = positions - np.einsum("gnx,gxy->gny", wrap, cells)
    axes = [np.arange(-k, k + 1, dtype=np.float64) for k in reach]
    grid = np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, 3)
    iu, ju = np.triu_indices(positions.shape[1])
    d = (inside[:, ju] - inside[:, iu])[:, :, None, :] + np.einsum("mx,gxy->gmy", grid, cells)[
        :, None
    ]
    r2 = np.einsum("gpmx,gpmx->gpm", d, d)
    shift = grid[None, None] + (wrap[:, iu] - wrap[:, ju])[:, :, None]  # the input's frame
    image = shift.any(axis=3)
    r2[~image & (iu == ju)[None, :, None]] = np.inf  # an atom and itself
    flat = r2.reshape(len(r2), -1)
    best = np.argmin(flat, axis=1)
    out: list[tuple[float, int, int, bool] | None] = []
    for g, k in enumerate(best.tolist()):
        p, m = divmod(k, len(grid))
        r = float(flat[g, k])
        out.append(
            (math.sqrt(r), int(iu[p]), int(ju[p]), bool(image[g, p, m]))
            if r < cutoff * cutoff
            else None
        )
    return out
