"""Batched periodic Verlet neighbour list.

Pairs come from `vesin <https://github.com/Luthaf/vesin>`_, a maintained cell-list
library (linear in atoms, triclinic cells, mixed periodicity, CPU and CUDA).  We
call it per system and add what a batched MD engine needs on top:

* **Verlet skin.**  The list holds pairs within ``cutoff + skin``; a system is
  rebuilt only when one of its atoms moved more than ``skin / 2`` since its last
  build, or its cell changed.  Only those systems are rebuilt.
* **Canonical order.**  Edges are sorted by (i, j, shift) after every rebuild, so
  force sums add in the same order whatever the rebuild history.  Edges between
  cutoff and cutoff+skin contribute exact zeros, which leaves float sums unchanged:
  a resumed run reproduces an uninterrupted one bit for bit.

Why vesin rather than our own torch cell list: on the 64 x 108-atom argon benchmark
(rc 8.5 Å + 1 Å skin) it builds all 64 lists in ~0.1 s on 2 CPU cores, and with a
skin the list is rebuilt every few tens of MD steps, so the build is a small share
of the step; it handles small triclinic cells where an atom sees its own images.
The rebuild check costs one host-device sync per model call (deciding to rebuild
is a host decision); everything else stays on the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..segments import ones_rows
from ..state import Batch
from ..tensor_ops import row_dot


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
        disp2 = row_dot(batch.positions - self._ref_positions)
        max_disp2 = torch.zeros(batch.num_systems, dtype=disp2.dtype, device=disp2.device)
        max_disp2 = max_disp2.scatter_reduce(0, batch.system_idx, disp2, "amax", include_self=True)
        moved = max_disp2 > (0.5 * self.skin) ** 2
        reshaped = (batch.cell != self._ref_cell).flatten(1).any(1)  # NaN marks "never built"
        return moved | reshaped | ~torch.isfinite(max_disp2)

    def __call__(self, batch: Batch) -> Edges:
        need = self.needs_rebuild(batch)
        if bool(need.any()):  # the one host sync of a model call
            self._rebuild(batch, need)
        pos = batch.positions  # index_select + in-place: ~2x faster than pos[j] - pos[i]
        vec = pos.index_select(0, self._j).sub_(pos.index_select(0, self._i)).add_(self._shift)
        return Edges(
            self._i, self._j, vec, self._system, self.cutoff, *self._aids, *self._rows(vec.dtype)
        )

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
        edge_keep = row_new[self._system] >= 0
        sys_e = self._system[edge_keep]
        self._i = self._i[edge_keep] + offset[sys_e]
        self._j = self._j[edge_keep] + offset[sys_e]
        self._shift = self._shift[edge_keep]
        self._ishift = self._ishift[edge_keep]
        self._system = row_new[sys_e]
        nan = float("nan")
        ref_pos = torch.full_like(new_batch.positions, nan)
        ref_cell = torch.full_like(new_batch.cell, nan)
        old_atom_rows = torch.repeat_interleave(
            torch.arange(n_old, device=device), old_ptr[1:] - old_ptr[:-1]
        )
        atom_keep = row_new[old_atom_rows] >= 0
        new_atom_index = torch.arange(len(old_atom_rows), device=device) + offset[old_atom_rows]
        ref_pos[new_atom_index[atom_keep]] = self._ref_positions[atom_keep]
        ref_cell[kept] = self._ref_cell[old_rows[kept]]
        self._ref_positions, self._ref_cell = ref_pos, ref_cell
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
        new = _build_rows(batch, rows.tolist(), self.cutoff + self.skin)
        if full:
            self._i, self._j, self._shift, self._system, self._ishift = new
            self._sort(batch.num_atoms)
            self._ref_positions = batch.positions.detach().clone()
            self._ref_cell = batch.cell.detach().clone()
            self._layout = batch.layout
            self._set_aids(batch)
        else:
            self._splice(batch, need, rows.tolist(), new)
            amask = need.index_select(0, batch.system_idx)
            self._ref_positions[amask] = batch.positions.detach()[amask]
            self._ref_cell[need] = batch.cell.detach()[need]
        self.num_builds += len(rows)

    def _splice(self, batch: Batch, need: torch.Tensor, rows: list[int], new: tuple) -> None:
        """Replace the edge segments of systems ``rows`` by their new edges.

        Edges are grouped by system (sorted by i), so the new list is the old one cut at
        the rebuilt systems' segments with their new, canonically sorted segments put
        in: one copy of the list instead of a re-sort (a partial rebuild in MD touches a
        few systems at a time; re-sorting all edges made it 10x dearer).  The result is
        exactly the canonical order a full sort would give.
        """
        i, j, shift, system, ishift = new
        order = _canonical_order(i, j, ishift, batch.num_atoms)
        i, j, shift, system, ishift = i[order], j[order], shift[order], system[order], ishift[order]
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


def _flat3(j: torch.Tensor) -> torch.Tensor:
    """Flat indices ``3 j + (0, 1, 2)`` of the xyz components of atoms ``j``."""
    return ((3 * j).unsqueeze(-1) + torch.arange(3, device=j.device)).reshape(-1)


def count_pairs(positions: Any, cell: Any, pbc: Any, radius: float) -> int:
    """Neighbour pairs (half list) of one system within ``radius`` (edge budgets)."""
    import vesin

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
    """Pairs of the given system rows: (i, j, cartesian shift, system row)."""
    device, dtype = batch.device, batch.dtype
    if device.type != "cpu":
        return _build_rows_on_device(batch, rows, radius)
    ptr = batch.ptr.tolist()
    cells = batch.cell.detach()
    pbcs = batch.pbc.tolist()
    import vesin

    # one thread: vesin's thread pool costs more than it saves on batch-sized systems
    calc = vesin.NeighborList(cutoff=radius, full_list=False, n_threads=1)
    pos_np = batch.positions.detach().to(torch.float64).numpy()
    cell_np = cells.to(torch.float64).numpy()
    ii, jj, ss, sys_ = [], [], [], []
    for b in rows:
        lo, hi = ptr[b], ptr[b + 1]
        if not np.isfinite(pos_np[lo:hi]).all():
            continue  # a diverged system gets no edges; NaNGuard quarantines it
        i, j, sh = calc.compute(pos_np[lo:hi], cell_np[b], pbcs[b], "ijS")
        ii.append(i.astype(np.int64) + lo)
        jj.append(j.astype(np.int64) + lo)
        ss.append(sh)
        sys_.append(np.full(len(i), b, dtype=np.int64))
    if not ii:
        return _no_edges(device, dtype)
    system = torch.from_numpy(np.concatenate(sys_))
    ishift = torch.from_numpy(np.concatenate(ss).astype(np.int64))
    cart = torch.bmm(ishift.to(dtype).unsqueeze(1), cells[system]).squeeze(1)
    i_all = torch.from_numpy(np.concatenate(ii))
    return i_all, torch.from_numpy(np.concatenate(jj)), cart, system, ishift


def _build_rows_on_device(batch: Batch, rows: list[int], radius: float):
    """:func:`_build_rows` with ``vesin-torch``, on the batch's own device (GPU path;
    it runs on CPU tensors too, which is how the tests check it against the CPU path)."""
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
    system = torch.cat(parts_sys)
    ishift = torch.cat(parts_s)
    cart = torch.bmm(ishift.to(dtype).unsqueeze(1), cells[system]).squeeze(1)
    return torch.cat(parts_i), torch.cat(parts_j), cart, system, ishift


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
