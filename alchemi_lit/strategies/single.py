"""Single-device strategy: a fused plan over one batch, with inflight batching.

It runs the engine's :class:`~alchemi_lit.engine.run_loop.RunLoop` with a sampler (or
a fixed batch) as the feed, the sinks as the delivery and the Checkpoint callbacks as
the checkpoint policy.  Every ``sync_every`` steps (the only host synchronisation of
the loop) the loop

1. fires ON_CONVERGE if systems left a stage,
2. graduates systems at the exit code: writes them to the sinks and compacts the
   batch (one gather of the remaining rows; neighbour lists and integrator state
   are carried over, nothing is recomputed),
3. refills freed capacity from the sampler: new systems are appended with status
   PENDING, get their forces from the next step's (single) forward and enter the
   plan then -- a refill costs no extra model call.

Why compaction rather than fixed slots: rows stay dense (no padding atoms for
every kernel to mask), a gather of N atoms costs far less than the ``sync_every``
forward passes between two bookkeepings, and the expensive per-system state
(neighbour lists) is remapped rather than rebuilt (DESIGN note in DESIGN.md).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..callbacks.checkpoint import Checkpoint
from ..core.errors import ConfigError
from ..core.state import Batch
from ..data.bands import PATH_KEY
from ..data.sampler import SizeAwareSampler
from ..engine.feeds import BatchFeed, SamplerFeed, SinkDelivery, plan_relaxes
from ..engine.hooks import HookDispatcher
from ..engine.interrupt import RunInterrupted
from ..engine.memory_probe import MemoryProbe
from ..engine.run_loop import LocalTransport, RunLoop
from ..engine.step import FusedLoop
from ..integrators.stages import Fused
from ..io.results import Results
from ..sinks import HostMemory, SinkChain
from .base import Strategy

if TYPE_CHECKING:
    from ..simulator import Simulator


class CallbackCheckpoints:
    """Checkpoints of a one-device run: when a :class:`Checkpoint` callback says so
    (steps, seconds, a signal), and at once after a sink failed (so a resume never
    writes those systems twice)."""

    def __init__(self, callbacks: list[Checkpoint], sinks: SinkChain) -> None:
        self.callbacks, self.sinks = callbacks, sinks
        self._due: list[Checkpoint] = []

    def due(self, step: int, done: bool, interrupted: bool) -> bool:
        forced = self.sinks.failure_pending and not interrupted
        self._due = (
            [] if done else [c for c in self.callbacks if forced or c.due(step, interrupted)]
        )
        self.sinks.failure_pending = False
        return bool(self._due)

    def pending(self, step: int) -> bool:
        return self.sinks.failure_pending or any(c.due(step) for c in self.callbacks)

    def save(self, state: dict[str, Any], step: int, done: bool) -> Path:
        return [cp.save(state, step) for cp in self._due][-1]


class SingleDeviceStrategy(Strategy):
    """One process, one device: a fused plan with inflight batching."""

    name = "single"

    def __init__(self) -> None:
        self.device: torch.device | None = None  # the simulator's, set when a run starts
        self.loop: FusedLoop | None = None

    def run(self, sim: Simulator, data: Any, resume: str | None = None) -> Results:
        """Run ``data`` (a Batch, ase.Atoms, a list of them or a SizeAwareSampler) through
        ``sim.plan`` on ``sim.device``; ``resume``: a Checkpoint file or directory."""
        self.device = sim.device
        sim.model.to(self.device)
        source = data if isinstance(data, SizeAwareSampler) else sim.prepare(data)
        state = None
        if resume is not None:
            from ..callbacks.checkpoint import load_checkpoint

            state = load_checkpoint(resume)
        return self.run_plan(sim, source, sim.plan, resume=state)

    def run_plan(
        self,
        sim: Simulator,
        source: Batch | SizeAwareSampler,
        plan: Fused,
        resume: dict[str, Any] | None = None,
    ) -> Results:
        """The run loop over a prepared batch or a sampler (``resume``: a loaded
        checkpoint state)."""
        hooks = HookDispatcher(sim.callbacks)
        loop = FusedLoop(
            sim.model, plan, hooks, seed=sim.seed, forward=sim.forward_fn(), stress=sim.stress
        )
        self.loop = loop
        sinks = SinkChain(sim.sinks if sim.sinks is not None else [HostMemory()])
        if isinstance(source, SizeAwareSampler):
            probe = MemoryProbe(sim.model, sim.dtype, self.device, loop.needs_stress, loop.declare)
            source.bind(sim.model.cutoff + sim.model.neighbors.skin, probe)
            feed: SamplerFeed | BatchFeed = SamplerFeed(sim, loop, source)
            total, atoms = len(source), int(source.sizes[source.order].sum())
            queued = set(source.order.tolist())
            bands = sum(start in queued for _, start, _ in source.bands)
        else:
            feed = BatchFeed(source, plan_relaxes(sim.plan))
            total, atoms = source.num_systems, source.num_atoms
            bands = len({i.get(PATH_KEY) for i in source.info.values()} - {None})
        if resume is not None and "feed" not in resume:
            raise ConfigError(
                f"cannot resume from {resume['path']!r}: it was written by another kind of run "
                f"(a pipeline rank's checkpoint?); pass the folder the Checkpoint callback wrote"
            )
        fit = getattr(source, "memory_fit", None)  # max_atoms="auto": into the run's record
        delivery = SinkDelivery(sinks, sim, loop, info={"memory_budget": fit} if fit else None)
        checkpoints = CallbackCheckpoints(
            [cb for cb in sim.callbacks if isinstance(cb, Checkpoint)], sinks
        )
        run = self.run_loop = RunLoop(
            loop, hooks, feed, delivery, LocalTransport(feed), checkpoints, sim.sync_every, sim,
            context={"total_systems": total, "total_atoms": atoms,
                     **({"total_bands": bands} if bands else {})},
        )  # fmt: skip
        stream = (
            torch.cuda.stream(torch.cuda.Stream(self.device))
            if self.device.type == "cuda"
            else contextlib.nullcontext()
        )
        interrupted = None
        with stream:
            try:
                stats = run.run(resume)
            except RunInterrupted as exc:
                interrupted, stats = exc, run.stats
        occ = feed.occupancy if isinstance(feed, SamplerFeed) else []
        summary = {
            "steps": run.ctx.step if run.ctx is not None else 0,
            "forward_calls": loop.num_forward_calls,
            "wall_time_s": stats.wall_s,
            "systems": stats.graduated,
            "atom_occupancy": float(sum(occ) / len(occ)) if occ else None,
            "sink_failures": dict(sinks.failed),
        }
        results = Results.from_sinks(sinks.sinks, sinks.in_memory, sinks.overflow, summary)
        if interrupted is not None:
            interrupted.results = results
            raise interrupted
        return results


def resolve_device(accelerator: str, devices: Any = 1) -> torch.device:
    """``auto`` -> first CUDA device if available, else CPU."""
    acc = accelerator.lower()
    if acc == "auto":
        acc = "cuda" if torch.cuda.is_available() else "cpu"
    if acc in ("gpu", "cuda"):
        if not torch.cuda.is_available():
            raise ValueError(
                f"accelerator={accelerator!r} but no CUDA device is available; use "
                f"accelerator='cpu' or 'auto'"
            )
        index = devices[0] if isinstance(devices, (list, tuple)) else 0
        return torch.device("cuda", int(index))
    if acc == "cpu":
        return torch.device("cpu")
    raise ValueError(f"unknown accelerator {accelerator!r}; choose 'auto', 'cpu' or 'cuda'")
