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
import hashlib
import time
from typing import TYPE_CHECKING, Any

import torch

from ..callbacks.checkpoint import Checkpoint, callback_states, restore_callback_states
from ..data.sampler import SizeAwareSampler
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


class RunInterrupted(KeyboardInterrupt):
    """The run stopped on SIGTERM/SIGINT after writing a checkpoint."""

    def __init__(self, path: Any, signum: int) -> None:
        super().__init__(f"interrupted by signal {signum}; checkpoint written to {path}")
        self.path, self.signum = path, signum


def batch_digest(batch: Batch) -> str:
    """Identity of a run's input batch (ids, sizes, elements, positions) to refuse a
    resume with other structures, as :func:`sampler_digest` does for samplers."""
    h = hashlib.sha256()
    for t in (batch.system_id, batch.n_atoms, batch.atomic_numbers, batch.positions):
        h.update(t.detach().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def sampler_digest(sampler: SizeAwareSampler) -> str:
    """Identity of a sampler's data (sizes, ids, budgets) to refuse a mismatched resume."""
    h = hashlib.sha256()
    for arr in (sampler.sizes, sampler.system_ids):
        h.update(arr.tobytes())
    h.update(repr((sampler.max_atoms, sampler.max_systems, sampler.max_edges)).encode())
    return h.hexdigest()[:16]


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
        self.input_digest = None if sampler is not None else batch_digest(source)
        if sampler is not None:
            sampler.bind(sim.model.cutoff + sim.model.neighbors.skin)
            total = len(sampler)
        else:
            total = source.num_systems
        if resume is not None:
            batch = self._restore(sim, plan, resume, sampler, sinks, hooks)
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
        try:
            with stream:
                if resume is None:
                    loop.compute(batch, ctx)  # forces before the first step
                hooks.run_start(ctx)
                if resume is None:
                    fresh = torch.ones(batch.num_systems, dtype=torch.bool, device=batch.device)
                    loop.start(batch, fresh, ctx)  # exits on arrival reach ON_CONVERGE too
                self._run_loop(sim, loop, ctx, hooks, sinks, sampler, stats)
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
        return Results.from_sinks(sinks.sinks, sinks.in_memory, sinks.overflow, summary)

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
            "plan": repr(loop.plan),
            "seed": sim.seed,
            "precision": sim.precision,
            "model": type(sim.model).__name__,
            "batch": batch_state(ctx.batch),
            "sampler": None
            if sampler is None
            else {**sampler.state_dict(), "digest": sampler_digest(sampler)},
            "input": self.input_digest,
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
    ) -> None:
        for cp in self.checkpoints:
            forced = sinks.failure_pending
            if final or not (forced or cp.due(ctx.step)):
                continue
            cp.save(self._checkpoint_state(sim, loop, ctx, sinks, sampler, hooks), ctx.step)
            if cp.signal_received is not None:
                raise RunInterrupted(cp.saved[-1], cp.signal_received)
        sinks.failure_pending = False

    def _restore(
        self,
        sim: Simulator,
        plan: Fused,
        state: dict[str, Any],
        sampler: SizeAwareSampler | None,
        sinks: SinkChain,
        hooks: HookDispatcher,
    ) -> Batch:
        for key, mine in (
            ("plan", repr(plan)),
            ("seed", sim.seed),
            ("precision", sim.precision),
            ("model", type(sim.model).__name__),
        ):
            if state[key] != mine:
                raise ConfigError(
                    f"cannot resume from {state['path']!r}: it was written with {key}="
                    f"{state[key]!r}, this run has {mine!r}; resume with the same configuration"
                )
        if (
            (state["sampler"] is None) != (sampler is None)
            or (sampler is not None and state["sampler"]["digest"] != sampler_digest(sampler))
            or state.get("input", self.input_digest) != self.input_digest  # (older: none)
        ):
            raise ConfigError(
                f"cannot resume from {state['path']!r}: the input data differ from the run that "
                f"wrote it; pass the same structures and sampler settings"
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
    ) -> None:
        budget = loop.plan.total_budget() + 2 * sim.sync_every + 2
        idle_steps = 0
        while True:
            for _ in range(sim.sync_every):
                loop.step(ctx.batch, ctx)
                if loop.evict:  # quarantined for a model error: out before the next forward
                    break
            loop.evict = False
            if self._bookkeeping(sim, loop, ctx, hooks, sinks, sampler, stats):
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
    ) -> bool:
        """Host work every ``sync_every`` steps; True when the run is complete."""
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
        if sampler is not None and not sampler.exhausted:
            batch = self._refill(sim, loop, batch, sampler)
            ctx.state["has_fixed"] = bool(batch.fixed.any())
        ctx.batch = batch
        ctx.graduated = None
        done = batch.num_systems == 0 and (sampler is None or sampler.exhausted)
        self._maybe_checkpoint(sim, loop, ctx, sinks, sampler, hooks, final=done)
        return done

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
