"""A results store (ZarrSink) read by system: the final states of an earlier run as a
dataset, without reading the store whole."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import StructureError
from .datasets import StructureDataset

#: rows read together: a store's chunks hold many rows, and a sampler reads in order
BLOCK_ROWS = 512


class StoreDataset(StructureDataset):
    """The committed systems of an alchemi_lit results store, one ``ase.Atoms`` each, in
    ``system_id`` order; each carries its ``info["system_id"]`` (kept as the system's id
    by a new run) and ``info["steps"]`` (from which it counts on), as
    :func:`~alchemi_lit.data.read_structures` gives them (``index`` selects alike).

    Only the system ids and their row order are kept; rows are read ``BLOCK_ROWS`` at
    a time and the last ``KEPT_BLOCKS`` blocks are kept (a store's rows follow its
    systems' graduation, close to id order, so reading in id order stays in them)."""

    #: blocks of rows kept between accesses
    KEPT_BLOCKS = 4

    def __init__(self, path: str | Path) -> None:
        from ..io.results_store import stored_system_ids

        self.path = Path(path)
        check_results_store(self.path)
        self.system_ids = stored_system_ids(self.path)
        if len(self.system_ids) == 0:
            raise StructureError(f"{self.name()} contains no structures (no committed system)")
        if len(np.unique(self.system_ids)) != len(self.system_ids):
            raise StructureError(
                f"results store {self.name()} holds some system_id(s) more than once (runs "
                f"that appended to it numbered their systems alike); read one run at a time "
                f"with read_results(path, run=k) and pass those structures"
            )
        self.rows = np.argsort(self.system_ids, kind="stable")  # dataset position -> row
        self._blocks: dict[int, list[Any]] = {}  # (insertion order: oldest first)

    def __len__(self) -> int:
        return len(self.system_ids)

    def _read(self, k: int) -> Any:
        import copy

        row = int(self.rows[k])
        b = row // BLOCK_ROWS
        if b not in self._blocks:
            if len(self._blocks) >= self.KEPT_BLOCKS:
                del self._blocks[next(iter(self._blocks))]
            self._blocks[b] = self._read_rows(b * BLOCK_ROWS, min((b + 1) * BLOCK_ROWS, len(self)))
        return copy.deepcopy(self._blocks[b][row - b * BLOCK_ROWS])

    def _read_rows(self, lo: int, hi: int) -> list[Any]:
        """Rows ``[lo, hi)`` as ``ase.Atoms``, in row order (the store reader's rows)."""
        from ..io.results_store import open_store
        from ..io.store_reader import read_rows

        ids = self.system_ids[lo:hi].tolist()
        atoms = read_rows(open_store(self.path), lo, hi).to_atoms()  # (in system_id order)
        by_id = {a.info["system_id"]: a for a in atoms}
        return [by_id[sid] for sid in ids]

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_blocks": {}}


def check_results_store(path: Path) -> None:
    """``path`` is an alchemi_lit results store, or an error saying what it is instead."""
    import zarr

    from ..io.results_store import SCHEMA
    from ..io.trajectory_store import FORMAT as TRAJECTORY

    attrs = zarr.open_group(str(path), mode="r").attrs
    if attrs.get("schema") != SCHEMA:
        what = "a trajectory store" if attrs.get("format") == TRAJECTORY else "a zarr store"
        raise StructureError(
            f"{str(path)!r} is {what}, not an alchemi_lit results store (ZarrSink); read "
            f"structures from a results store or a file ASE reads (a trajectory's frames: "
            f"alchemi_lit.callbacks.read_trajectory)"
        )
