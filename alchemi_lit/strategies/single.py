"""Single-device strategy: a fused plan over one batch, with inflight batching.

Every ``sync_every`` steps (the only host synchronisation of the loop) the strategy

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
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..callbacks.checkpoint import Checkpoint, callback_states, restore_callback_states
from ..data.sampler import SizeAwareSampler
from ..engine.fingerprint import refuse_mismatch
from ..engine.interrupt import InterruptGuard, RunInterrupted
from ..errors import ConfigError
from ..hooks import HookDispatcher, StepContext
from ..results import Results
from ..sinks import HostMemory, SinkChain, batch_from_state, batch_state
from ..stages import Fused
from ..state import Batch
from .base import Strategy
from .fused import FusedLoop

if TYPE_CHECKING:
    from ..simulator import Simulator


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
        """The step loop over a prepared batch or a sampler (``resume``: a loaded
        checkpoint state)."""
        hooks = HookDispatcher(sim.callbacks)
        loop = FusedLoop(sim.model, plan, hooks, seed=sim.seed, forward=sim.forward_fn())
        self.loop = loop
        sinks = SinkChain(sim.sinks if sim.sinks is not None else [HostMemory()])
        self.checkpoints = [cb for cb in sim.callbacks if isinstance(cb, Checkpoint)]
        sampler = source if isinstance(source, SizeAwareSampler) else None
        self.inflight_edges = 0
        if sampler is not None:
            sampler.bind(sim.model.cutoff + sim.model.neighbors.skin)
            total = len(sampler)
        else:
            total = source.num_systems
        if resume is not None:
            batch = self._restore(sim, resume, sampler, sinks, hooks)
        else:
            batch = self._initial_batch(sim, sampler) if sampler is not None else source
        loop.declare(batch)
        ctx = StepContext(batch=batch, stages=plan.stages, simulator=sim)
        ctx.state.update(
            has_fixed=bool(batch.fixed.any()),
            exit_code=plan.exit,
            total_systems=total,
            graduated_systems=0,
        )
        stats: dict[str, Any] = {"occupancy": [], "started": time.perf_counter()}
        if resume is not None:
            ctx.step = int(resume["step"])
            ctx.state["graduated_systems"] = int(resume["graduated"])
            loop.pending = bool(resume["pending"])
        else:
            sinks.open(sim.run_info())
        stream = (
            torch.cuda.stream(torch.cuda.Stream(self.device))
            if self.device.type == "cuda"
            else contextlib.nullcontext()
        )
        with InterruptGuard() as guard:
            try:
                with stream:
                    if resume is None:
                        loop.compute(batch, ctx)  # forces before the first step
                    hooks.run_start(ctx)
                    if resume is None:
                        # systems the model failed on at once are out already
                        loop.start(batch, loop.not_quarantined(batch), ctx)
                    self._run_loop(sim, loop, ctx, hooks, sinks, sampler, stats, guard)
            finally:
                try:
                    hooks.run_end(ctx)
                finally:
                    sinks.close()
        elapsed = time.perf_counter() - stats["started"]
        occ = stats["occupancy"]
        summary = {
            "steps": ctx.step,
            "forward_calls": loop.num_forward_calls,
            "wall_time_s": elapsed,
            "systems": ctx.state["graduated_systems"],
            "atom_occupancy": float(sum(occ) / len(occ)) if occ else None,
            "sink_failures": dict(sinks.failed),
        }
        results = Results.from_sinks(sinks.sinks, sinks.in_memory, sinks.overflow, summary)
        if guard.received is not None:
            raise RunInterrupted(
                stats.get("checkpoint"),
                guard.received,
                where=interrupted_where(sinks, summary["systems"], total),
                results=results,
            )
        return results

    # ---------------------------------------------------------------- checkpoints
    def _checkpoint_state(
        self,
        sim: Simulator,
        loop: FusedLoop,
        ctx: StepContext,
        sinks: SinkChain,
        sampler: SizeAwareSampler | None,
        hooks: HookDispatcher,
    ) -> dict[str, Any]:
        return {
            "step": ctx.step,
            "fingerprint": sim.fingerprint,
            "batch": batch_state(ctx.batch),
            "sampler": None if sampler is None else sampler.state_dict(),
            "sinks": sinks.state_dict(),
            "callbacks": callback_states(hooks.callbacks),
            "graduated": ctx.state["graduated_systems"],
            "inflight_edges": self.inflight_edges,
            "pending": loop.pending,
        }

    def _maybe_checkpoint(
        self,
        sim: Simulator,
        loop: FusedLoop,
        ctx: StepContext,
        sinks: SinkChain,
        sampler: SizeAwareSampler | None,
        hooks: HookDispatcher,
        final: bool,
        interrupted: bool,
    ) -> Path | None:
        """Write the checkpoints that are due (a sink failure forces one); returns the
        last file written."""
        written = None
        for cp in self.checkpoints:
            forced = sinks.failure_pending and not interrupted
            if final or not (forced or cp.due(ctx.step, interrupted)):
                continue
            state = self._checkpoint_state(sim, loop, ctx, sinks, sampler, hooks)
            written = cp.save(state, ctx.step)
        sinks.failure_pending = False
        return written

    def _restore(
        self,
        sim: Simulator,
        state: dict[str, Any],
        sampler: SizeAwareSampler | None,
        sinks: SinkChain,
        hooks: HookDispatcher,
    ) -> Batch:
        refuse_mismatch(state.get("fingerprint"), sim.fingerprint, f"checkpoint {state['path']!r}")
        if (state["sampler"] is None) != (sampler is None):
            raise ConfigError(
                f"cannot resume from {state['path']!r}: it was written by a run "
                f"{'with' if state['sampler'] is not None else 'without'} a SizeAwareSampler; "
                f"pass the same kind of input"
            )
        if sampler is not None:
            sampler.load_state_dict(state["sampler"])
        sinks.load_state_dict(state["sinks"])
        restore_callback_states(hooks.callbacks, state["callbacks"])
        self.inflight_edges = int(state["inflight_edges"])
        batch = batch_from_state(state["batch"]).to(device=self.device)
        return batch

    # ---------------------------------------------------------------- loop
    def _run_loop(
        self,
        sim: Simulator,
        loop: FusedLoop,
        ctx: StepContext,
        hooks: HookDispatcher,
        sinks: SinkChain,
        sampler: SizeAwareSampler | None,
        stats: dict[str, Any],
        guard: InterruptGuard,
    ) -> None:
        budget = loop.plan.total_budget() + 2 * sim.sync_every + 2
        idle_steps = 0
        while True:
            # bookkeeping at multiples of sync_every, also after a step cut short (a
            # quarantine, or a resume from an interrupt), so runs stay aligned
            for _ in range(sim.sync_every - ctx.step % sim.sync_every):
                loop.step(ctx.batch, ctx)
                if loop.evict or guard.received is not None:
                    break  # quarantined systems leave before the next forward; signals stop
            loop.evict = False
            if self._bookkeeping(sim, loop, ctx, hooks, sinks, sampler, stats, guard):
                return
            # safety net: each stage has a finite budget, so a system can not stay longer
            idle_steps = idle_steps + sim.sync_every if not ctx.state.get("progress") else 0
            if idle_steps > budget:
                raise RuntimeError(
                    f"no system finished within {budget} steps although every stage has a finite "
                    f"budget; this is a bug, please report it with your plan {loop.plan!r}"
                )

    def _bookkeeping(
        self,
        sim: Simulator,
        loop: FusedLoop,
        ctx: StepContext,
        hooks: HookDispatcher,
        sinks: SinkChain,
        sampler: SizeAwareSampler | None,
        stats: dict[str, Any],
        guard: InterruptGuard,
    ) -> bool:
        """Host work every ``sync_every`` steps; True when the run is complete or stopped
        by a signal."""
        graduates, batch = loop.take_finished(ctx.batch, ctx)
        n_done = 0 if graduates is None else graduates.num_systems
        if sampler is not None:
            active_atoms = batch.num_atoms - int(batch.n_atoms[loop.finished(batch)].sum())
            stats["occupancy"].append(active_atoms / sampler.max_atoms)
        ctx.state["progress"] = n_done > 0
        if graduates is not None:
            if sim.model.compute_stress and not loop.needs_stress:
                graduates.stress = sim.model.final_stress(graduates)
            sinks.write(graduates)
            ctx.state["graduated_systems"] += n_done
            if sampler is not None and sampler.edges is not None:
                self.inflight_edges -= sampler.edges_of(graduates.system_id.tolist())
        interrupted = guard.received is not None
        if sampler is not None and not sampler.exhausted and not interrupted:
            batch = self._refill(sim, loop, batch, sampler)
            ctx.state["has_fixed"] = bool(batch.fixed.any())
        ctx.batch = batch
        ctx.graduated = None
        done = batch.num_systems == 0 and (sampler is None or sampler.exhausted)
        written = self._maybe_checkpoint(
            sim, loop, ctx, sinks, sampler, hooks, final=done, interrupted=interrupted
        )
        if interrupted:
            sinks.flush()
            stats["checkpoint"] = written
        return done or interrupted

    # ---------------------------------------------------------------- batch surgery
    def _initial_batch(self, sim: Simulator, sampler: SizeAwareSampler) -> Batch:
        max_atoms, max_systems, max_edges = sampler.budget()
        atoms, ids = sampler.take(max_atoms, max_systems, max_edges)
        self.inflight_edges = sampler.edges_of(ids)
        return sim.prepare(Batch.from_atoms(atoms, system_ids=ids, validate=False))

    def _refill(
        self, sim: Simulator, loop: FusedLoop, batch: Batch, sampler: SizeAwareSampler
    ) -> Batch:
        max_atoms, max_systems, max_edges = sampler.budget()
        free_edges = None if max_edges is None else max_edges - self.inflight_edges
        atoms, ids = sampler.take(
            max_atoms - batch.num_atoms, max_systems - batch.num_systems, free_edges
        )
        if not atoms:
            return batch
        self.inflight_edges += sampler.edges_of(ids)
        fresh = sim.prepare(Batch.from_atoms(atoms, system_ids=ids, validate=False))
        return loop.append(batch, [fresh])


def interrupted_where(sinks: SinkChain, finished: int, total: int) -> str:
    """Where an interrupted run's finished systems are, for its message."""
    places = []
    for sink in sinks.sinks:
        path = getattr(sink, "path", None)
        if path is not None:
            places.append(f"{len(sink)} in {str(path)!r}")
    in_memory = sum(b.num_systems for b in sinks.in_memory) + sum(
        b.num_systems for b in sinks.overflow
    )
    if in_memory:
        places.append(f"{in_memory} in memory (the exception's .results)")
    where = f" ({', '.join(places)})" if places else ""
    return f"{finished} of {total} systems had finished and are saved{where}"


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
