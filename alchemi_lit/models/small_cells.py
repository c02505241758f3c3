"""Pairs of small periodic cells: an all-pairs test over the images in range.

vesin's cell list is slow for a periodic cell narrower than twice the radius (it bins
space by the radius, so such a cell needs many images of many bins); for those, the
pairs come from one vectorised test of every atom against every image within reach,
with vesin's pairs, orientation and arithmetic, so the edges are the same to the bit.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from ..core.geometry import all_pairs_candidates
from ..core.tensor_ops import rows_times

#: glibc's largest dynamic mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX), less
#: a margin for the chunk header and alignment
_MMAP_THRESHOLD_MAX = 31 * 2**20
_heap_primed = 0


def small_cell_plan(
    pos: np.ndarray,
    cell: np.ndarray,
    pbc: np.ndarray,
    ptr: list[int],
    rows: list[int],
    radius: float,
) -> list[tuple | None]:
    """Per row: the images ``nmax`` for :func:`small_cell_system`, None for vesin, or
    ``()`` for a system with non-finite positions or periodic cell vectors (no edges;
    NaNGuard quarantines it).

    The all-pairs path takes fully periodic systems only.  There vesin's cell list
    has ``trunc(h / radius)`` bins along an axis whose faces are ``h`` apart and
    searches ``ceil(radius bins / h)`` bins each way, so a cell narrower than twice
    the radius is one bin that vesin tests against 27 (or more) images, pair by
    pair.  Testing every pair i <= j against the needed images with a few vectorised
    torch operations is then faster; it is chosen when it tests no more candidate
    pairs than vesin would (and they fit in a few MB).
    """
    out: list[tuple | None] = []
    if not rows:
        return out
    rows_a = np.asarray(rows)
    counts = np.asarray([ptr[b + 1] - ptr[b] for b in rows])
    ends = np.cumsum(counts)
    starts = ends - counts
    # the atoms of these rows, in row order
    idx = np.arange(int(ends[-1])) + np.repeat(np.asarray([ptr[b] for b in rows]) - starts, counts)
    p = pos[idx]
    finite = np.ones(len(rows), dtype=bool)
    nonempty = counts > 0
    bad = ~np.isfinite(p).all(1)
    if bad.any():
        finite[np.unique(np.searchsorted(ends, np.nonzero(bad)[0], side="right"))] = False
    c = cell[rows_a]
    # a non-finite periodic cell vector: no edges either (vesin stops the process on it)
    finite &= (np.isfinite(c).all(2) | ~pbc[rows_a]).all(1)
    det = np.linalg.det(np.where(finite[:, None, None], c, np.eye(3)))
    ok = finite & nonempty & pbc[rows_a].all(1) & (np.abs(det) > 1e-9)
    nmax = np.zeros((len(rows), 3), dtype=np.int64)
    if ok.any():
        inv = np.linalg.inv(np.where(ok[:, None, None], c, np.eye(3)))
        recip = np.linalg.norm(inv, axis=1)  # |column a| = 1 / distance between faces
        atom_row = np.repeat(np.arange(len(rows)), counts)
        frac = np.einsum("na,nab->nb", p, inv[atom_row])
        spread = np.zeros((len(rows), 3))
        first = starts[nonempty]  # strictly increasing: empty rows hold no atoms
        spread[nonempty] = np.maximum.reduceat(frac, first, axis=0) - np.minimum.reduceat(
            frac, first, axis=0
        )
        # |S_a| <= radius / h_a + |frac_j - frac_i|_a for any pair within the radius
        with np.errstate(invalid="ignore"):
            nmax = np.floor(radius * recip + spread + 1e-9)
        nmax = np.where(ok[:, None] & np.isfinite(nmax), nmax, 0).astype(np.int64)
        bins = np.maximum(1.0, np.trunc(1.0 / (recip * radius)))
        search = np.maximum(1.0, np.ceil(radius * bins * recip))
        n = counts.astype(np.float64)
        vesin_candidates = n * n * np.prod((2 * search + 1) / bins, axis=1)
        candidates = all_pairs_candidates(n, nmax)
        ok &= candidates <= np.minimum(vesin_candidates, _SMALL_CELL_MAX_CANDIDATES)
    for k in range(len(rows)):
        if not finite[k]:
            out.append(())
        elif ok[k]:
            out.append(tuple(int(x) for x in nmax[k]))
        else:
            out.append(None)
    return out


#: memory bound of the all-pairs path (a few arrays of this many floats)
_SMALL_CELL_MAX_CANDIDATES = 600_000


def small_cell_system(
    pos: np.ndarray, cell: np.ndarray, radius: float, nmax: tuple, lo: int, cell_t: torch.Tensor
):
    """vesin's half list of one periodic system, from every pair i <= j and periodic
    image S with ``|S_a| <= nmax[a]``, in canonical order: (i + lo, j + lo, cartesian
    shift, integer shift), numpy.

    The same pairs, orientation and arithmetic as vesin's CPU cell list, so the edges
    are the same to the bit: i < j at any S, i == j at the S of one half-space (S != 0,
    vesin's rule), ``vec = (r_j - r_i) + S @ cell`` with ``S @ cell`` summed over the
    rows in order, kept where ``(x*x + y*y) + z*z < radius**2``.  Candidates are
    screened in float32 with a margin well above its rounding error, then tested
    exactly.  ``nonzero`` over (pair i <= j row-major, S lexicographic) yields the
    canonical order directly.
    """
    iu, ju = _upper_pairs(len(pos))
    shifts, keep_self, shifts_np = _shift_grid(nmax)
    p = torch.from_numpy(pos)
    m = torch.from_numpy(cell)
    s = shifts.to(torch.float64)
    image = s[:, 0:1] * m[0]
    image += s[:, 1:2] * m[1]
    image += s[:, 2:3] * m[2]
    d = p.index_select(0, ju) - p.index_select(0, iu)  # r_j - r_i  [P, 3]
    # float32 screen: |error of d2| < 12 eps32 (|d| + |S @ cell|)^2 ~ 1e-6 (...)^2
    reach = float(d.abs().max()) * 3**0.5 + float(image.norm(dim=1).max())
    screen = radius * radius + 1e-5 * reach * reach
    d32, im32 = d.to(torch.float32), image.to(torch.float32)
    d2 = (d32[:, 0:1] + im32[:, 0]).square_()  # [P, K]
    t = torch.add(d32[:, 1:2], im32[:, 1])
    d2 += t.square_()
    torch.add(d32[:, 2:3], im32[:, 2], out=t)
    d2 += t.square_()
    pair, k = (d2 < screen).nonzero(as_tuple=True)
    # exact test of the candidates, vesin's arithmetic
    dc, ic = d.index_select(0, pair), image.index_select(0, k)
    x = dc[:, 0] + ic[:, 0]
    y = dc[:, 1] + ic[:, 1]
    z = dc[:, 2] + ic[:, 2]
    r2 = x * x
    r2 += y * y
    r2 += z * z
    i, j = iu.index_select(0, pair), ju.index_select(0, pair)
    keep = (r2 < radius * radius) & ((i != j) | keep_self.index_select(0, k))
    keep_np = keep.numpy()
    k_np = k.numpy()[keep_np]
    i_np = i.numpy()[keep_np] + lo
    j_np = j.numpy()[keep_np] + lo
    ishift = shifts_np.take(k_np, axis=0)
    cart = bmm_shift(shifts_np, cell_t).take(k_np, axis=0)
    return i_np, j_np, cart, ishift


@functools.lru_cache(maxsize=16)
def _upper_pairs(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pairs i <= j of n atoms, row-major."""
    iu, ju = torch.triu_indices(n, n, offset=0)
    return iu, ju


@functools.lru_cache(maxsize=64)
def _shift_grid(nmax: tuple) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """All shifts with ``|S_a| <= nmax[a]`` in lexicographic order, which of them vesin
    keeps for an atom and its own image (S != 0: sum > 0, or sum == 0 with S_z > 0,
    or S_z == 0 and S_y > 0), and the shifts as a numpy array."""
    axes = [torch.arange(-m, m + 1) for m in nmax]
    shifts = torch.cartesian_prod(*axes).reshape(-1, 3)
    total = shifts.sum(1)
    keep = (total > 0) | (
        (total == 0) & ((shifts[:, 2] > 0) | ((shifts[:, 2] == 0) & (shifts[:, 1] > 0)))
    )
    return shifts, keep, shifts.numpy()


def canonical_system(i: np.ndarray, j: np.ndarray, sh: np.ndarray, n: int, lo: int, cell):
    """One system's pairs (local indices ``i``, ``j``, integer shifts ``sh``) sorted by
    (i, j, shift) -- :func:`canonical_order`, in numpy -- as (i + lo, j + lo,
    cartesian shift, integer shift).

    The cartesian shifts are ``rows_times(shift, cell)`` as before, computed once per
    distinct shift of the system (at most ``(2 span + 1)^3`` of them) and gathered.
    """
    i = i.astype(np.int64)
    j = j.astype(np.int64)
    span = int(np.abs(sh).max()) if len(i) else 0
    base = 2 * span + 1
    code = sh.astype(np.int64) + span  # shift digits in 0 .. 2 span
    code = (code[:, 0] * base + code[:, 1]) * base + code[:, 2]
    if n * n * base**3 < 2**62:
        key = i * n
        key += j
        key *= base**3
        key += code
        order = np.argsort(key, kind="stable")  # unique keys; timsort uses vesin's runs
    else:  # astronomically large: lexicographic sort
        order = np.lexsort((sh[:, 2], sh[:, 1], sh[:, 0], j, i))
    i = i.take(order)
    i += lo
    j = j.take(order)
    j += lo
    code = code.take(order)
    if span == 0:  # no periodic images (a molecule): zero shifts, nothing to multiply
        zeros = np.zeros((len(i), 3), dtype=np.int64)
        return i, j, zeros.astype(cell.numpy().dtype), zeros
    if base**3 <= max(len(code), 27):
        digits = np.arange(base**3)
        table = np.stack([digits // (base * base), digits // base % base, digits % base], 1)
        table -= span
        ishift = table.take(code, axis=0)
        cart = bmm_shift(table, cell).take(code, axis=0)
    else:  # a few pairs in a tiny cell with far images
        ishift = sh.astype(np.int64).take(order, axis=0)
        cart = bmm_shift(ishift, cell)
    return i, j, cart, ishift


def bmm_shift(ishift: np.ndarray, cell: torch.Tensor) -> np.ndarray:
    """``ishift @ cell`` row by row, as every list builder computes it (bit for bit:
    :func:`~alchemi_lit.core.tensor_ops.rows_times`)."""
    s = torch.from_numpy(ishift).to(cell.dtype)
    return rows_times(s, cell.expand(len(s), 3, 3)).numpy()
