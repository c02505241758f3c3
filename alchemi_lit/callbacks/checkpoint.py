"""Checkpoint: save everything needed to continue a run, exactly.

A checkpoint is taken at bookkeeping (every ``sync_every`` steps the batch is in a
consistent state: graduates written, refills appended) when ``every_n_steps`` steps
or ``every_seconds`` seconds have passed, and when the process receives SIGTERM or
SIGINT (then the run stops right after saving).  It holds

* every in-flight system with all its fields (integrator state, thermostat
  variables, stage code and counters; random numbers are counter-based, keyed by
  ``(seed, system_id, step)``, so there is no generator state to save),
* the sampler's position, the loop step, callbacks' state,
* what the sinks had committed (in-memory results themselves; for stores, the
  committed row counts -- rows written after the checkpoint are rolled back on
  resume, so each system lands in the sinks exactly once),
* the run configuration, to refuse resuming a different run.

Files are written atomically (temporary file, then rename) and the last ``keep``
are kept.  They contain only tensors and plain values and load with
``torch.load(weights_only=True)``: resuming never unpickles arbitrary objects.
Neighbour lists are rebuilt on resume; their canonical edge order makes the
resumed run bit-identical to an uninterrupted one (float64, CPU).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
from loguru import logger

from ..errors import ConfigError
from ..hooks import Callback, StepContext

FORMAT = "alchemi_lit.checkpoint/1"


class Checkpoint(Callback):
    """Periodic and on-signal checkpoints in ``dirpath`` (see module docstring)."""

    def __init__(
        self,
        dirpath: str | os.PathLike[str] = "checkpoints",
        every_n_steps: int | None = 1000,
        every_seconds: float | None = None,
        on_signal: bool = True,
        keep: int = 2,
    ) -> None:
        super().__init__(frequency=1)
        if every_n_steps is not None and int(every_n_steps) < 1:
            raise ConfigError(f"Checkpoint: every_n_steps must be >= 1, got {every_n_steps}")
        if every_seconds is not None and float(every_seconds) <= 0:
            raise ConfigError(f"Checkpoint: every_seconds must be > 0, got {every_seconds}")
        if int(keep) < 1:
            raise ConfigError(f"Checkpoint: keep must be >= 1, got {keep}")
        self.dirpath = Path(dirpath)
        self.every_n_steps = None if every_n_steps is None else int(every_n_steps)
        self.every_seconds = None if every_seconds is None else float(every_seconds)
        self.on_signal = on_signal
        self.keep = int(keep)
        self.signal_received: int | None = None
        self._last_step = 0
        self._last_time = time.monotonic()
        self._previous_handlers: dict[int, Any] = {}
        self.saved: list[Path] = []

    # ---------------------------------------------------------------- signals
    def on_run_start(self, ctx: StepContext) -> None:
        self._last_step = ctx.step
        self._last_time = time.monotonic()
        self.signal_received = None
        if self.on_signal:
            import threading

            if threading.current_thread() is threading.main_thread():
                for sig in (signal.SIGTERM, signal.SIGINT):
                    self._previous_handlers[sig] = signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        logger.warning(
            f"signal {signum} received: checkpointing at the next bookkeeping, then stopping"
        )
        self.signal_received = signum

    def on_run_end(self, ctx: StepContext) -> None:
        for sig, handler in self._previous_handlers.items():
            signal.signal(sig, handler)
        self._previous_handlers = {}

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
    def due(self, step: int) -> bool:
        """Is a checkpoint due at this bookkeeping?"""
        if self.signal_received is not None:
            return True
        if self.every_n_steps is not None and step - self._last_step >= self.every_n_steps:
            return True
        return (
            self.every_seconds is not None
            and time.monotonic() - self._last_time >= self.every_seconds
        )

    def save(self, state: dict[str, Any], step: int) -> Path:
        """Write ``state`` atomically as ``step-<step>.ckpt``; keep the newest ``keep``."""
        self.dirpath.mkdir(parents=True, exist_ok=True)
        final = self.dirpath / f"step-{step:012d}.ckpt"
        tmp = final.with_suffix(".ckpt.tmp")
        torch.save({"format": FORMAT, **state}, tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, final)
        self._last_step, self._last_time = step, time.monotonic()
        existing = sorted(self.dirpath.glob("step-*.ckpt"))
        for old in existing[: -self.keep]:
            old.unlink(missing_ok=True)
        self.saved.append(final)
        logger.info(f"checkpoint written: {final}")
        return final


def latest_checkpoint(path: str | os.PathLike[str]) -> Path:
    """The newest checkpoint file in a directory (or the file itself)."""
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
    """Load a checkpoint safely (``weights_only=True``)."""
    file = latest_checkpoint(path)
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ConfigError(
            f"checkpoint {str(file)!r} cannot be read ({type(exc).__name__}: {exc}); it may be "
            f"truncated -- remove it to resume from the previous one"
        ) from exc
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ConfigError(f"{str(file)!r} is not an alchemi_lit checkpoint")
    state["path"] = str(file)
    return state


def callback_states(callbacks: list[Callback]) -> list[list[Any]]:
    """``[[class name, state], ...]`` of every callback, for a checkpoint."""
    return [[type(cb).__name__, cb.state_dict()] for cb in callbacks]


def restore_callback_states(callbacks: list[Callback], saved: list[list[Any]]) -> None:
    """Each callback takes the next saved state of its class (callbacks added or removed
    since the checkpoint start fresh)."""
    pending = list(saved)
    for cb in callbacks:
        for k, (name, state) in enumerate(pending):
            if name == type(cb).__name__:
                cb.load_state_dict(state)
                del pending[k]
                break
