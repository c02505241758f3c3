"""Structure input through ASE: every format ``ase.io`` reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import StructureError


def read_structures(path: str | Path, index: str | int | slice = ":", format: str | None = None) -> list[Any]:
    """Read all structures of a file (extxyz, cif, POSCAR, traj, ...) as ``ase.Atoms``.

    Errors name the file and what went wrong; a file with no structures is an error.
    """
    import ase.io

    p = Path(path)
    if not p.exists():
        raise StructureError(f"structure file {str(p)!r} does not exist; check the path")
    try:
        frames = ase.io.read(str(p), index=index, format=format)
    except Exception as exc:  # ase raises many types for unparsable files
        raise StructureError(
            f"could not read structures from {str(p)!r} ({type(exc).__name__}: {exc}); check the "
            f"file and pass format=... if the extension does not tell ASE the format"
        ) from exc
    frames = frames if isinstance(frames, list) else [frames]
    if not frames:
        raise StructureError(f"{str(p)!r} contains no structures")
    return frames
