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
Warp), and handles triclinic cells and mixed periodicity.  Its weak spot is a periodic
cell narrower than twice the radius (the LJ benchmark's 15.8 Å cells at
rc + skin = 9.5 Å): one bin per axis, so it tests every pair against 27 images one by
one.  For such small systems :func:`build_rows` tests all pairs i <= j against the
needed images with a few vectorised torch operations instead, reproducing vesin's pairs,
orientation and arithmetic bit for bit (checked on fuzzed triclinic cells, unwrapped
positions and self-images); it picks per system whichever tests fewer candidate pairs.
Small non-periodic systems (molecules, up to ~50 atoms) likewise get their pairs from
one vectorised test (:func:`molecule_pairs`), which beats a vesin call's fixed cost
there; structure validation and edge budgets use it too.

Each vesin system's pairs are put in canonical order right after its call (in cache;
vesin 0.6 serialises calls, so a second thread only hides a sort or the small cells).
On CPU the skin check is read on the host at every call, which is free there.

**Accelerator path** (wherever host reads are not free: a GPU, or CPU with
``tensor_ops.CPU_READS_FREE = False``): one batched cell list builds every system at
once (:mod:`.cell_list`, vesin's edges to the bit, its operations independent of the
number of systems), the skin check is read one call late (:mod:`.skin_watch`), and a
due rebuild rebuilds every system, so that a steady call reads nothing on the host.
"""

from __future__ import annotations

from typing import Any

import torch

from ..core.geometry import all_pairs_suit, count_pairs, molecule_pairs
from ..core.state import Batch
from ..core.system_sums import cell_volume
from ..core.tensor_ops import host_reads_free, identity_key, may_be_set, row_dot, rows_times
from .device_path import DevicePath
from .edges import Edges
from .pair_search import (
    batch_pair_counts,
    build_rows,
    canonical_order,
    flat3,
    keep_edge_temporaries_on_heap,
)

#: (the pair search moved to geometry, pair_search and small_cells; importable from here)
__all__ = [
    "Edges", "NeighborList", "all_pairs_suit", "batch_pair_counts", "count_pairs",
    "molecule_pairs",
]  # fmt: skip


class NeighborList(DevicePath):
    """Verlet neighbour list over a :class:`~alchemi_lit.core.state.Batch` (see module doc)."""

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
        self._init_device_path()

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
            reference = rows_times(reference, strain.index_select(0, batch.system_idx))
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
            & (cell_volume(ref) > 1e-12)
            & (cell_volume(cell) > 1e-12)
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
        if host_reads_free(batch.positions):
            self._update_exactly(batch)
        elif self.in_graph:
            self._update_in_graph(batch)
        else:
            self._update_lazily(batch)
        pos = batch.positions  # index_select and in-place ops: pos[j] - pos[i] is slower on CPU
        vec = pos.index_select(0, self._j).sub_(pos.index_select(0, self._i)).add_(self._shift)
        return Edges(
            self._i, self._j, vec, self._system, self.cutoff, *self._aids
        )

    def _update_exactly(self, batch: Batch) -> None:
        """Rebuild the systems that need it, read on the host at once (where it is free)."""
        if self._lazy:  # the accelerator's path kept the list so far: start over
            self._init_device_path()
            self.reset()
        need = self.needs_rebuild(batch)
        moved_cell = need.new_zeros(())
        if self._shift_cell is not None and self._layout is batch.layout:
            moved_cell = ((batch.cell != self._shift_cell).flatten(1).any(1) & ~need).any()
        rebuild, reshift = torch.stack([need.any(), moved_cell]).tolist()  # the one host read
        if rebuild:
            self._rebuild(batch, need)
        if reshift:
            self._reshift(batch)

    def _reshift(self, batch: Batch) -> None:
        """Cartesian shifts of the kept edges in the current cells, computed as a build
        computes them (``rows_times`` of the integer shift and the cell, bit for bit)."""
        cell = batch.cell.detach()
        self._shift = rows_times(self._ishift.to(cell.dtype), cell.index_select(0, self._system))
        self._shift_cell = cell.clone()
        self._shift_key = identity_key((batch.cell,))

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
        # one index of the kept edges, then gathers (a boolean mask per tensor would
        # search the mask again for each tensor)
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
        self._remap_device_path(new_batch, old_rows, kept, atom_keep, new_atom_index)
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
        new = build_rows(batch, rows.tolist(), self.cutoff + self.skin)  # canonical order
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
            keep_edge_temporaries_on_heap(len(self._i))

    def _splice(self, batch: Batch, need: torch.Tensor, rows: list[int], new: tuple) -> None:
        """Replace the edge segments of systems ``rows`` by their new edges.

        Edges are grouped by system (sorted by i), so the new list is the old one cut at
        the rebuilt systems' segments with their new, canonically sorted segments put
        in: one copy of the list instead of a re-sort (a partial rebuild in MD touches a
        few systems at a time, and re-sorting every edge for them dominated the rebuild).
        The result is exactly the canonical order a full sort would give.
        """
        i, j, shift, system, ishift = new  # already in canonical order (see build_rows)
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
            self._aids = (atom_counts, system_counts, merge(j_flat, flat3(j), 3))
        else:
            self._set_aids(batch)

    def _sort(self, num_atoms: int) -> None:
        order = canonical_order(self._i, self._j, self._ishift, num_atoms)
        self._i, self._j, self._system = self._i[order], self._j[order], self._system[order]
        self._shift, self._ishift = self._shift[order], self._ishift[order]

    def _set_aids(self, batch: Batch) -> None:
        """Reduction aids of :class:`Edges` (CPU; edges are sorted by i here).  On an
        accelerator's path none: its reductions are index_add (a bincount with
        ``minlength`` sizes its output from a value it reads)."""
        if not host_reads_free(batch.positions):
            self._aids = (None, None, None)
            return
        atom_counts = torch.bincount(self._i, minlength=batch.num_atoms)
        system_counts = torch.bincount(self._system, minlength=batch.num_systems)
        self._aids = (atom_counts, system_counts, flat3(self._j))
