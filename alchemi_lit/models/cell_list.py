"""Pairs of many systems in one pass: a batched cell list in plain torch (the device path).

Why: on an accelerator, one vesin call per system costs a launch sequence and tens of
microseconds of host time per system, so a rebuild of thousands of small systems
idled the GPU (REFERENCE.md section 7).  Here every system of the batch is binned at
once -- the system's index is folded into the bin index -- and the number of torch
operations of a build does not depend on how many systems there are (tested by
counting them); it grows only when the candidates exceed :data:`CANDIDATE_BUDGET`,
which then go through in chunks of the same operations.  A build reads a few sizes
on the host (output shapes); it happens only at a rebuild, a bookkeeping point.

The pairs are vesin's exactly, in vesin's orientation (``i < j``, an atom and its own
image in one half-space of shifts) and tested with vesin's arithmetic in float64
(``vec = (r_j - r_i) + S @ cell`` summed row by row, kept where ``(x*x + y*y) + z*z <
radius**2``), then put in :func:`~.edges.canonical_order`: the edges, and so the
forces, equal the CPU path's to the bit.

How: each system gets a frame -- its periodic cell vectors, completed by unit vectors
orthogonal to them along non-periodic axes -- and its atoms get fractional coordinates
in it, wrapped into the cell along periodic axes.  Bins are at least ``radius / 2`` wide
(``radius / 2`` rather than ``radius``: 5^3 bins of a quarter of the atoms test about
a sixth of the candidates 3^3 bins of all of them do), a bin searches the bins ``s`` =
``ceil(radius / width)`` away along each axis, wrapped with an image shift along periodic
axes (so a cell narrower than the radius just gets more images, as in vesin and
:mod:`.small_cells`), and only half of the offsets are searched (the other half finds
the same pairs from the other end).  Occupied bins and their neighbours are matched by
a sorted search, so empty bins cost nothing.
"""

from __future__ import annotations

import torch

from ..core.state import Batch
from ..core.tensor_ops import rows_times
from .edges import canonical_order

#: candidate pairs (i, j, shift) tested in one pass; beyond it the candidates go in
#: chunks (peak memory ~300 bytes a candidate: ~2.5 GB at 2^23)
CANDIDATE_BUDGET = 1 << 23
#: at most this many bins along an axis of one system (keeps bin keys far from overflow)
_MAX_BINS_PER_AXIS = 4096
#: relative margin on the search reach: binning rounds, the exact test decides
_REACH_MARGIN = 1e-9

Pairs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def batched_pairs(batch: Batch, radius: float, rows: torch.Tensor | None = None) -> Pairs:
    """Half list within ``radius`` of the systems ``rows`` (a boolean mask ``[B]``; all
    when None): (i, j, cartesian shift, system row, integer shift), in canonical order.

    A system with a non-finite position (or periodic cell vector) gets no edges: NaNGuard
    quarantines it, as on the CPU path.
    """
    pos = batch.positions.detach().to(torch.float64)
    cell = batch.cell.detach().to(torch.float64)
    pbc = batch.pbc
    n_sys, device = batch.num_systems, pos.device
    ok = torch.ones(n_sys, dtype=torch.bool, device=device) if rows is None else rows.clone()
    ok &= torch.isfinite(cell).all(2).logical_or(~pbc).all(1)
    bad_atom = (~torch.isfinite(pos).all(1)).to(torch.int64)
    bad = torch.zeros(n_sys, dtype=torch.int64, device=device).index_add_(
        0, batch.system_idx, bad_atom
    )
    ok &= bad == 0
    cell = torch.nan_to_num(cell, nan=0.0, posinf=0.0, neginf=0.0)  # (systems left out)
    atoms = ok.index_select(0, batch.system_idx).nonzero().squeeze(1)  # (a build's read)
    grid = _Grid(pos.index_select(0, atoms), cell, pbc, batch.system_idx.index_select(0, atoms),
                 n_sys, radius)  # fmt: skip
    parts = [_candidates(grid, atoms, pos, cell, radius, chunk) for chunk in grid.chunks]
    if not parts:
        return _no_pairs(device, batch.dtype)
    i, j, ishift = (torch.cat(x) for x in zip(*parts))
    system = batch.system_idx.index_select(0, i)
    order = canonical_order(i, j, ishift, batch.num_atoms)
    i, j, system, ishift = (x.index_select(0, order) for x in (i, j, system, ishift))
    cells = batch.cell.detach().index_select(0, system)
    cart = rows_times(ishift.to(batch.dtype), cells)
    return i, j, cart, system, ishift


