"""Where checkpoints live and which one a resume takes.

One writer and one reader for every strategy: the single-device loop writes
``step-<step>.ckpt`` files, each pipeline rank ``rank<r>/round-<round>.ckpt`` (and
``done.ckpt`` when it finished), all through :func:`~.checkpoint_file.write_checkpoint`
(atomic, fsynced, a checksum per record).  A resume takes the newest file that reads
back whole; a damaged one is named in a warning and the one before it is used, which
is why at least two are kept.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from loguru import logger

from ..core.errors import ConfigError
from .checkpoint_file import FORMAT, CheckpointDamaged, read_checkpoint, write_checkpoint


def save(folder: Path, name: str, state: Mapping[str, Any], keep: int, pattern: str) -> Path:
    """Write ``state`` as ``folder/name`` and delete all but the newest ``keep`` files
    matching ``pattern`` (names sort by step or round)."""
    path = write_checkpoint(folder / name, state)
    for old in sorted(folder.glob(pattern))[:-keep]:
        old.unlink(missing_ok=True)
    return path


def load(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The checkpoint at ``path`` (a file), every record verified; raises
    :class:`~.checkpoint_file.CheckpointDamaged` naming the problem."""
    state = read_checkpoint(path)
    state["path"] = str(path)
    return state


def newest_intact(files: Iterable[Path], where: str) -> dict[str, Any] | None:
    """Load the newest of ``files`` (sorted oldest first) that reads back whole, warning
    for each damaged one passed over; None when there are none; a
    :class:`~alchemi_lit.core.errors.ConfigError` naming them when every one is damaged."""
    damaged: list[CheckpointDamaged] = []
    for file in reversed(list(files)):
        try:
            state = load(file)
        except CheckpointDamaged as exc:
            damaged.append(exc)
            logger.warning(f"{exc}; trying the checkpoint before it")
            continue
        if damaged:
            logger.warning(f"resuming from the older checkpoint {str(file)!r}")
        return state
    if damaged:
        problems = "; ".join(f"{e.path.name}: {e.problem}" for e in damaged)
        raise ConfigError(
            f"cannot resume from {where!r}: every checkpoint there is damaged ({problems}); "
            f"start the run afresh (without resume)"
        )
    return None


def find(path: str | os.PathLike[str], pattern: str = "step-*.ckpt") -> dict[str, Any] | None:
    """The checkpoint a resume from ``path`` continues: the file itself (verified; a
    damaged file is refused, naming the older ones next to it), or the newest intact
    file matching ``pattern`` in the folder ``path``; None when the folder holds none."""
    p = Path(path)
    if p.is_file():
        try:
            return load(p)
        except CheckpointDamaged as exc:
            others = [f.name for f in sorted(p.parent.glob(pattern)) if f != p]
            hint = f"; resume from {', '.join(others)} there instead" if others else ""
            raise ConfigError(f"{exc}{hint}") from None
    return newest_intact(sorted(p.glob(pattern)) if p.is_dir() else [], str(p))


__all__ = ["FORMAT", "CheckpointDamaged", "find", "load", "newest_intact", "save"]
