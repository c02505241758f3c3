"""Datasets of ASE's random-access formats: trajectories, databases (SQLite, JSON, LMDB),
and a per-file fallback for the formats ASE reads only whole.

Each keeps what locates a frame (a trajectory's own index, a database's row ids) and
opens its file on first access, so a dataset pickles (a launcher may send it to rank
processes) and holds no frames.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import StructureError
from .datasets import StructureDataset


class TrajDataset(StructureDataset):
    """The frames of an ASE trajectory (``.traj``), read through ``ase.io.Trajectory``,
    which seeks to frame ``k`` by the offsets the file keeps."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._traj: Any = None
        self._len = len(self._open())

    def _open(self) -> Any:
        if self._traj is None:
            from ase.io.trajectory import Trajectory

            try:
                self._traj = Trajectory(str(self.path), "r")
            except Exception as exc:
                raise StructureError(
                    f"could not read {self.name()} as an ASE trajectory ({type(exc).__name__}: "
                    f"{exc}); check the file"
                ) from exc
        return self._traj

    def __len__(self) -> int:
        return self._len

    def _read(self, k: int) -> Any:
        return self._open()[k]

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_traj": None}


class AseDbDataset(StructureDataset):
    """The rows of an ASE database, in row-id order: SQLite (``.db``), JSON, or ASE LMDB
    (``.aselmdb``, the format of fairchem's datasets, through the ``ase-db-backends``
    package).  ``[k]`` is ``row.toatoms()`` (what ``ase.io.read`` gives) with the row's
    key-value pairs added to ``info`` (e.g. a ``path_id`` naming a band).  Only the row
    ids are kept (8 bytes a row), except for JSON, which ASE reads whole on every access:
    its rows are read once and kept (a JSON database is no campaign format)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():  # (ase.db.connect would create an empty database)
            raise StructureError(f"database {str(self.path)!r} does not exist; check the path")
        self._db: Any = None
        self._rows: dict[int, Any] | None = None
        db = self._open()
        ids = getattr(db, "ids", None)  # (the LMDB backend keeps its ids)
        if ids is None:
            ids = (row.id for row in db.select(include_data=False, columns=["id"]))
        self.ids = np.fromiter(ids, dtype=np.int64)
        if len(self.ids) == 0:
            raise StructureError(f"{self.name()} contains no structures")

    def _open(self) -> Any:
        if self._db is None:
            self._db = _connect(self.path)
        return self._db

    def __len__(self) -> int:
        return len(self.ids)

    def _read(self, k: int) -> Any:
        if self.path.suffix == ".json":  # ASE's JSON backend re-reads the file per row
            if self._rows is None:  # (and holds it whole anyway): its rows, read once
                self._rows = {row.id: row for row in self._open().select()}
            row = self._rows[int(self.ids[k])]
        else:
            row = self._open().get(id=int(self.ids[k]))
        atoms = row.toatoms()
        for key, value in row.key_value_pairs.items():
            atoms.info.setdefault(key, value)
        return atoms

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_db": None, "_rows": None}


class FileFramesDataset(StructureDataset):
    """The frames of a file in a format ASE reads only whole or forwards (CIF, POSCAR,
    OUTCAR, ...): counted in one pass at construction, then read whole on first access
    and kept for the next (the memory of one file, never of a folder of them).
    ``check`` runs on every frame as it is read (e.g. the partial-occupancy policy)."""

    def __init__(self, path: str | Path, format: str | None = None, check: Any = None) -> None:
        self.path = Path(path)
        self.format = format
        self.check = check
        self._frames: list[Any] | None = None
        self._len = len(self._load(keep=False))

    def _load(self, keep: bool = True) -> list[Any]:
        if self._frames is not None:
            return self._frames
        from .io import _read_file

        frames = _read_file(self.path, ":", self.format)
        if self.check is not None:
            for k, atoms in enumerate(frames):
                self.check(atoms, k)
        if keep:
            self._frames = frames
        return frames

    def __len__(self) -> int:
        return self._len

    def _read(self, k: int) -> Any:
        return copy.deepcopy(self._load()[k])  # (a caller may change what it gets)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_frames": None}


#: open LMDB environments by (path, process): LMDB allows one per file and process, so
#: copies of a dataset (pickled to the same process) share it
_LMDB: dict[tuple[str, int], Any] = {}


def _connect(path: Path) -> Any:
    """``ase.db.connect`` of an existing database, read-only where the backend can be."""
    import importlib.util
    import os

    import ase.db

    lmdb = path.suffix == ".aselmdb"
    key = (str(path.resolve()), os.getpid())
    if lmdb and key in _LMDB:
        return _LMDB[key]
    try:
        if lmdb:
            db = _LMDB[key] = ase.db.connect(str(path), type="aselmdb", readonly=True)
        else:
            db = ase.db.connect(str(path))
    except Exception as exc:
        missing = lmdb and importlib.util.find_spec("ase_db_backends") is None
        hint = " (ASE LMDB needs the ase-db-backends package)" if missing else ""
        raise StructureError(
            f"could not open {str(path)!r} as an ASE database ({type(exc).__name__}: {exc}){hint}"
        ) from exc
    return db
