"""Structure datasets that read lazily: ``len()`` and ``[k]`` without holding the frames.

A campaign file of millions of structures must not become a list of millions of
``ase.Atoms`` (about 2 kB each) before anything runs.  A dataset keeps what locates a
frame -- byte offsets (extxyz), row ids (ASE databases, LMDB) or row numbers (results
stores) -- and parses a frame when it is asked for it, so its memory does not grow with
the number of structures.  :func:`open_dataset` picks the dataset for a path;
:class:`Subset` selects frames by index (``":"``, ``"0:10"``, ``"::2"``) and
:meth:`StructureDataset.shard` a deterministic slice of them, without reading any.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import ConfigError, StructureError


class StructureDataset(Sequence[Any]):
    """A read-only sequence of ``ase.Atoms`` read on access (subclasses: :meth:`_read`).

    ``dataset[k]`` parses frame ``k`` anew each time (a new ``ase.Atoms`` the caller
    may change); negative indices count from the end; a slice gives a :class:`Subset`.
    """

    #: the file or store read (None for a dataset made of others)
    path: Path | None = None

    @abstractmethod
    def __len__(self) -> int:
        """How many structures the dataset holds."""

    @abstractmethod
    def _read(self, k: int) -> Any:
        """Frame ``k`` (``0 <= k < len(self)``) as a new ``ase.Atoms``."""

    def __getitem__(self, k: Any) -> Any:  # type: ignore[override]
        if isinstance(k, slice):
            return Subset(self, range(len(self))[k])
        if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)):
            raise TypeError(f"{type(self).__name__} indices are integers or slices, not {k!r}")
        n = len(self)
        if not -n <= int(k) < n:
            raise IndexError(f"structure {int(k)} of {self.name()}: it holds {n}")
        return self._read(int(k) % n)

    def __iter__(self) -> Iterator[Any]:
        for k in range(len(self)):
            yield self._read(k)

    def chunks(self, size: int) -> Iterator[tuple[int, list[Any]]]:
        """``(first_index, frames)`` of consecutive frames, ``size`` at a time: a pass over
        the dataset that holds at most ``size`` frames."""
        for start in range(0, len(self), size):
            yield start, [self._read(k) for k in range(start, min(start + size, len(self)))]

    def name(self) -> str:
        """How errors name the dataset."""
        return repr(str(self.path)) if self.path is not None else type(self).__name__

    def shard(self, index: int, count: int) -> Subset:
        """Shard ``index`` of ``count``: the contiguous frames ``[index * n // count,
        (index + 1) * n // count)`` (see :func:`shard_range` for why contiguous)."""
        return Subset(self, shard_range(len(self), index, count))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name()}, {len(self)} structures)"


class Subset(StructureDataset):
    """Frames ``positions`` of ``base`` (a range or an integer array: no frame is read)."""

    def __init__(self, base: Sequence[Any], positions: range | Sequence[int] | np.ndarray):
        self.base = base
        self.positions = (
            positions if isinstance(positions, range) else np.asarray(positions, dtype=np.int64)
        )
        self.path = getattr(base, "path", None)

    def __len__(self) -> int:
        return len(self.positions)

    def _read(self, k: int) -> Any:
        return self.base[int(self.positions[k])]

    def base_index(self, k: int) -> int:
        """The position in ``base`` of frame ``k``."""
        return int(self.positions[k])


class ConcatDataset(StructureDataset):
    """Datasets one after another (the files of a folder or glob pattern); each frame's
    ``info["source_file"]`` names the file it came from, as :func:`read_structures` does."""

    def __init__(self, parts: Sequence[StructureDataset]) -> None:
        self.parts = list(parts)
        self.ends = np.cumsum([len(p) for p in self.parts], dtype=np.int64)

    def __len__(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0

    def _read(self, k: int) -> Any:
        j = int(np.searchsorted(self.ends, k, side="right"))
        start = int(self.ends[j - 1]) if j else 0
        atoms = self.parts[j][k - start]
        atoms.info.setdefault("source_file", str(self.parts[j].path))
        return atoms


def shard_range(n: int, index: int, count: int) -> range:
    """Positions of shard ``index`` of ``count`` of ``n`` structures: contiguous and
    balanced to one structure (``[index * n // count, (index + 1) * n // count)``).

    Contiguous rather than strided: a shard reads one run of a file (sequential I/O,
    one block of a store's rows), its store's row order follows the input's, and the
    images of a nudged elastic band (consecutive structures) stay together except at a
    boundary, where the sampler names the split band."""
    check_shard(index, count)
    return range(index * n // count, (index + 1) * n // count)


def check_shard(index: Any, count: Any) -> None:
    """``0 <= index < count``, both integers, or a :class:`ConfigError` naming the fix."""
    for what, v in (("index", index), ("count", count)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise ConfigError(f"shard {what} must be an integer, got {v!r}")
    if count < 1:
        raise ConfigError(f"shard count must be >= 1, got {count}")
    if not 0 <= index < count:
        raise ConfigError(
            f"shard index must be in 0..{count - 1} for {count} shard(s), got {index}; "
            f"shards are numbered from 0 (a SLURM array: --array=0-{count - 1})"
        )


def parse_shard(spec: str) -> tuple[int, int]:
    """``"i/n"`` -> ``(i, n)``, checked (:func:`check_shard`)."""
    text = str(spec).strip()
    head, sep, tail = text.partition("/")
    try:
        index, count = int(head), int(tail)
    except ValueError:
        index = count = None
    if not sep or index is None or count is None:
        raise ConfigError(
            f"--shard must be INDEX/COUNT, such as 0/4 (the first of four shards), got {spec!r}"
        )
    check_shard(index, count)
    return index, count


def select(dataset: StructureDataset, index: str | int | slice) -> StructureDataset:
    """``dataset[index]`` with ASE's index syntax (``":"``, ``-1``, ``"0:10"``) as a
    :class:`Subset`; an index that selects nothing is an error naming the dataset."""
    from ase.io.formats import string2index

    if index in (":", None):
        return dataset
    try:
        chosen = string2index(index) if isinstance(index, str) else index
        if isinstance(chosen, str):  # (ASE's database query string: no frame index)
            raise ValueError(chosen)
    except ValueError:
        raise StructureError(
            f"index {index!r} is not a valid frame index; use ':' (all frames), an integer "
            f"such as 0 or -1, or a slice such as '0:10'"
        ) from None
    try:
        if isinstance(chosen, slice):
            positions: range | list[int] = range(len(dataset))[chosen]
        else:
            n = len(dataset)
            if not -n <= int(chosen) < n:
                raise IndexError(f"index {chosen} out of range")
            positions = [int(chosen) % n]
    except (ValueError, IndexError, TypeError) as exc:
        raise StructureError(
            f"index {index!r} selects no structure of {dataset.name()} ({len(dataset)} "
            f"frames); use ':' for all frames, or an index/slice within the file's frames"
        ) from exc
    if len(positions) == 0:
        raise StructureError(
            f"index {index!r} selects no structure of {dataset.name()} ({len(dataset)} "
            f"frames); use ':' for all frames, or an index/slice within the file's frames"
        )
    return Subset(dataset, positions)
