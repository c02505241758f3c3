"""The run loop: the one loop every strategy runs, on one device or on a pipeline rank.

Like Lightning's ``_Loop.run``, it owns the order of things and nothing else::

    restore or take the first systems         (Feed.initial / a checkpoint)
    forces before the first step; callbacks' on_run_start; systems enter the plan
    repeat:
        steps until bookkeeping is due (:mod:`.cadence`: every sync_every, or as soon
        as it pays), cut short by a quarantine or a signal
        graduate the finished systems          -> Delivery.deliver
        one round with the rest of the run     -> Transport.round (a pipeline's exchange)
        checkpoint when due                     -> CheckpointPolicy
        stop when done, or raise RunInterrupted after a signal
        admit new systems                       <- Feed.admit (refills, received systems)

What differs between a single device and a pipeline rank is only where systems come
from (a sampler, or an inbox of received systems), where they go (sinks, or an outbox
to the next rank), what a round exchanges and when checkpoints are due -- the four
components passed in.  A checkpoint is the loop's own state plus each component's
``state_dict``, written by one writer (:mod:`.checkpointing`) and checked against the
run's fingerprint (:mod:`.fingerprint`) on resume.  On a CPU, freed memory stays in
the heap for the next step while the loop runs (:mod:`alchemi_lit.core.heap`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..core.heap import kept_heap
from ..core.state import Batch
from ..integrators.constrain import constraint_bits
from ..io.serialize import batch_from_state, batch_state
from .cadence import MAX_AUTO_INTERVAL, Cadence, SyncEvery
from .cuda_graph import step_function
from .fingerprint import refuse_mismatch
from .hooks import (
    HookDispatcher,
    HookStageEnum,
    StepContext,
    callback_states,
    restore_callback_states,
)
from .interrupt import InterruptGuard, RunInterrupted


class Feed(Protocol):
    """Where systems come from: a sampler, a fixed batch, a pipeline rank's inbox."""

    def initial(self) -> Batch:
        """The first batch (may be empty)."""

    def admit(self, batch: Batch) -> Batch:
        """``batch`` with new systems appended (as PENDING: see FusedLoop.append)."""

    def exhausted(self) -> bool:
        """Whether nothing more will come."""

    def release(self, graduates: Batch) -> None:
        """``graduates`` left the batch (budgets that count in-flight systems shrink)."""

    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class Delivery(Protocol):
    """Where finished systems go: the sinks, or a pipeline rank's outbox."""

    def open(self, run_info: dict[str, Any]) -> None: ...
    def deliver(self, graduates: Batch) -> None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...
    def where(self) -> str:
        """Where the delivered systems are, for a message (empty when nowhere to say)."""

    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class Transport(Protocol):
    """What a bookkeeping round exchanges with the rest of the run."""

    def start(self, batch: Batch, resumed: bool) -> None:
        """Before the first step (a pipeline posts receives and first credits)."""

    def steps_left(self, step: int) -> int | None:
        """Steps that may run before the next round at most (None: no limit)."""

    def round_due(self, step: int, batch: Batch) -> bool:
        """Whether this bookkeeping ends with a round."""

    def round(self, batch: Batch) -> bool:
        """One round after graduation; True when this part of the run is done."""

    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class CheckpointPolicy(Protocol):
    """When checkpoints are due and where they go."""

    def due(self, step: int, done: bool, interrupted: bool) -> bool: ...
    def pending(self, step: int) -> bool:
        """Whether a checkpoint is due already (the auto cadence books for it)."""

    def save(self, state: dict[str, Any], step: int, done: bool) -> Path: ...


class LocalTransport:
    """One process and no neighbours: done when the batch is empty and the feed dry."""

    def __init__(self, feed: Feed) -> None:
        self.feed = feed

    def start(self, batch: Batch, resumed: bool) -> None:
        return None

    def steps_left(self, step: int) -> int | None:
        return None

    def round_due(self, step: int, batch: Batch) -> bool:
        return True

    def round(self, batch: Batch) -> bool:
        return batch.num_systems == 0 and self.feed.exhausted()

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None


