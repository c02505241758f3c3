"""``open_dataset``: the lazily read dataset of a path (file, folder, pattern or store)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from ..core.errors import ConfigError, StructureError
from .ase_datasets import AseDbDataset, FileFramesDataset, TrajDataset
from .datasets import ConcatDataset, StructureDataset, select
from .extxyz_dataset import ExtxyzDataset
from .io import Occupancy, _files_of, _ordered, check_format
from .store_dataset import StoreDataset

#: ASE format names each random-access dataset reads
XYZ_FORMATS = ("extxyz", "xyz")
DATABASE_FORMATS = ("db", "json", "aselmdb")


def open_dataset(
    path: str | Path,
    index: str | int | slice = ":",
    format: str | None = None,
    partial_occupancy: Occupancy = "error",
) -> StructureDataset:
    """The structures :func:`~alchemi_lit.data.read_structures` reads from ``path``, as a
    dataset read on access (:mod:`.datasets`): extxyz/xyz by frame offsets, ASE
    trajectories, ASE databases (SQLite, JSON, LMDB ``.aselmdb``) by row, results stores
    by system, and other formats (CIF, POSCAR, ...) one file at a time.  A folder or glob
    pattern chains its files (each frame's ``info["source_file"]`` names its file);
    ``index`` selects frames within each file, with ASE's syntax."""
    if partial_occupancy not in ("error", "majority"):
        raise ConfigError(
            f"partial_occupancy must be 'error' (refuse partially occupied sites) or "
            f"'majority' (take each site's majority species), got {partial_occupancy!r}"
        )
    if format not in DATABASE_FORMATS:  # ("aselmdb" is no format of ase.io)
        check_format(format)
    files = _files_of(path)
    if files is not None:
        parts = []
        for f in files:
            try:
                parts.append(open_dataset(f, index, format, partial_occupancy))
            except StructureError as exc:
                p = Path(path)
                if p.is_dir() and "partially occupied" not in str(exc):
                    raise StructureError(
                        f"{exc}; or read only the structure files of {str(p)!r} with a "
                        f"pattern such as '{p / '*.cif'}'"
                    ) from exc
                raise
        return ConcatDataset(parts)
    p = Path(path)
    if not p.exists():
        raise StructureError(f"structure file {str(p)!r} does not exist; check the path")
    if (p / "zarr.json").is_file():
        return select(StoreDataset(p), index)
    if p.is_file() and p.stat().st_size == 0:
        raise StructureError(
            f"{str(p)!r} is an empty file: it contains no structures; check the file"
        )
    return select(_file_dataset(p, format, partial_occupancy), index)


def _file_dataset(p: Path, format: str | None, policy: Occupancy) -> StructureDataset:
    """The dataset of one structure file, by its format (given, or ASE's guess)."""
    kind = format or _guess(p)
    if kind in XYZ_FORMATS:
        return ExtxyzDataset(p, kind)
    if kind == "traj":
        return TrajDataset(p)
    if kind in DATABASE_FORMATS:
        return AseDbDataset(p)
    return FileFramesDataset(p, format, functools.partial(_check_occupancy, p, policy))


def _check_occupancy(p: Path, policy: Occupancy, atoms: Any, k: int) -> None:
    """The partial-occupancy policy on frame ``k`` of ``p`` (a module-level function, so
    a dataset pickles)."""
    _ordered(atoms, f"{str(p)!r} (structure {k})", policy, p, k)


def _guess(p: Path) -> str | None:
    """ASE's format guess for ``p`` (None: let ASE's reader guess when it reads)."""
    if p.suffix == ".aselmdb":  # (ASE guesses "db", its SQLite reader)
        return "aselmdb"
    from ase.io.formats import filetype

    try:
        return filetype(str(p))
    except Exception:  # unknown or unreadable: the reader names the problem
        return None