class _Grid:
    """The bins of every system and the (occupied bin, half-space offset) pairs to search.

    ``entries`` are the pairs of an occupied source bin and a bin it searches, with the
    image shift between them and how many candidates they make; ``chunks`` cuts them
    into runs of at most :data:`CANDIDATE_BUDGET` candidates (one entry may exceed it).
    """

    def __init__(
        self,
        pos: torch.Tensor,
        cell: torch.Tensor,
        pbc: torch.Tensor,
        system: torch.Tensor,
        n_sys: int,
        radius: float,
    ) -> None:
        frame = _frames(cell, pbc)
        inv = torch.linalg.inv_ex(frame)[0]
        frac = rows_times(pos, inv.index_select(0, system))
        height = inv.norm(dim=1).reciprocal()  # distance between lattice planes, per axis
        periodic = pbc.index_select(0, system)
        wrap = torch.where(periodic, torch.floor(frac), torch.zeros_like(frac))
        frac = frac - wrap
        low = _segment_extreme(frac, system, n_sys, "amin")
        extent = _segment_extreme(frac, system, n_sys, "amax") - low
        length = torch.where(pbc, height, extent * height)
        half = 0.5 * radius
        # (finite for every system, built or not: bin keys are offset by a cumulative sum)
        nb = torch.nan_to_num(torch.floor(length / half), nan=1.0).clamp(1, _MAX_BINS_PER_AXIS)
        width = torch.where(pbc, height / nb, torch.maximum(length / nb, torch.full_like(nb, half)))
        reach = torch.ceil(radius * (1 + _REACH_MARGIN) / width)
        reach = torch.where(pbc, reach, torch.minimum(reach, nb - 1)).to(torch.int64)
        nb_f = nb
        nb = nb.to(torch.int64)
        scaled = torch.where(
            periodic,
            frac * nb_f.index_select(0, system),
            (frac - low.index_select(0, system)) * (height / width).index_select(0, system),
        )
        nb_a = nb.index_select(0, system)
        coord = torch.minimum(torch.floor(scaled).to(torch.int64).clamp_min(0), nb_a - 1)
        per_sys = nb.prod(1)
        first_bin = torch.cumsum(per_sys, 0) - per_sys
        key = first_bin.index_select(0, system) + _flat(coord, nb_a)
        key, order = torch.sort(key, stable=True)
        self.order = order  # sorted position -> index into the built atoms
        self.wrap = wrap.to(torch.int64).index_select(0, order)
        bins, occupancy = torch.unique_consecutive(key, return_counts=True)  # (a read)
        start = torch.cumsum(occupancy, 0) - occupancy
        bin_sys = system.index_select(0, order).index_select(0, start)
        bin_coord = coord.index_select(0, order).index_select(0, start)
        self._search(bins, occupancy, start, bin_sys, bin_coord, reach, nb, pbc, first_bin)

    def _search(
        self,
        bins: torch.Tensor,
        occupancy: torch.Tensor,
        start: torch.Tensor,
        bin_sys: torch.Tensor,
        bin_coord: torch.Tensor,
        reach: torch.Tensor,
        nb: torch.Tensor,
        pbc: torch.Tensor,
        first_bin: torch.Tensor,
    ) -> None:
        """Pair each occupied bin with the bins of its half space of offsets."""
        span = 2 * reach + 1  # offsets per axis  [B, 3]
        offsets = span.prod(1)
        center = offsets // 2  # the zero offset's index; the half space is above it
        count = (offsets - center).index_select(0, bin_sys)
        total = int(count.sum())  # (a read)
        src = _expand(count, total)
        sys_e = bin_sys.index_select(0, src)
        local = _ranks(count, src, total) + center.index_select(0, sys_e)
        self.self_bin = local == center.index_select(0, sys_e)
        span_e, reach_e, nb_e = (t.index_select(0, sys_e) for t in (span, reach, nb))
        step = torch.stack(
            [
                local // (span_e[:, 1] * span_e[:, 2]),
                local // span_e[:, 2] % span_e[:, 1],
                local % span_e[:, 2],
            ],
            1,
        ) - reach_e
        virtual = bin_coord.index_select(0, src) + step
        periodic = pbc.index_select(0, sys_e)
        shift = torch.where(periodic, torch.div(virtual, nb_e, rounding_mode="floor"), 0)
        target = virtual - shift * nb_e
        inside = ((target >= 0) & (target < nb_e)).all(1)
        tkey = first_bin.index_select(0, sys_e) + _flat(target.clamp_min(0), nb_e)
        where = torch.searchsorted(bins, tkey).clamp_max(max(len(bins) - 1, 0))
        found = inside & (bins.index_select(0, where) == tkey)
        t_occ = torch.where(found, occupancy.index_select(0, where), 0)
        self.cands = occupancy.index_select(0, src) * t_occ
        self.src_start = start.index_select(0, src)
        self.dst_start = start.index_select(0, where)
        self.dst_occ = t_occ
        self.shift = shift
        self.entry_sys = sys_e
        self.chunks = _chunks(self.cands)


