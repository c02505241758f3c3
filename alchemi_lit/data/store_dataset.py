"""A results store (ZarrSink) read by system: the final states of an earlier run as a
dataset, without reading the store whole."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

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
        from ..io.results_store import open_store, stored_system_ids

        self.path = Path(path)
        check_results_store(self.path)
        group = open_store(self.path)
        self.system_ids = stored_system_ids(self.path)
        if len(self.system_ids) == 0:
            raise StructureError(f"{self.name()} contains no structures (no committed system)")
        if len(np.unique(self.system_ids)) != len(self.system_ids):
            raise StructureError(
                f"results store {self.name()} holds some system_id(s) more than once (runs "
                f"that appended to it numbered their systems alike); read one run at a time "
                f"with read_results(path, run=k) and pass those structures"
            )
        self._errors = {int(k): v for k, v in dict(group.attrs.get("errors", {})).items()}
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
        """Rows ``[lo, hi)`` as ``ase.Atoms``, in row order."""
        from ..core.info_codec import info_from_json
        from ..core.state import MODEL_ERROR_KEY, Batch
        from ..io.results_store import ATOM_COLUMNS, SYSTEM_COLUMNS, open_store

        group = open_store(self.path)
        system = {
            c: torch.from_numpy(np.asarray(group[f"systems/{c}"][lo:hi]))
            for c in SYSTEM_COLUMNS
            if f"systems/{c}" in group
        }
        offsets = np.asarray(group["systems/atom_offset"][lo:hi])
        counts = system["n_atoms"].numpy()
        first, end = int(offsets.min()), int((offsets + counts).max())
        atom = {c: np.asarray(group[f"atoms/{c}"][first:end]) for c in ATOM_COLUMNS}
        index = np.concatenate([np.arange(o, o + c) for o, c in zip(offsets - first, counts)])
        atom_t = {c: torch.from_numpy(v[index]) for c, v in atom.items()}
        atom_t["system_idx"] = torch.repeat_interleave(torch.arange(hi - lo), system["n_atoms"])
        ids = self.system_ids[lo:hi].tolist()
        info: dict[int, dict[str, Any]] = {}
        if "systems/info" in group:
            for sid, text in zip(ids, np.asarray(group["systems/info"][lo:hi]).tolist()):
                if text:
                    info[int(sid)] = info_from_json(str(text))
        for sid in ids:
            if sid in self._errors:
                info.setdefault(sid, {}).setdefault(MODEL_ERROR_KEY, self._errors[sid])
        by_id = {a.info["system_id"]: a for a in Batch(atom_t, system, info).to_atoms()}
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
