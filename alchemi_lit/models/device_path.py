"""The accelerator path of :class:`~.neighbors.NeighborList`: no host read in a steady call.

Taken wherever reading a value on the host is not free (a GPU, or CPU with
``tensor_ops.CPU_READS_FREE = False``).  The skin check is read one call late (:mod:`.skin_watch`);
a due rebuild rebuilds every system in one batched pass (:mod:`.cell_list`), which reads sizes on
the host, and rebuilding all at once makes rebuilds as rare as the fastest system allows instead of
one whenever any system needs one.  Whether the cell changed is told by the cell tensor's identity
and version, not by its values (no read).  A mixin: the state is the list's own
(docs/design/15-neighbour-lists-on-an-accelerator-one-batched.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..core.state import Batch
from ..core.tensor_ops import identity_key, same_key
from .cell_list import batched_pairs
from .pair_search import keep_edge_temporaries_on_heap
from .skin_watch import SkinWatch


class DevicePath:
    """:class:`~.neighbors.NeighborList`'s rebuilds where host reads are not free."""

    cutoff: float
    skin: float
    num_builds: int
    _layout: object | None
    _i: Any
    _j: Any
    _shift: Any
    _system: Any
    _ishift: Any
    _ref_positions: Any
    _ref_cell: Any
    _shift_cell: Any
    _set_aids: Callable[[Batch], None]  # (NeighborList's methods)
    _reshift: Callable[[Batch], None]

    def _init_device_path(self) -> None:
        self.skin_watch = SkinWatch(self.cutoff, self.skin)
        self._lazy = False  # whether the list was last kept by this path
        self._built_ok: torch.Tensor | None = None  # systems built with finite positions
        self._fresh_rows: torch.Tensor | None = None  # systems that joined in a refill
        self._ref_cell_key: list[Any] | None = None  # identity of the cell built in
        self._shift_key: list[Any] | None = None  # identity of the cell the shifts are in
        self.in_graph = False  # set while a CUDA graph captures a call (engine.cuda_graph)

    def _update_lazily(self, batch: Batch) -> None:
        """Keep the list for ``batch``: build it where it is new, build the systems that
        joined, rebuild every system when the late skin check says so."""
        if self._layout is not batch.layout or self._i is None or not self._lazy:
            self._build_batched(batch, None)
            self.skin_watch.forget(built=True)
        else:
            if self._fresh_rows is not None:  # systems that joined in a refill
                self._build_batched(batch, self._fresh_rows)
            rebuild = self.skin_watch.must_rebuild(*self._skin_inputs(batch))
            if rebuild:
                self._build_batched(batch, None)
            self.skin_watch.publish(rebuild)
        self._reshift_if_moved(batch)

    def _skin_inputs(self, batch: Batch) -> tuple[Any, ...]:
        """What the skin check measures: positions, system index, number of systems,
        the build's positions, the cells' deformation since the build (None where the
        cell is the one built in, told by identity) and the systems built finite."""
        strain = None
        if not same_key(identity_key((batch.cell,)), self._ref_cell_key or []):
            strain = self.skin_watch.strain(self._ref_cell, batch.cell)
        return (
            batch.positions, batch.system_idx, batch.num_systems,
            self._ref_positions, strain, self._built_ok,
        )  # fmt: skip

    def _reshift_if_moved(self, batch: Batch) -> None:
        if not same_key(identity_key((batch.cell,)), self._shift_key or []):
            self._reshift(batch)  # (on the device; the cell changed, or may have)

    def forget_derived(self) -> None:
        """Drop what is derived from the list and kept (the reference cells' inverses,
        the shifts' cell, the edge rows): recomputed at the next call (after a CUDA
        graph capture that failed, whose values were never filled in)."""
        self.skin_watch.forget_inverse()
        self._shift_key = None

    def ready_for_graph(self, batch: Batch) -> bool:
        """Whether the next call can be captured: the list is built for this batch by
        this path, no system waits for its build, and the skin check has a history
        (its state is then made static, :meth:`SkinWatch.prepare_graph`)."""
        steady = self._layout is batch.layout and self._i is not None and self._lazy
        if not steady or self._fresh_rows is not None:
            return False
        return self.skin_watch.prepare_graph(batch.num_atoms, batch.num_systems, batch.positions)

    def _update_in_graph(self, batch: Batch) -> None:
        """A captured call: the list as it is, its skin measured on the device for the
        replayer to read one replay late (the shifts recomputed where the cell may have
        changed, as in :meth:`_update_lazily`)."""
        self.skin_watch.measure_in_graph(*self._skin_inputs(batch))
        self._reshift_if_moved(batch)

    def _build_batched(self, batch: Batch, rows: torch.Tensor | None) -> None:
        """Build every system (``rows`` None) or the systems ``rows`` ``[B]``, merged into
        the kept list, in one batched pass on the batch's device (reads sizes only)."""
        new = batched_pairs(batch, self.cutoff + self.skin, rows)
        pos, cell = batch.positions.detach(), batch.cell.detach()
        ok = torch.ones(batch.num_systems, dtype=torch.int64, device=batch.device)
        finite = torch.isfinite(pos).all(1).to(torch.int64)
        ok = ok.scatter_reduce(0, batch.system_idx, finite, "amin", include_self=True).bool()
        if rows is None:
            self._i, self._j, self._shift, self._system, self._ishift = new
            self._ref_positions, self._ref_cell = pos.clone(), cell.clone()
            self._shift_cell, self._built_ok = cell.clone(), ok
            self._ref_cell_key = self._shift_key = identity_key((batch.cell,))
            self.num_builds += batch.num_systems
        else:  # each system's edges come from one side: a stable sort by system merges them
            keep = (~rows).index_select(0, self._system).nonzero().squeeze(1)
            olds = (self._i, self._j, self._shift, self._system, self._ishift)
            merged = [torch.cat([o.index_select(0, keep), n]) for o, n in zip(olds, new)]
            order = torch.sort(merged[3], stable=True).indices
            self._i, self._j, self._shift, self._system, self._ishift = (
                m.index_select(0, order) for m in merged
            )
            atom_rows = rows.index_select(0, batch.system_idx).unsqueeze(1)
            self._ref_positions = torch.where(atom_rows, pos, self._ref_positions)
            self._ref_cell = torch.where(rows[:, None, None], cell, self._ref_cell)
            self._shift_cell = torch.where(rows[:, None, None], cell, self._shift_cell)
            self._built_ok = torch.where(rows, ok, self._built_ok)
            same = bool((self._ref_cell == cell).all())  # (a rebuild's read)
            self._ref_cell_key = identity_key((batch.cell,)) if same else None
            self._shift_key = None  # (the kept systems' shifts: recomputed in this cell)
            self.num_builds += int(rows.sum())
        self._fresh_rows = None
        self._layout = batch.layout
        self._lazy = True
        self._set_aids(batch)
        if batch.device.type == "cpu":
            keep_edge_temporaries_on_heap(len(self._i))

    def _remap_device_path(
        self,
        new_batch: Batch,
        old_rows: torch.Tensor,
        kept: torch.Tensor,
        atom_keep: torch.Tensor,
        new_atom_index: torch.Tensor,
    ) -> None:
        """``NeighborList.remap``'s part for this path (at a bookkeeping: reads are fine).
        Systems that joined are built at the next call; the kept ones keep their history,
        and their cells' identity where their values did not change."""
        self._fresh_rows = None if bool(kept.all()) else ~kept
        if self._built_ok is not None:
            built_ok = torch.ones(new_batch.num_systems, dtype=torch.bool, device=kept.device)
            built_ok[kept] = self._built_ok[old_rows[kept]]
            self._built_ok = built_ok
        key = identity_key((new_batch.cell,))
        cell = new_batch.cell.detach()
        same_ref = bool((self._ref_cell == cell)[kept].all())
        same_shift = bool((self._shift_cell == cell)[kept].all())
        self._ref_cell_key = key if same_ref else None
        self._shift_key = key if same_shift else None
        self.skin_watch.remap(atom_keep, new_atom_index, new_batch.num_atoms, old_rows, kept)