def _chunks(cands: torch.Tensor) -> list[tuple[int, int, int, int]]:
    """Runs ``(first entry, end entry, candidates before, candidates)`` of the entries with
    at most :data:`CANDIDATE_BUDGET` candidates each (an entry above it alone)."""
    if len(cands) == 0:
        return []
    ends = torch.cumsum(cands, 0)
    total = int(ends[-1])  # (a read)
    pieces = -(-total // CANDIDATE_BUDGET)
    if pieces <= 1:
        return [(0, len(cands), 0, total)] if total else []
    marks = torch.arange(1, pieces, device=ends.device) * CANDIDATE_BUDGET
    cut = torch.searchsorted(ends, marks, right=True).clamp(1, len(cands) - 1)
    bounds = torch.cat([cut.new_zeros(1), torch.unique(cut), cut.new_full((1,), len(cands))])
    sums = torch.cat([ends.new_zeros(1), ends.index_select(0, bounds[1:] - 1)])
    b, s = bounds.tolist(), sums.tolist()  # (a read)
    return [(b[k], b[k + 1], s[k], s[k + 1] - s[k]) for k in range(len(b) - 1) if s[k + 1] > s[k]]


def _candidates(
    grid: _Grid, atoms: torch.Tensor, pos: torch.Tensor, cell: torch.Tensor, radius: float,
    chunk: tuple[int, int, int, int],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """One chunk of the grid's entries expanded to candidate pairs and tested exactly:
    (i, j, integer shift) of the pairs within ``radius``, oriented as vesin orients them."""
    lo, hi, _, total = chunk
    cands = grid.cands[lo:hi]
    local = _expand(cands, total)
    rank = _ranks(cands, local, total)
    entry = local + lo
    dst_occ = grid.dst_occ.index_select(0, entry)
    a = grid.src_start.index_select(0, entry) + torch.div(rank, dst_occ, rounding_mode="floor")
    b = grid.dst_start.index_select(0, entry) + rank % dst_occ
    del rank, dst_occ
    # the zero offset pairs a bin with itself: each pair of its atoms once, no self pair
    keep = ~grid.self_bin.index_select(0, entry) | (a < b)
    shift = grid.shift.index_select(0, entry)
    shift += grid.wrap.index_select(0, a)
    shift -= grid.wrap.index_select(0, b)
    i = atoms.index_select(0, grid.order.index_select(0, a))
    j = atoms.index_select(0, grid.order.index_select(0, b))
    del a, b
    # vesin's orientation: i < j, or an atom and its own image with a shift in one half space
    total_s = shift.sum(1)
    upper = (total_s > 0) | (
        (total_s == 0) & ((shift[:, 2] > 0) | ((shift[:, 2] == 0) & (shift[:, 1] > 0)))
    )
    flip = (i > j) | ((i == j) & ~upper)
    i, j = torch.where(flip, j, i), torch.where(flip, i, j)
    shift = torch.where(flip.unsqueeze(1), -shift, shift)
    # vesin's arithmetic, in float64: (r_j - r_i) + S @ cell, the image summed row by row
    system = grid.entry_sys.index_select(0, entry)
    s = shift.to(torch.float64)
    d = pos.index_select(0, j) - pos.index_select(0, i)
    image = s[:, 0:1] * cell[:, 0].index_select(0, system)
    image += s[:, 1:2] * cell[:, 1].index_select(0, system)
    image += s[:, 2:3] * cell[:, 2].index_select(0, system)
    d += image
    r2 = d[:, 0] * d[:, 0]
    r2 += d[:, 1] * d[:, 1]
    r2 += d[:, 2] * d[:, 2]
    keep &= r2 < radius * radius
    sel = keep.nonzero().squeeze(1)  # (a read)
    return i.index_select(0, sel), j.index_select(0, sel), shift.index_select(0, sel)


def _frames(cell: torch.Tensor, pbc: torch.Tensor) -> torch.Tensor:
    """Each system's binning frame ``[B, 3, 3]``: the periodic cell vectors, completed
    along non-periodic axes by unit vectors orthogonal to them (the null space of the
    periodic rows, from an SVD), so that the frame is invertible whatever the cell."""
    periodic_rows = cell * pbc.unsqueeze(2)
    vh = torch.linalg.svd(periodic_rows)[2]  # rows beyond the rank span the null space
    slot = (pbc.sum(1, keepdim=True) + torch.cumsum(~pbc, 1) - 1).clamp(0, 2)
    fill = vh.gather(1, slot.unsqueeze(2).expand(-1, -1, 3))
    return torch.where(pbc.unsqueeze(2), cell, fill)


def _segment_extreme(x: torch.Tensor, system: torch.Tensor, n_sys: int, how: str) -> torch.Tensor:
    """Per-system min or max (``how``: "amin" / "amax") of ``x`` ``[N, 3]`` (0 where empty)."""
    out = x.new_zeros((n_sys, 3))
    index = system.unsqueeze(1).expand(-1, 3)
    return out.scatter_reduce(0, index, x, how, include_self=False)


def _flat(coord: torch.Tensor, nb: torch.Tensor) -> torch.Tensor:
    """Row-major index of bin ``coord`` ``[n, 3]`` in a grid of ``nb`` ``[n, 3]`` bins."""
    return (coord[:, 0] * nb[:, 1] + coord[:, 1]) * nb[:, 2] + coord[:, 2]


def _expand(count: torch.Tensor, total: int) -> torch.Tensor:
    """``k`` repeated ``count[k]`` times (``total`` = ``count.sum()``, known: no read)."""
    index = torch.arange(len(count), device=count.device)
    return torch.repeat_interleave(index, count, output_size=total)


def _ranks(count: torch.Tensor, owner: torch.Tensor, total: int) -> torch.Tensor:
    """Rank of each expanded item within its owner's run (see :func:`_expand`)."""
    first = torch.cumsum(count, 0) - count
    return torch.arange(total, device=count.device) - first.index_select(0, owner)


def _no_pairs(device: torch.device, dtype: torch.dtype) -> Pairs:
    empty = torch.zeros(0, dtype=torch.int64, device=device)
    ishift = torch.zeros((0, 3), dtype=torch.int64, device=device)
    return empty, empty, torch.zeros((0, 3), dtype=dtype, device=device), empty, ishift
