"""Digests of structures fed one at a time, so that a streamed dataset digests without
being held in memory (a run's input fingerprint, :mod:`alchemi_lit.engine.fingerprint`)."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np


class StructureHashes:
    """SHA-256 of the species, coordinates, cells and periodicity of structures fed one
    at a time (or as whole arrays: hashing bytes in pieces equals hashing them at once),
    each part in one dtype, so a dataset streamed through here digests as the same
    structures in a Batch do."""

    PARTS = (("numbers", np.int64), ("positions", np.float64), ("cells", np.float64),
             ("pbc", bool))  # fmt: skip

    def __init__(self) -> None:
        self.hashes = [hashlib.sha256() for _ in self.PARTS]

    def update(self, *arrays: np.ndarray) -> None:
        """Feed the next numbers, positions, cells and pbc (in ``system_id`` order)."""
        for h, (_, dtype), a in zip(self.hashes, self.PARTS, arrays):
            h.update(np.ascontiguousarray(a, dtype=dtype).tobytes())

    def add(self, atoms: Any) -> None:
        """Feed one ``ase.Atoms``."""
        self.update(atoms.numbers, atoms.positions, atoms.cell.array, atoms.pbc)

    def digest(self, ids: np.ndarray, budget: np.ndarray, counts: np.ndarray) -> str:
        """The digest of what was fed, with the ids, budget and atom counts."""
        ints = [np.asarray(a, dtype=np.int64) for a in (ids, budget, counts)]
        sub = [np.frombuffer(h.digest(), dtype=np.uint8) for h in self.hashes]
        return digest_arrays([*ints, *sub])


def digest_arrays(arrays: Any) -> str:
    """SHA-256 (16 hex digits) of arrays' shapes, dtypes and bytes."""
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.view(np.uint8).tobytes() if a.size else b"")
    return h.hexdigest()[:16]