@dataclass
class LoopStats:
    """What the loop counts (a pipeline rank adds its exchange statistics)."""

    steps: int = 0
    graduated: int = 0
    busy_s: float = 0.0
    wall_s: float = 0.0
    checkpoint: Path | None = None


class RunLoop:
    """Runs a :class:`~alchemi_lit.engine.step.FusedLoop` plan until its feed is
    dry (see the module docstring).  ``context``: StepContext fields to set
    (``total_systems``, ``rank`` ...)."""

    def __init__(
        self,
        loop: Any,
        hooks: HookDispatcher,
        feed: Feed,
        delivery: Delivery,
        transport: Transport,
        checkpoints: CheckpointPolicy | None,
        sync_every: SyncEvery,
        simulator: Any,
        context: dict[str, Any] | None = None,
    ) -> None:
        self.loop, self.hooks = loop, hooks
        self.feed, self.delivery, self.transport = feed, delivery, transport
        self.checkpoints = checkpoints
        self.cadence = Cadence(sync_every, simulator.device, hooks.has(HookStageEnum.ON_CONVERGE))
        self.sim = simulator
        self.step = step_function(loop, simulator)  # eager, or replayed CUDA graphs
        self.context = dict(context or {})
        self.stats = LoopStats()
        self.ctx: StepContext | None = None

    # ------------------------------------------------------------------ run
    def run(self, resume: dict[str, Any] | None = None) -> LoopStats:
        """Run to the end (``resume``: a loaded checkpoint of this loop)."""
        started = time.perf_counter()
        reuse = self.sim.device.type == "cpu" and self.sim.reuse_cpu_memory
        with InterruptGuard() as guard, kept_heap(reuse):
            batch = self._restore(resume) if resume is not None else self.feed.initial()
            self.loop.declare(batch)
            ctx = self.ctx = StepContext(
                batch=batch, stages=self.loop.plan.stages, simulator=self.sim
            )
            ctx.has_fixed = bool(batch.fixed.any())
            ctx.constraint_bits = self.loop.constraint_bits = constraint_bits(batch)
            ctx.exit_code = self.loop.plan.exit
            ctx.graduated_systems = self.stats.graduated
            ctx.state.update(self.context)
            if resume is None:
                self.delivery.open(self.sim.run_info())
            else:
                ctx.step = int(resume["step"])
                self.loop.pending = bool(resume["pending"])
            self.transport.start(batch, resumed=resume is not None)
            try:
                if resume is None and batch.num_systems:
                    self.loop.compute(batch, ctx)  # forces before the first step
                self.hooks.run_start(ctx)
                done_at_entry = False
                if resume is None and batch.num_systems:
                    # systems the model failed on at their first evaluation are out already,
                    # and leave before the next forward (which would quarantine them again)
                    self.loop.start(batch, self.loop.not_quarantined(batch), ctx)
                    if self.loop.evict:
                        self.loop.evict = False
                        self._graduate(ctx)
                    # every system left at entry (zero-step stages: single points): a
                    # step would be a forward for nothing; one read, before the loop
                    done_at_entry = bool(self.loop.finished(ctx.batch).all())
                if resume is not None:  # checkpoints are taken before admission
                    ctx.batch = self._admit(ctx.batch)
                self._loop(ctx, guard, done_at_entry)
            finally:
                release = getattr(self.step, "release", None)  # (a graph's memory pool)
                if release is not None:
                    release()
                try:
                    self.hooks.run_end(ctx)
                finally:
                    self.delivery.close()
                    self.stats.wall_s = time.perf_counter() - started
        return self.stats

    def _loop(self, ctx: StepContext, guard: InterruptGuard, done_at_entry: bool = False) -> None:
        interval = self.cadence.fixed or MAX_AUTO_INTERVAL
        budget = self.loop.plan.total_budget() + 2 * interval + 2
        idle = 0
        while True:
            steps = 0 if done_at_entry else self._steps(ctx, guard)
            done_at_entry = False
            started = time.perf_counter()
            graduated = self._graduate(ctx)
            interrupted = guard.received is not None
            if interrupted or self.transport.round_due(ctx.step, ctx.batch):
                done = self.transport.round(ctx.batch)
                policy = self.checkpoints
                if policy is not None and policy.due(ctx.step, done, interrupted):
                    self.stats.checkpoint = policy.save(self.state_dict(), ctx.step, done)
                if done:
                    return
            if interrupted:
                self.delivery.flush()
                raise RunInterrupted(self.stats.checkpoint, guard.received, self.delivery.where())
            ctx.batch = self._admit(ctx.batch)
            self.cadence.booked(time.perf_counter() - started)
            # safety net: every stage has a finite budget, so no system can stay longer
            idle = 0 if graduated or not steps else idle + steps
            if idle > budget:
                raise RuntimeError(
                    f"no system finished within {budget} steps although every stage has a "
                    f"finite budget; this is a bug, please report it with your plan "
                    f"{self.loop.plan!r}"
                )

    def _steps(self, ctx: StepContext, guard: InterruptGuard) -> int:
        """Steps until the cadence books (a fixed ``sync_every`` stays aligned on its
        multiples when a step was cut short), a round is due, a quarantine or a signal;
        returns how many."""
        if not ctx.batch.num_systems:
            return 0
        t0 = time.perf_counter()
        cadence, exit_code = self.cadence, self.loop.plan.exit
        limit = cadence.steps_left(ctx.step)
        to_round = self.transport.steps_left(ctx.step)
        if to_round is not None:
            limit = min(limit, to_round)
        watch_checkpoints = cadence.auto and self.checkpoints is not None
        n = 0
        while n < limit:
            self.step(ctx.batch, ctx)
            n += 1
            due = cadence.after_step(ctx.batch, exit_code, ctx.exited)
            if due or self.loop.evict or guard.received is not None:
                break  # quarantined systems leave before the next forward; signals stop
            if watch_checkpoints and self.checkpoints.pending(ctx.step):
                break
        self.loop.evict = False
        self.stats.steps += n
        self.stats.busy_s += time.perf_counter() - t0
        return n

    def _graduate(self, ctx: StepContext) -> int:
        """Fire ON_CONVERGE, hand the finished systems to the delivery, keep the rest."""
        if not ctx.batch.num_systems:
            return 0
        graduates, ctx.batch = self.loop.take_finished(ctx.batch, ctx)
        if graduates is None:
            return 0
        self.feed.release(graduates)
        self.delivery.deliver(graduates)
        self.stats.graduated += graduates.num_systems
        ctx.graduated_systems = self.stats.graduated
        return graduates.num_systems

    def _admit(self, batch: Batch) -> Batch:
        merged = self.feed.admit(batch)
        if merged is not batch and self.ctx is not None:
            self.ctx.has_fixed = bool(merged.fixed.any())
            self.ctx.constraint_bits = self.loop.constraint_bits = constraint_bits(merged)
        return merged

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Everything a resume needs, from the loop and its components."""
        ctx = self.ctx
        return {
            "step": ctx.step,
            "fingerprint": self.sim.fingerprint,
            "batch": batch_state(ctx.batch),
            "pending": self.loop.pending,
            "graduated": self.stats.graduated,
            "callbacks": callback_states(self.hooks.callbacks),
            "feed": self.feed.state_dict(),
            "delivery": self.delivery.state_dict(),
            "transport": self.transport.state_dict(),
        }

    def _restore(self, state: dict[str, Any]) -> Batch:
        refuse_mismatch(
            state.get("fingerprint"), self.sim.fingerprint, f"checkpoint {state['path']!r}"
        )
        self.feed.load_state_dict(state["feed"])
        self.delivery.load_state_dict(state["delivery"])
        self.transport.load_state_dict(state["transport"])
        restore_callback_states(self.hooks.callbacks, state["callbacks"])
        self.stats.graduated = int(state["graduated"])
        return batch_from_state(state["batch"]).to(device=self.sim.device)
