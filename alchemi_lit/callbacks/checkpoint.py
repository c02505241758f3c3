"""Checkpoint: save everything needed to continue a run, exactly.

A checkpoint is taken at bookkeeping (every ``sync_every`` steps the batch is in a
consistent state: graduates written, refills appended) when ``every`` steps
or ``every_seconds`` seconds have passed, and when the run is stopped by SIGTERM or
SIGINT (``on_signal``; the run loop catches those signals with or without this
callback, see :mod:`alchemi_lit.engine.interrupt`).  It holds

* every in-flight system with all its fields (integrator state, thermostat
  variables, stage code and counters; random numbers are counter-based, keyed by
  ``(seed, system_id, step)``, so there is no generator state to save),
* the sampler's position, the loop step, callbacks' state,
* what the sinks had committed (in-memory results themselves; for stores, the
  committed row counts -- rows written after the checkpoint are rolled back on
  resume, so each system lands in the sinks exactly once),
* the run's fingerprint (every stage and model parameter, the weights, precision,
  seed and the input structures: :mod:`alchemi_lit.engine.fingerprint`), so a resume
  of another run is refused, naming what differs.

Files are written atomically and fsynced, with a checksum per record, and the last
``keep`` (at least two) are kept: a damaged file is named and the one before it
used (:mod:`alchemi_lit.engine.checkpointing`).  Records contain only tensors and
plain values and load with ``torch.load(weights_only=True)``: resuming never
unpickles arbitrary objects.
Neighbour lists are rebuilt on resume; their canonical edge order makes the
resumed run bit-identical to an uninterrupted one (float64, CPU).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from loguru import logger

from ..core.errors import ConfigError
from ..engine import checkpointing
from ..engine.hooks import Callback, StepContext, callback_states, restore_callback_states

__all__ = [
    "FORMAT", "Checkpoint", "callback_states", "latest_checkpoint", "load_checkpoint",
    "restore_callback_states",
]  # fmt: skip

#: the checkpoint format written now (see :mod:`alchemi_lit.engine.checkpoint_file`)
FORMAT = checkpointing.FORMAT


class Checkpoint(Callback):
    """Periodic and on-signal checkpoints in ``dirpath`` (see module docstring).

    Args:
        dirpath: folder of the checkpoint files (one per bookkeeping that wrote one).
        every: write one every this many steps (None: not by steps).
        every_seconds: write one when this many seconds of wall time have passed
            since the last (None: not by time).
        on_signal: write one when SIGTERM/SIGINT stops the run (finished systems are
            saved to the sinks either way).
        keep: how many of the newest files to keep (at least 2, so a damaged newest
            file still leaves one to resume from).
    """

    def __init__(
        self,
        dirpath: str | os.PathLike[str] = "checkpoints",
        every: int | None = 1000,
        every_seconds: float | None = None,
        on_signal: bool = True,
        keep: int = 2,
    ) -> None:
        super().__init__(every=1)
        if every is not None and int(every) < 1:
            raise ConfigError(f"Checkpoint: every must be >= 1, got {every}")
        if every_seconds is not None and float(every_seconds) <= 0:
            raise ConfigError(f"Checkpoint: every_seconds must be > 0, got {every_seconds}")
        if int(keep) < 2:
            raise ConfigError(
                f"Checkpoint: keep must be >= 2 (a damaged newest file must leave one to resume "
                f"from), got {keep}"
            )
        self.dirpath = Path(dirpath)
        self.every_steps = None if every is None else int(every)
        self.every_seconds = None if every_seconds is None else float(every_seconds)
        self.on_signal = on_signal
        self.keep = int(keep)
        self._last_step = 0
        self._last_time = time.monotonic()
        self.saved: list[Path] = []

    def on_run_start(self, ctx: StepContext) -> None:
        self._last_step = ctx.step
        self._last_time = time.monotonic()

    def set_aside_earlier(self) -> Path | None:
        """Before a fresh run: move the checkpoints an earlier run left in ``dirpath``
        into ``dirpath/earlier-<time>/``.  Resuming from ``dirpath`` takes the newest
        file there, which could otherwise be the earlier run's (it resumed that run's
        systems as if they were this one's), and pruning to ``keep`` files could delete
        this run's own.  Nothing is deleted; the earlier run stays resumable by path."""
        d = self.dirpath
        ours = ("step-", "rank")  # single-device files, pipeline ranks' folders
        earlier = [p for p in d.iterdir() if p.name.startswith(ours)] if d.is_dir() else []
        if not earlier:
            return None
        target = d / f"earlier-{time.strftime('%Y%m%dT%H%M%S')}"
        k = 1
        while target.exists():
            k += 1
            target = d / f"earlier-{time.strftime('%Y%m%dT%H%M%S')}-{k}"
        target.mkdir()
        for item in earlier:
            item.rename(target / item.name)
        logger.warning(
            f"{str(d)!r} held {len(earlier)} checkpoint file(s) of an earlier run; moved them "
            f"to {str(target)!r} so this run's checkpoints are not mixed with them"
        )
        return target

    # ---------------------------------------------------------------- saving
    def due(self, step: int, interrupted: bool = False) -> bool:
        """Is a checkpoint due at this bookkeeping (``interrupted``: the run is stopping
        on a signal)?"""
        if interrupted:
            return self.on_signal
        if self.every_steps is not None and step - self._last_step >= self.every_steps:
            return True
        return (
            self.every_seconds is not None
            and time.monotonic() - self._last_time >= self.every_seconds
        )

    def save(self, state: dict[str, Any], step: int) -> Path:
        """Write ``state`` as ``step-<step>.ckpt``; keep the newest ``keep``."""
        final = checkpointing.save(
            self.dirpath, f"step-{step:012d}.ckpt", state, self.keep, "step-*.ckpt"
        )
        self.mark_saved(step, final)
        return final

    def mark_saved(self, step: int, path: Path) -> None:
        """Restart the schedule after a checkpoint at ``step`` (written to ``path``)."""
        self._last_step, self._last_time = step, time.monotonic()
        self.saved.append(path)
        logger.info(f"checkpoint written: {path}")


def latest_checkpoint(path: str | os.PathLike[str]) -> Path:
    """The newest checkpoint file in a directory (or the file itself), whole or not."""
    p = Path(path)
    if p.is_file():
        return p
    files = sorted(p.glob("step-*.ckpt")) if p.is_dir() else []
    if not files:
        raise ConfigError(
            f"no checkpoint found at {str(p)!r}; resume needs a directory written by the "
            f"Checkpoint callback (or one of its step-*.ckpt files)"
        )
    return files[-1]


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The checkpoint a resume from ``path`` continues (a file, or the newest intact one
    in a folder), verified record by record; ``state["path"]`` names the file."""
    state = checkpointing.find(path)
    if state is None:
        raise ConfigError(
            f"no checkpoint found at {str(path)!r}; resume needs a directory written by the "
            f"Checkpoint callback (or one of its step-*.ckpt files)"
        )
    return state
