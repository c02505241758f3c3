"""An (extended) XYZ file read by frame: one pass indexes the frames' byte offsets.

ASE reads frame ``k`` of an extxyz file by parsing the file from its start
(``ase.io.read(path, index=k)``), and ``ase.io.iread`` only goes forward; a sampler
that refills a batch from anywhere in a file of a million frames needs ``[k]`` at the
cost of one frame.  The index is one pass over the file reading only the atom-count
lines (each frame is a count line, a comment line and that many atom lines), kept as
an ``int64`` array of offsets (8 bytes a frame); a frame is then read from its bytes
and parsed by ASE, so what comes out is what ``ase.io.read`` gives (info, arrays,
calculator results), frame for frame.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import StructureError
from .datasets import StructureDataset


class ExtxyzDataset(StructureDataset):
    """The frames of an extxyz (or plain xyz) file, ``[k]`` parsing frame ``k`` alone.

    ``format``: ``"extxyz"`` (ASE's reader of both extended and plain XYZ, the default)
    or ``"xyz"`` (ASE's plain-XYZ reader).  The file must not change while the dataset
    is used: its offsets would point into other frames (its size is checked on access).
    """

    def __init__(self, path: str | Path, format: str = "extxyz") -> None:
        self.path = Path(path)
        self.format = format
        self.offsets = index_frames(self.path)
        self._size = self.path.stat().st_size
        self._file: Any = None

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def _read(self, k: int) -> Any:
        import ase.io

        if self._file is None:
            if self.path.stat().st_size != self._size:
                raise StructureError(
                    f"{self.name()} changed size since it was indexed; a file must not "
                    f"change while a run reads it (copy it, or let the writer finish first)"
                )
            self._file = open(self.path, "rb")  # noqa: SIM115 (kept open between reads)
        self._file.seek(int(self.offsets[k]))
        raw = self._file.read(int(self.offsets[k + 1] - self.offsets[k]))
        try:
            return ase.io.read(io.StringIO(raw.decode()), index=0, format=self.format)
        except Exception as exc:  # ASE raises many types for a garbled frame
            raise StructureError(
                f"could not read structure {k} of {self.name()} (at byte {int(self.offsets[k])}"
                f"; {type(exc).__name__}: {exc}); fix or remove that frame",
                k,
            ) from exc

    def close(self) -> None:
        """Close the file (reopened on the next access)."""
        if getattr(self, "_file", None) is not None:
            self._file.close()
            self._file = None

    def __getstate__(self) -> dict[str, Any]:  # (an open file does not pickle)
        return {**self.__dict__, "_file": None}

    def __del__(self) -> None:
        self.close()


def index_frames(path: Path) -> np.ndarray:
    """Byte offsets of every frame of an XYZ file, and of its end (``n + 1`` entries).

    Reads the count line of each frame and skips its comment and atom lines; blank
    lines after the last frame are allowed.  A count line that is not a number, or a
    frame cut short, is an error naming the line."""
    offsets: list[int] = []
    blocks: list[np.ndarray] = []
    line_no, end = 0, 0
    with open(path, "rb") as fh:
        while True:
            start = fh.tell()
            line = fh.readline()
            line_no += 1
            end = start  # (the frames end where a blank line or the file does)
            if not line:
                break
            if not line.strip():  # blank: only more blank lines may follow
                rest = fh.readline()
                while rest and not rest.strip():
                    rest = fh.readline()
                if rest:
                    raise StructureError(
                        f"{str(path)!r} line {line_no}: a blank line between frames; an XYZ "
                        f"frame starts with its atom count (remove the blank line)"
                    )
                break
            try:
                count = int(line)
            except ValueError:
                raise StructureError(
                    f"{str(path)!r} line {line_no}: expected the atom count that starts a "
                    f"frame, found {line[:60].decode(errors='replace').strip()!r}; check the "
                    f"file (or pass format=... if it is not XYZ)"
                ) from None
            if count < 0:
                raise StructureError(f"{str(path)!r} line {line_no}: negative atom count {count}")
            for _ in range(count + 1):
                if not fh.readline():
                    raise StructureError(
                        f"{str(path)!r}: the frame at line {line_no} ({count} atoms) ends "
                        f"early (the file is cut short?); check the file"
                    )
            line_no += count + 1
            offsets.append(start)
            if len(offsets) >= 1 << 16:  # (a million Python ints would cost 28 MB)
                blocks.append(np.asarray(offsets, dtype=np.int64))
                offsets = []
    blocks.append(np.asarray([*offsets, end], dtype=np.int64))
    found = np.concatenate(blocks)
    if len(found) < 2:
        raise StructureError(f"{str(path)!r} contains no structures")
    return found
