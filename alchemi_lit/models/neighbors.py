"""Batched periodic Verlet neighbour list.

Pairs come from `vesin <https://github.com/Luthaf/vesin>`_, a maintained cell-list
library (linear in atoms, triclinic cells, mixed periodicity, CPU and CUDA), or, for
small periodic cells on CPU, from an all-pairs test that yields the same pairs (see
below).  We build per system and add what a batched MD engine needs on top:

* **Verlet skin.**  The list holds pairs within ``cutoff + skin``; a system is
  rebuilt only when one of its atoms moved more than ``skin / 2`` since its last
  build.  Only those systems are rebuilt.  A cell that changed (a barostat, a cell
  relaxation) is a deformation ``M`` of the one the list was built in (``h = h0 M``):
  every pair vector is then ``d0 M`` plus the atoms' moves ``u = r - r0 M`` beyond the
  affine one, so no pair beyond ``cutoff + skin`` came within ``cutoff`` while
  ``2 max|u| < (cutoff + skin) s_min(M) - cutoff`` (``s_min``: the smallest singular
  value); the list is kept, its periodic shifts recomputed in the new cell.  With an
  unchanged cell this is the ``skin / 2`` rule.
* **Canonical order.**  Edges are sorted by (i, j, shift) after every rebuild, so
  force sums add in the same order whatever the rebuild history.  Edges between
  cutoff and cutoff+skin contribute exact zeros, which leaves float sums unchanged:
  a resumed run reproduces an uninterrupted one bit for bit.

Why vesin rather than our own torch cell list, ASE, matscipy or nvalchemi-toolkit-ops:
``bench/bench_neighbors.py`` times them on the same systems (figures in BENCHMARKS.md).
vesin is linear in atoms, the fastest CPU builder we can depend on from 500 to
100 000 atoms (on par with nvalchemi-ops' Warp cell list, which needs numpy < 2.4 and
Warp), and handles triclinic cells and mixed periodicity.  Its weak spot is a
periodic cell narrower than twice the radius (the LJ benchmark's 15.8 Å cells at
rc + skin = 9.5 Å): one bin per axis, so it tests every pair against 27 images one
by one (~1.6 ms per 108-atom system).  For such small systems :func:`_build_rows`
tests all pairs i <= j against the needed images with a few vectorised torch
operations instead (2-3x faster), reproducing vesin's pairs, orientation and
arithmetic bit for bit (checked on fuzzed triclinic cells, unwrapped positions and
self-images); it picks per system whichever tests fewer candidate pairs.  Small
non-periodic systems (molecules, up to ~50 atoms) likewise get their pairs from one
vectorised test (:func:`molecule_pairs`), which beats a vesin call's fixed cost there;
structure validation and edge budgets use it too.

Each vesin system's pairs are put in canonical order right after its call, while
they are small and in cache, so a batch needs no global sort (the all-pairs path
yields that order directly).  vesin 0.6 serialises its calls on a global mutex, so
a second thread only helps by sorting one system while the other is in vesin, or
by running vesin's systems while the small cells are done in torch.  With a skin the
list is rebuilt every few tens of MD steps anyway.  The rebuild check costs one
host-device sync per model call (deciding to rebuild is a host decision);
everything else stays on the device.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..segments import ones_rows
from ..state import Batch
from ..tensor_ops import may_be_set, row_dot


@dataclass
class Edges:
    """Half list of pairs (each unordered pair once) within ``cutoff + skin``.

    ``vec = positions[j] - positions[i] + shift`` points from i to j.  Pairs with
    ``|vec| > cutoff`` are present and must be masked by the model (they are what
    makes the skin work).

    ``atom_counts``/``system_counts``/``j_flat``/``atom_rows`` are set by
    :class:`NeighborList` on CPU, where its edges are sorted by ``i`` (hence by system).
    There the sum over each atom's run of edges is a product with a sparse CSR matrix
    of ones (3x faster than ``segment_reduce``, itself 2-3x faster than ``index_add_``),
    the pull on atoms j a flat bincount, and per-system sums use ``segment_reduce``:
    it adds in order, so edges beyond the cutoff (exact zeros) never change a sum,
    while the CSR product over a long row groups its terms by position (tested:
    results do not depend on the list's history).  On GPU they stay None and the
    reductions use ``index_add_`` (no host sync).
    """

    i: torch.Tensor
    j: torch.Tensor
    vec: torch.Tensor
    system: torch.Tensor
    cutoff: float
    atom_counts: torch.Tensor | None = None  # edges per atom i  [N]
    system_counts: torch.Tensor | None = None  # edges per system  [B]
    j_flat: torch.Tensor | None = None  # 3 j + (0, 1, 2)  [3 P]
    atom_rows: torch.Tensor | None = None  # CSR [N, P]: the edges of each atom i

    def directed(self) -> Edges:
        """Both directions of every pair (for message-passing models)."""
        return Edges(
            torch.cat([self.i, self.j]),
            torch.cat([self.j, self.i]),
            torch.cat([self.vec, -self.vec]),
            torch.cat([self.system, self.system]),
            self.cutoff,
        )

    def system_sum(self, values: torch.Tensor, num_systems: int) -> torch.Tensor:
        """Sum per-edge ``values`` ``[P]`` or ``[P, k]`` into systems ``[B]`` / ``[B, k]``."""
        if self.system_counts is not None:
            return torch.segment_reduce(values, "sum", lengths=self.system_counts, axis=0)
        out = values.new_zeros((num_systems, *values.shape[1:]))
        return out.index_add_(0, self.system, values)

    def forces(self, grad: torch.Tensor, num_atoms: int) -> torch.Tensor:
        """``F_i = sum_j dE/dvec_ij - sum_k dE/dvec_ki`` from the edge gradient ``[P, 3]``."""
        if self.atom_counts is not None and self.j_flat is not None:
            if self.atom_rows is not None and grad.dtype == self.atom_rows.dtype:
                out = self.atom_rows @ grad
            else:
                out = torch.segment_reduce(grad, "sum", lengths=self.atom_counts, axis=0)
            pulled = torch.bincount(self.j_flat, weights=grad.reshape(-1), minlength=3 * num_atoms)
            return out.sub_(pulled.view(num_atoms, 3))
        out = grad.new_zeros((num_atoms, 3))
        # (-grad, not alpha=-1: index_add_ with alpha takes a ~4x slower path on CPU)
        return out.index_add_(0, self.i, grad).index_add_(0, self.j, -grad)


class NeighborList:
    """Verlet neighbour list over a :class:`~alchemi_lit.state.Batch` (see module doc)."""

    def __init__(self, cutoff: float, skin: float = 1.0) -> None:
        if cutoff <= 0:
            raise ValueError(f"neighbour-list cutoff must be > 0, got {cutoff}")
        if skin < 0:
            raise ValueError(f"neighbour-list skin must be >= 0, got {skin}")
        self.cutoff = float(cutoff)
        self.skin = float(skin)
        self.num_builds = 0  # systems (re)built so far; read by tests and benchmarks
        self._layout: object | None = None
        self._ref_positions: torch.Tensor | None = None
        self._ref_cell: torch.Tensor | None = None
        self._shift_cell: torch.Tensor | None = None  # the cells the shifts are in
        self._i = self._j = self._system = self._shift = None  # type: ignore[assignment]
        self._ishift: torch.Tensor | None = None  # integer cell shifts, for the edge order
        self._aids: tuple[Any, Any, Any] = (None, None, None)  # see Edges
        self._csr: dict[torch.dtype, tuple[Any]] = {}  # see _rows

    def reset(self) -> None:
        self._layout = None

    def needs_rebuild(self, batch: Batch) -> torch.Tensor:
        """Per-system boolean ``[B]``: must this system's list be rebuilt?"""
        if self._layout is not batch.layout or self._ref_positions is None:
            return torch.ones(batch.num_systems, dtype=torch.bool, device=batch.device)
        reference = self._ref_positions
        reshaped = (batch.cell != self._ref_cell).flatten(1).any(1)  # NaN marks "never built"
        limit = torch.full_like(batch.energy, 0.5 * self.skin)
        if may_be_set(reshaped):  # (on CPU read; elsewhere always computed)
            strain, limit = self._strain(batch, reshaped)
            reference = torch.bmm(
                reference.unsqueeze(1), strain.index_select(0, batch.system_idx)
            ).squeeze(1)
        disp2 = row_dot(batch.positions - reference)
        max_disp2 = torch.zeros(batch.num_systems, dtype=disp2.dtype, device=disp2.device)
        max_disp2 = max_disp2.scatter_reduce(0, batch.system_idx, disp2, "amax", include_self=True)
        moved = (max_disp2 > limit * limit) | (limit < 0)
        return moved | ~torch.isfinite(max_disp2) | ~torch.isfinite(limit)

    def _strain(self, batch: Batch, reshaped: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each system's deformation ``M`` since its build (``h = h0 M``; the identity
        where the cell is unchanged) and how far ``[B]`` its atoms may move beyond it
        (NaN, so rebuilt, where the build's cell or the new one is singular or NaN)."""
        eye = torch.eye(3, dtype=batch.dtype, device=batch.device).expand_as(batch.cell)
        ref, cell = self._ref_cell, batch.cell.detach()
        usable = (
            reshaped
            & (torch.linalg.det(ref).abs() > 1e-12)
            & (torch.linalg.det(cell).abs() > 1e-12)
        )
        usable = usable & torch.isfinite(ref).flatten(1).all(1)
        strain = torch.linalg.solve(
            torch.where(usable[:, None, None], ref, eye),
            torch.where(usable[:, None, None], cell, eye),
        )
        s_min = torch.linalg.svdvals(strain)[:, -1]
        radius = self.cutoff + self.skin
        nan = torch.full_like(s_min, float("nan"))
        limit = torch.where(usable, 0.5 * (radius * s_min - self.cutoff), nan)
        return strain, torch.where(reshaped, limit, torch.full_like(s_min, 0.5 * self.skin))

    def __call__(self, batch: Batch) -> Edges:
        need = self.needs_rebuild(batch)
        moved_cell = need.new_zeros(())
        if self._shift_cell is not None and self._layout is batch.layout:
            moved_cell = ((batch.cell != self._shift_cell).flatten(1).any(1) & ~need).any()
        rebuild, reshift = torch.stack([need.any(), moved_cell]).tolist()  # the one host sync
        if rebuild:
            self._rebuild(batch, need)
        if reshift:
            self._reshift(batch)
        pos = batch.positions  # index_select + in-place: ~2x faster than pos[j] - pos[i]
        vec = pos.index_select(0, self._j).sub_(pos.index_select(0, self._i)).add_(self._shift)
        return Edges(
            self._i, self._j, vec, self._system, self.cutoff, *self._aids, *self._rows(vec.dtype)
        )

    def _reshift(self, batch: Batch) -> None:
        """Cartesian shifts of the kept edges in the current cells, computed as a build
        computes them (``torch.bmm`` of the integer shift and the cell, bit for bit)."""
        cell = batch.cell.detach()
        self._shift = torch.bmm(
            self._ishift.to(cell.dtype).unsqueeze(1), cell.index_select(0, self._system)
        ).squeeze(1)
        self._shift_cell = cell.clone()

    def _rows(self, dtype: torch.dtype) -> tuple[Any]:
        """``Edges.atom_rows`` for the current aids (built once per list and dtype)."""
        atom_counts = self._aids[0]
        if atom_counts is None:
            return (None,)
        if dtype not in self._csr:
            self._csr[dtype] = (ones_rows(atom_counts, dtype),)
        return self._csr[dtype]

    def remap(self, old_ptr: torch.Tensor, old_rows: torch.Tensor, new_batch: Batch) -> None:
        """Carry the list over to ``new_batch`` after systems left or joined.

        ``old_rows[b]`` is the previous row of new row ``b`` (-1 for a system that just
        joined).  Kept systems keep their edges (atom indices shifted); new systems
        are marked for a build at the next call.  Inflight batching relies on this:
        a refill builds lists only for the systems that came in.
        """
        if self._i is None or self._ref_positions is None:
            return
        device = new_batch.device
        n_old = len(old_ptr) - 1
        kept = old_rows >= 0
        row_new = torch.full((n_old,), -1, dtype=torch.long, device=device)
        row_new[old_rows[kept]] = torch.arange(new_batch.num_systems, device=device)[kept]
        new_ptr = new_batch.ptr
        offset = torch.zeros(n_old, dtype=torch.long, device=device)
        offset[old_rows[kept]] = new_ptr[:-1][kept] - old_ptr[:-1][old_rows[kept]]
        # one index of the kept edges, then gathers (a boolean mask per tensor costs a
        # search each: 5x slower for tens of thousands of edges)
        keep = (row_new.index_select(0, self._system) >= 0).nonzero().squeeze(1)
        sys_e = self._system.index_select(0, keep)
        off_e = offset.index_select(0, sys_e)
        self._i = self._i.index_select(0, keep).add_(off_e)
        self._j = self._j.index_select(0, keep).add_(off_e)
        self._shift = self._shift.index_select(0, keep)
        self._ishift = self._ishift.index_select(0, keep)
        self._system = row_new.index_select(0, sys_e)
        nan = float("nan")
        ref_pos = torch.full_like(new_batch.positions, nan)
        ref_cell = torch.full_like(new_batch.cell, nan)
        old_atom_rows = torch.repeat_interleave(
            torch.arange(n_old, device=device), old_ptr[1:] - old_ptr[:-1]
        )
        atom_keep = (row_new.index_select(0, old_atom_rows) >= 0).nonzero().squeeze(1)
        kept_rows = old_atom_rows.index_select(0, atom_keep)
        new_atom_index = atom_keep + offset.index_select(0, kept_rows)
        ref_pos.index_copy_(0, new_atom_index, self._ref_positions.index_select(0, atom_keep))
        ref_cell[kept] = self._ref_cell[old_rows[kept]]
        shift_cell = torch.full_like(new_batch.cell, nan)
        shift_cell[kept] = self._shift_cell[old_rows[kept]]
        self._ref_positions, self._ref_cell, self._shift_cell = ref_pos, ref_cell, shift_cell
        self._layout = new_batch.layout
        if len(self._i) > 1 and not bool((self._i[1:] >= self._i[:-1]).all()):
            self._sort(new_batch.num_atoms)  # rows were reordered: restore the canonical order
        self._set_aids(new_batch)

    # ------------------------------------------------------------------ build
    def _rebuild(self, batch: Batch, need: torch.Tensor) -> None:
        full = self._layout is not batch.layout or self._i is None
        rows = (
            torch.arange(batch.num_systems, device=batch.device)
            if full
            else need.nonzero().flatten()
        )
        new = _build_rows(batch, rows.tolist(), self.cutoff + self.skin)  # canonical order
        if full:
            self._i, self._j, self._shift, self._system, self._ishift = new
            self._ref_positions = batch.positions.detach().clone()
            self._ref_cell = batch.cell.detach().clone()
            self._shift_cell = self._ref_cell.clone()
            self._layout = batch.layout
            self._set_aids(batch)
        else:
            self._splice(batch, need, rows.tolist(), new)
            amask = need.index_select(0, batch.system_idx)
            self._ref_positions[amask] = batch.positions.detach()[amask]
            self._ref_cell[need] = batch.cell.detach()[need]
            self._shift_cell[need] = batch.cell.detach()[need]
        self.num_builds += len(rows)
        if batch.device.type == "cpu":
            _keep_edge_temporaries_on_heap(len(self._i))

    def _splice(self, batch: Batch, need: torch.Tensor, rows: list[int], new: tuple) -> None:
        """Replace the edge segments of systems ``rows`` by their new edges.

        Edges are grouped by system (sorted by i), so the new list is the old one cut at
        the rebuilt systems' segments with their new, canonically sorted segments put
        in: one copy of the list instead of a re-sort (a partial rebuild in MD touches a
        few systems at a time; re-sorting all edges made it 10x dearer).  The result is
        exactly the canonical order a full sort would give.
        """
        i, j, shift, system, ishift = new  # already in canonical order (see _build_rows)
        n_sys = batch.num_systems
        cpu_aids = self._aids[0] is not None and batch.device.type == "cpu"
        old_counts = self._aids[1] if cpu_aids else torch.bincount(self._system, minlength=n_sys)
        new_counts = torch.bincount(system, minlength=n_sys)
        table = torch.stack(
            [old_counts, new_counts, torch.cumsum(old_counts, 0), torch.cumsum(new_counts, 0)]
        )
        old_n, new_n, old_end, new_end = table.tolist()  # the one host copy of the splice
        cuts: list[tuple[int, int, int]] = []  # (0: old list | 1: new list, start, stop)
        pos = 0
        for r in rows:
            cuts.append((0, pos, old_end[r] - old_n[r]))
            cuts.append((1, new_end[r] - new_n[r], new_end[r]))
            pos = old_end[r]
        cuts.append((0, pos, len(self._i)))
        cuts = [c for c in cuts if c[2] > c[1]]

        def merge(old: torch.Tensor, new: torch.Tensor, width: int = 1) -> torch.Tensor:
            parts = [(new if src else old)[a * width : b * width] for src, a, b in cuts]
            return torch.cat(parts) if parts else old[:0]

        olds = (self._i, self._j, self._shift, self._system, self._ishift)
        news = (i, j, shift, system, ishift)
        self._i, self._j, self._shift, self._system, self._ishift = (
            merge(o, n) for o, n in zip(olds, news)
        )
        if cpu_aids:
            atom_counts, system_counts, j_flat = self._aids
            amask = need.index_select(0, batch.system_idx)
            atom_counts = torch.where(
                amask, torch.bincount(i, minlength=batch.num_atoms), atom_counts
            )
            system_counts = torch.where(need, new_counts, system_counts)
            self._aids = (atom_counts, system_counts, merge(j_flat, _flat3(j), 3))
            self._csr = {}
        else:
            self._set_aids(batch)

    def _sort(self, num_atoms: int) -> None:
        order = _canonical_order(self._i, self._j, self._ishift, num_atoms)
        self._i, self._j, self._system = self._i[order], self._j[order], self._system[order]
        self._shift, self._ishift = self._shift[order], self._ishift[order]

    def _set_aids(self, batch: Batch) -> None:
        """Reduction aids of :class:`Edges` (CPU; edges are sorted by i here)."""
        self._csr = {}
        if batch.device.type != "cpu":
            self._aids = (None, None, None)
            return
        atom_counts = torch.bincount(self._i, minlength=batch.num_atoms)
        system_counts = torch.bincount(self._system, minlength=batch.num_systems)
        self._aids = (atom_counts, system_counts, _flat3(self._j))


#: glibc's largest dynamic mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX), less
#: a margin for the chunk header and alignment
_MMAP_THRESHOLD_MAX = 31 * 2**20
_heap_primed = 0


def _keep_edge_temporaries_on_heap(num_edges: int) -> None:
    """Free one untouched block of ``72 * num_edges`` bytes (32 MiB at most), once per size.

    A model call allocates per-edge temporaries of a few MB (the edge vectors alone are
    24 bytes an edge).  glibc serves blocks above its mmap threshold with fresh
    ``mmap`` pages, and trims the heap when more than twice that threshold is free at
    its top, so with the default threshold every call page-faults its temporaries
    again: measured on the 64 x 108-atom LJ batch, 4 000-7 500 page faults and 13-20
    ms per call instead of 7 ms, depending on what the last rebuild left on the heap.
    glibc raises the threshold to the size of the largest mmapped block freed, so
    freeing one such block here (``torch.empty`` does not touch its pages; ~20 µs)
    keeps the temporaries on the heap.  The previous builder did this by accident (a
    72-byte-an-edge gather of the cells); elsewhere than glibc it is a no-op.
    """
    global _heap_primed
    size = min(72 * num_edges, _MMAP_THRESHOLD_MAX)
    if size <= _heap_primed or size < 2**20:
        return
    torch.empty(size, dtype=torch.uint8)  # allocated and freed at once
    _heap_primed = size


def _flat3(j: torch.Tensor) -> torch.Tensor:
    """Flat indices ``3 j + (0, 1, 2)`` of the xyz components of atoms ``j``."""
    return ((3 * j).unsqueeze(-1) + torch.arange(3, device=j.device)).reshape(-1)


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


def batch_pair_counts(batch: Batch, radius: float) -> list[int]:
    """:func:`count_pairs` for every system of a batch."""
    host = batch.to(device="cpu", dtype=torch.float64)
    ptr = host.ptr.tolist()
    return [
        count_pairs(
            host.positions[ptr[b] : ptr[b + 1]].numpy(),
            host.cell[b].numpy(),
            host.pbc[b].tolist(),
            radius,
        )
        for b in range(host.num_systems)
    ]


def _build_rows(batch: Batch, rows: list[int], radius: float):
    """Pairs of the given system rows: (i, j, cartesian shift, system row, integer shift).

    Edges come in canonical order -- systems ascending, then (i, j, shift) -- the
    order :func:`_canonical_order` gives.  On CPU a system is built either by vesin
    (then sorted on its own: a few thousand pairs, in cache) or, for a small
    periodic cell, by :func:`_small_cell_system`, which yields vesin's pairs in
    canonical order; the result is the same to the bit whichever path and however
    many threads (see the module doc).
    """
    device, dtype = batch.device, batch.dtype
    if device.type != "cpu":
        return _build_rows_on_device(batch, rows, radius)
    ptr = batch.ptr.tolist()
    cells = batch.cell.detach()
    pbcs = batch.pbc.tolist()
    pos_np = batch.positions.detach().to(torch.float64).numpy()
    cell_np = cells.to(torch.float64).numpy()
    rows = sorted(rows)
    plan = _small_cell_plan(pos_np, cell_np, batch.pbc.numpy(), ptr, rows, radius)
    small = [(b, nmax) for b, nmax in zip(rows, plan) if nmax is not None and nmax != ()]
    finite = [b for b, nmax in zip(rows, plan) if nmax is None]  # () = not finite: skipped
    molecules = [b for b in finite if all_pairs_suit(ptr[b + 1] - ptr[b], pbcs[b])]
    by_vesin = [b for b in finite if not all_pairs_suit(ptr[b + 1] - ptr[b], pbcs[b])]
    sizes = [ptr[b + 1] - ptr[b] for b in by_vesin]

    def vesin_part(chunk: list[int], n_threads: int = 1) -> list:
        return _vesin_rows(chunk, ptr, pos_np, cell_np, cells, pbcs, radius, n_threads)

    parts: list = []
    worker = None
    if small or molecules:
        if by_vesin:  # vesin's systems in a thread while this one does the others
            worker = _Worker(vesin_part, by_vesin)
            worker.start()
        for b, nmax in small:
            lo, hi = ptr[b], ptr[b + 1]
            built = _small_cell_system(pos_np[lo:hi], cell_np[b], radius, nmax, lo, cells[b])
            parts.append((b, built))
        for b in molecules:
            lo, hi = ptr[b], ptr[b + 1]
            i, j, _ = molecule_pairs(pos_np[lo:hi], radius)
            zeros = np.zeros((len(i), 3), dtype=np.int64)
            parts.append((b, (i + lo, j + lo, zeros.astype(cells.numpy().dtype), zeros)))
    elif len(by_vesin) > 1 and sum(sizes) >= _THREADED_MIN_ATOMS and torch.get_num_threads() > 1:
        # two threads at most: vesin's calls serialise (see the module doc), so the
        # second thread only hides the sorting of one system behind a vesin call
        first, second = _split_rows(by_vesin, sizes, 2)
        worker = _Worker(vesin_part, second)
        worker.start()
        parts += vesin_part(first)
    elif by_vesin:
        # a single big system: vesin's own threads (below ~10k atoms they cost more
        # than they save)
        big = len(by_vesin) == 1 and sizes[0] >= _VESIN_THREADS_MIN_ATOMS
        parts += vesin_part(by_vesin, torch.get_num_threads() if big else 1)
    if worker is not None:
        parts += worker.result()
    if not parts:
        return _no_edges(device, dtype)
    parts.sort(key=lambda part: part[0])
    built = [part[1] for part in parts]
    i, j, cart, ishift = (
        torch.from_numpy(x[0] if len(x) == 1 else np.concatenate(x)) for x in zip(*built)
    )
    sizes_e = [len(x[0]) for x in built]
    system = torch.repeat_interleave(
        torch.tensor([part[0] for part in parts]), torch.tensor(sizes_e), output_size=len(i)
    )
    return i, j, cart, system, ishift


#: a non-periodic system of at most this many atoms gets its pairs from one vectorised
#: all-pairs test (:func:`molecule_pairs`), faster than a vesin call up to ~50 atoms
#: (measured, rc 5-9.5 Å: 2 atoms 10 vs 38 us, 32 atoms 24 vs 42 us, 64 atoms 72 vs 61 us)
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


#: below this many atoms in the systems vesin builds, one thread does it all
_THREADED_MIN_ATOMS = 2_000
#: a single system this large is built with vesin's own threads
_VESIN_THREADS_MIN_ATOMS = 10_000


class _Worker(threading.Thread):
    """A thread that runs ``fn(arg)`` and hands back its result (or raises its error)."""

    def __init__(self, fn: Any, arg: Any) -> None:
        super().__init__(daemon=True)
        self._fn, self._arg = fn, arg
        self._out: Any = None
        self._err: BaseException | None = None

    def run(self) -> None:
        try:
            self._out = self._fn(self._arg)
        except BaseException as err:  # re-raised in the calling thread
            self._err = err

    def result(self) -> Any:
        self.join()
        if self._err is not None:
            raise self._err
        return self._out


def _split_rows(rows: list[int], sizes: list[int], parts: int) -> list[list[int]]:
    """Cut ``rows`` into ``parts`` consecutive runs of about equal atoms (``parts`` <=
    ``len(rows)``)."""
    total = sum(sizes)
    out: list[list[int]] = [[]]
    acc = 0
    for k, (b, n) in enumerate(zip(rows, sizes)):
        left = len(rows) - k  # rows not placed yet, this one included
        if (
            out[-1]
            and len(out) < parts
            and (acc >= total * len(out) / parts or left == parts - len(out))
        ):
            out.append([])
        out[-1].append(b)
        acc += n
    return out


def _vesin_rows(
    rows: list[int],
    ptr: list[int],
    pos_np: np.ndarray,
    cell_np: np.ndarray,
    cells: torch.Tensor,
    pbcs: list[list[bool]],
    radius: float,
    n_threads: int = 1,
) -> list:
    """vesin half lists of ``rows`` (finite positions), each in canonical order:
    ``[(row, (i, j, cartesian shift, integer shift))]`` (numpy arrays)."""
    import vesin

    calc = vesin.NeighborList(cutoff=radius, full_list=False, n_threads=n_threads)
    parts = []
    for b in rows:
        lo, hi = ptr[b], ptr[b + 1]
        # copy=False: views of vesin's buffers, consumed before its next call
        i, j, sh = calc.compute(pos_np[lo:hi], cell_np[b], pbcs[b], "ijS", copy=False)
        parts.append((b, _canonical_system(i, j, sh, hi - lo, lo, cells[b])))
    return parts


def _small_cell_plan(
    pos: np.ndarray,
    cell: np.ndarray,
    pbc: np.ndarray,
    ptr: list[int],
    rows: list[int],
    radius: float,
) -> list[tuple | None]:
    """Per row: the images ``nmax`` for :func:`_small_cell_system`, None for vesin, or
    ``()`` for a system with non-finite positions (no edges; NaNGuard quarantines it).

    The all-pairs path takes fully periodic systems only.  There vesin's cell list
    has ``trunc(h / radius)`` bins along an axis whose faces are ``h`` apart and
    searches ``ceil(radius bins / h)`` bins each way, so a cell narrower than twice
    the radius is one bin that vesin tests against 27 (or more) images, pair by
    pair.  Testing every pair i <= j against the needed images with a few vectorised
    torch operations is then 2-3x faster; it is chosen when it tests no more
    candidate pairs than vesin would (and they fit in a few MB).
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
    det = np.linalg.det(c)
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
        candidates = n * (n + 1) / 2 * np.prod(2 * nmax + 1, axis=1)
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


def _small_cell_system(
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
    cart = _bmm_shift(shifts_np, cell_t).take(k_np, axis=0)
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


def _canonical_system(i: np.ndarray, j: np.ndarray, sh: np.ndarray, n: int, lo: int, cell):
    """One system's pairs (local indices ``i``, ``j``, integer shifts ``sh``) sorted by
    (i, j, shift) -- :func:`_canonical_order`, in numpy -- as (i + lo, j + lo,
    cartesian shift, integer shift).

    The cartesian shifts are ``torch.bmm(shift, cell)`` as before, computed once per
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
        cart = _bmm_shift(table, cell).take(code, axis=0)
    else:  # a few pairs in a tiny cell with far images
        ishift = sh.astype(np.int64).take(order, axis=0)
        cart = _bmm_shift(ishift, cell)
    return i, j, cart, ishift


def _bmm_shift(ishift: np.ndarray, cell: torch.Tensor) -> np.ndarray:
    """``ishift @ cell`` row by row, as ``torch.bmm`` computes it (bit for bit)."""
    s = torch.from_numpy(ishift).to(cell.dtype).unsqueeze(1)
    return torch.bmm(s, cell.expand(len(s), 3, 3)).squeeze(1).numpy()


def _build_rows_on_device(batch: Batch, rows: list[int], radius: float):
    """:func:`_build_rows` with ``vesin-torch``, on the batch's own device (GPU path;
    it runs on CPU tensors too, which is how the tests check it against the CPU path).
    Edges in canonical order, as from :func:`_build_rows`."""
    device, dtype = batch.device, batch.dtype
    ptr = batch.ptr.tolist()
    pos_all = batch.positions.detach()
    cells = batch.cell.detach()
    pbcs = batch.pbc.tolist()
    try:
        from vesin_torch import NeighborList as TorchNL
    except ImportError as exc:  # pragma: no cover - vesin-torch is a dependency
        raise ImportError(
            "neighbour lists on an accelerator need the vesin-torch package: "
            "pip install 'vesin-torch>=0.6'"
        ) from exc

    calc = TorchNL(cutoff=radius, full_list=False)
    finite = torch.isfinite(pos_all).all(-1).to(torch.int32)
    ok = torch.ones(len(ptr) - 1, dtype=torch.int32, device=device)
    ok = ok.scatter_reduce(0, batch.system_idx, finite, "amin").bool().tolist()
    parts_i, parts_j, parts_s, parts_sys = [], [], [], []
    for b in rows:
        if not ok[b]:
            continue  # a diverged system gets no edges; NaNGuard quarantines it
        lo, hi = ptr[b], ptr[b + 1]
        periodic = torch.tensor(pbcs[b], device=device)
        i, j, sh = calc.compute(pos_all[lo:hi], cells[b], periodic, "ijS")
        parts_i.append(i.to(torch.int64) + lo)
        parts_j.append(j.to(torch.int64) + lo)
        parts_s.append(sh.to(torch.int64))
        parts_sys.append(torch.full((len(i),), b, dtype=torch.int64, device=device))
    if not parts_i:
        return _no_edges(device, dtype)
    i, j, system, ishift = (
        torch.cat(parts_i),
        torch.cat(parts_j),
        torch.cat(parts_sys),
        torch.cat(parts_s),
    )
    order = _canonical_order(i, j, ishift, len(pos_all))
    i, j, system, ishift = i[order], j[order], system[order], ishift[order]
    cart = torch.bmm(ishift.to(dtype).unsqueeze(1), cells[system]).squeeze(1)
    return i, j, cart, system, ishift


def _no_edges(device: torch.device, dtype: torch.dtype):
    empty = torch.zeros(0, dtype=torch.int64, device=device)
    return (
        empty,
        empty,
        torch.zeros((0, 3), dtype=dtype, device=device),
        empty,
        torch.zeros((0, 3), dtype=torch.int64, device=device),
    )


def _canonical_order(
    i: torch.Tensor, j: torch.Tensor, ishift: torch.Tensor, n: int
) -> torch.Tensor:
    """Permutation sorting edges by (i, j, shift): deterministic whatever the build order.

    One sort of a combined int64 key (i, j and the three integer shifts in mixed radix).
    """
    if len(i) == 0:
        return torch.zeros(0, dtype=torch.long, device=i.device)
    span = int(ishift.abs().max()) if ishift.numel() else 0
    base = 2 * span + 1
    if n * n * base**3 >= 2**62:  # astronomically large: fall back to chained stable sorts
        order = torch.arange(len(i), device=i.device)
        for key in (ishift[:, 2], ishift[:, 1], ishift[:, 0], j, i):
            order = order[torch.sort(key[order], stable=True).indices]
        return order
    s = ishift + span
    key = ((i * n + j) * base + s[:, 0]) * base * base + s[:, 1] * base + s[:, 2]
    return torch.sort(key).indices
