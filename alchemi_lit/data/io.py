"""Structure input through ASE: every format ``ase.io`` reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import StructureError


def read_structures(
    path: str | Path, index: str | int | slice = ":", format: str | None = None
) -> list[Any]:
    """Read all structures of a file (extxyz, cif, POSCAR, traj, ...) as ``ase.Atoms``.

    Errors name the file and what went wrong; a file with no structures is an error.
    """
    import ase.io

    p = Path(path)
    if not p.exists():
        raise StructureError(f"structure file {str(p)!r} does not exist; check the path")
    if format is not None:
        from ase.io.formats import ioformats

        if format not in ioformats:
            import difflib

            close = difflib.get_close_matches(str(format), sorted(ioformats), n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise StructureError(
                f"unknown structure file format {format!r}.{hint} `ase info --formats` lists "
                f"them; leave format unset to guess it from the file name"
            )
    try:
        frames = ase.io.read(str(p), index=index, format=format)
    except (StopIteration, IndexError) as exc:
        if isinstance(exc, IndexError) and index in (":", None):  # a parse error, not the index
            raise StructureError(
                f"could not read structures from {str(p)!r} ({type(exc).__name__}: {exc}); check "
                f"the file and pass format=... if the extension does not tell ASE the format"
            ) from exc
        raise StructureError(
            f"index {index!r} selects no structure of {str(p)!r} ({type(exc).__name__}: {exc}); "
            f"use ':' for all frames, or an index/slice within the file's frames"
        ) from exc
    except Exception as exc:  # ase raises many types for unparsable files
        if "Index argument" in str(exc):
            raise StructureError(
                f"index {index!r} is not a valid frame index; use ':' (all frames), an "
                f"integer such as 0 or -1, or a slice such as '0:10'"
            ) from exc
        raise StructureError(
            f"could not read structures from {str(p)!r} ({type(exc).__name__}: {exc}); check the "
            f"file and pass format=... if the extension does not tell ASE the format"
        ) from exc
    frames = frames if isinstance(frames, list) else [frames]
    if not frames and index not in (":", None):
        raise StructureError(
            f"index {index!r} selects no structure of {str(p)!r}; use ':' for all frames, or an "
            f"index/slice within the file's frames"
        )
    if not frames:
        raise StructureError(f"{str(p)!r} contains no structures")
    return frames
