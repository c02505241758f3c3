"""The priority chain over a run's sinks: every finished system lands somewhere.

Each write goes to the first sink with free capacity (a partial fit is split); a sink
that fails (disk full, permission denied) is reported and skipped, and whatever no sink
could take stays in an overflow buffer in memory -- computed results are never dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from loguru import logger

from ..core.errors import ConfigError
from ..core.state import Batch
from ..io.serialize import batch_from_state, batch_state
from .base import HostMemory, Sink, SinkFlushError


class SinkChain:
    """Priority chain over sinks; see module docstring.  Never drops a system."""

    def __init__(self, sinks: Sequence[Sink]) -> None:
        self.sinks = list(sinks)
        self.overflow: list[Batch] = []
        self.in_memory: list[Batch] = []  # what this run wrote to HostMemory sinks
        self.failed: dict[int, str] = {}
        self.written = 0
        self.failure_pending = False

    def open(self, run_info: dict[str, Any]) -> None:
        for s in self.sinks:
            s.open(run_info)

    def state_dict(self) -> dict[str, Any]:
        self.flush()
        return {
            "sinks": [s.state_dict() for s in self.sinks],
            "overflow": [batch_state(b) for b in self.overflow],
            "in_memory": [batch_state(b) for b in self.in_memory],
            "failed": {str(k): v for k, v in self.failed.items()},
            "written": self.written,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if len(state["sinks"]) != len(self.sinks):
            raise ConfigError(
                f"cannot resume: the checkpoint had {len(state['sinks'])} sink(s), this run "
                f"has {len(self.sinks)}; resume with the same configuration"
            )
        for sink, st in zip(self.sinks, state["sinks"]):
            sink.load_state_dict(st)
        self.overflow = [batch_from_state(b) for b in state["overflow"]]
        self.in_memory = [batch_from_state(b) for b in state["in_memory"]]
        self.failed = {int(k): v for k, v in state["failed"].items()}
        self.written = int(state["written"])

    def write(self, batch: Batch) -> None:
        remaining = batch
        for k, sink in enumerate(self.sinks):
            if remaining is None or remaining.num_systems == 0:
                break
            if k in self.failed:
                continue
            free = sink.free()
            if free <= 0:
                continue
            n = remaining.num_systems if free >= remaining.num_systems else int(free)
            part = remaining if n == remaining.num_systems else remaining.select(torch.arange(n))
            try:
                sink.write(part)
            except Exception as exc:  # a failing sink must not lose results
                self._mark_failed(k, sink, exc)
                if isinstance(exc, SinkFlushError):  # it also hands back what it had buffered
                    self.written -= exc.batch.num_systems - part.num_systems
                    rest = remaining.select(torch.arange(n, remaining.num_systems))
                    remaining = (
                        Batch.concatenate([exc.batch, rest]) if rest.num_systems else exc.batch
                    )
                continue
            self.written += n
            if isinstance(sink, HostMemory):
                self.in_memory.append(sink.latest())
            rest = remaining.num_systems - n
            remaining = (
                None if rest == 0 else remaining.select(torch.arange(n, remaining.num_systems))
            )
        if remaining is not None and remaining.num_systems:
            self.overflow.append(remaining.to(device="cpu"))
            logger.warning(
                f"{remaining.num_systems} finished system(s) could not be written to any sink and "
                f"are kept in memory (Results.overflow)"
            )

    def _mark_failed(self, k: int, sink: Sink, exc: Exception) -> None:
        self.failed[k] = f"{type(exc).__name__}: {exc}"
        self.failure_pending = True  # the strategy checkpoints at once
        logger.error(
            f"sink {type(sink).__name__} failed ({self.failed[k]}); its results so far are "
            f"kept, new results go to the next sink or stay in memory"
        )

    def flush(self) -> None:
        """Flush every sink; what a failing one had buffered goes down the chain."""
        for k, s in enumerate(self.sinks):
            if k in self.failed:
                continue
            try:
                s.flush()
            except SinkFlushError as exc:
                self._mark_failed(k, s, exc)
                self.written -= exc.batch.num_systems
                self.write(exc.batch)

    def close(self) -> None:
        try:
            self.flush()
        except Exception as exc:  # never let closing hide the run's own outcome
            logger.error(f"flushing sinks failed: {exc}")
        for s in self.sinks:
            try:
                s.close()
            except Exception as exc:
                logger.error(f"closing sink {type(s).__name__} failed: {exc}")
