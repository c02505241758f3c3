"""The fused step loop: several stages, one batch, ONE model forward per step.

Every step::

    masks = [status == code for each stage]        # no host sync
    each stage: pre_update(batch, its mask)
    one model forward for the whole batch
    each stage: post_update(batch, its mask)
    counters += 1 for systems in a stage
    transitions: a system whose stage exits (criterion met / budget spent) moves to
                 the next status code; the next stage initialises it at once, and an
                 optimizer checks it immediately (ASE checks before its first step),
                 so a system can cross several stages in one step, in plan order.

Nothing here reads a tensor value on the host.  Host work -- ON_CONVERGE callbacks,
graduation of finished systems, refills, termination -- happens in
:class:`~.run_loop.RunLoop`'s bookkeeping (see :mod:`.cadence` for when).

Per-stage history is kept in ``[B, k]`` fields: ``stage_steps`` (steps spent in each
stage), ``stage_exit`` (why each stage was left) and ``stage_energy``, ``stage_volume``,
``stage_pressure`` (energy, volume and pressure when it was left, NaN before:
:mod:`~alchemi_lit.integrators.stage_fields`), so a system's path through the plan is on
record after it leaves the batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .. import kernels
from ..core.constraint_io import declare_fields
from ..core.errors import ConfigError
from ..core.state import (
    EXIT_COMPLETED,
    EXIT_CONVERGED,
    EXIT_MAX_STEPS,
    EXIT_MODEL_ERROR,
    EXIT_RUNNING,
    Batch,
)
from ..core.tensor_ops import kept, may_be_set
from ..integrators import constrain
from ..integrators.stage_fields import EXIT_HISTORY, declare_exit_history, record_stage_exit
from ..integrators.stages import Fused
from ..models.base import Model
from .forward import isolate_failure
from .hooks import HookDispatcher, HookStageEnum, StepContext
from .status import (
    PENDING,
    Countdown,
    StatusMasks,
    failed_exit,
    leaving,
    records_history,
    step_increments,
)

H = HookStageEnum


class FusedLoop:
    """Runs a :class:`~alchemi_lit.integrators.stages.Fused` plan on batches (see module doc)."""

    def __init__(
        self,
        model: Model,
        plan: Fused,
        hooks: HookDispatcher,
        seed: int = 0,
        forward: Callable[..., dict[str, torch.Tensor]] | None = None,
        history_offset: int = 0,
        history_width: int | None = None,
        optimizer_columns: list[int] | None = None,
        stress: bool | None = None,
        carried: Sequence[Any] = (),
    ) -> None:
        """``history_offset``/``history_width`` place this plan's columns in the
        ``stage_steps``/``stage_exit`` history (a pipeline records all ranks' stages);
        ``stress``: compute it in every forward (True), never (False), or where a stage
        or callback needs it (None); ``carried``: band filters of other ranks' stages
        (:class:`~alchemi_lit.integrators.neb.NEB`), whose fields this rank's systems
        carry from the start -- so its stages pass a band's images on unrelaxed, and a
        failing image or endpoint takes its band with it, as in one fused plan."""
        self.model = model
        self.offset = int(history_offset)
        self.width = len(plan) + self.offset if history_width is None else int(history_width)
        self.plan = plan
        self.hooks = hooks
        self.carried = list(carried)
        self.seed = int(seed)
        self.forward = forward or model
        self.optimizer_index = (
            optimizer_columns
            if optimizer_columns is not None
            else [self.offset + i for i, s in enumerate(plan.stages) if s.is_optimizer]
        )
        self._optimizer_columns: torch.Tensor | None = None  # optimizer_index, on the device
        self.num_forward_calls = 0
        self._by_status: tuple[torch.Tensor, int, StatusMasks] | None = None
        self._countdowns: dict[int, Countdown] = {}  # per stage without a criterion (CPU)
        self.pending = False  # set by the strategy when it appended PENDING systems
        self.evict = False  # set when systems were quarantined for a model error
        self.failed: torch.Tensor | None = None  # [B] quarantined by the last forward
        self.constraint_bits = 0  # kinds the batch may carry (the run loop's bookkeeping)
        # stress costs a [P, 3, 3] reduction per step: only when asked for or needed
        needed = [type(s).__name__ for s in plan.stages if getattr(s, "requires_stress", False)]
        needed += [type(c).__name__ for c in hooks.callbacks if getattr(c, "requires_stress", 0)]
        if stress is False and needed:
            raise ConfigError(
                f"{', '.join(needed)} need(s) the stress, but the Simulator has stress=False; "
                f"leave stress at its default (computed where needed)"
            )
        self.needs_stress = bool(needed) or stress is True

    # ----------------------------------------------------------------- setup
    def declare(self, batch: Batch) -> None:
        """Create every field the plan needs on ``batch`` (idempotent)."""
        k = self.width
        for name in ("stage_steps", "stage_exit", *EXIT_HISTORY):  # another plan's history
            if batch.has_field(name) and tuple(getattr(batch, name).shape[1:]) != (k,):
                batch.drop_field(name)
        batch.ensure_field("stage_steps", "system", (k,), torch.int64, 0)
        batch.ensure_field("stage_exit", "system", (k,), torch.int64, EXIT_RUNNING)
        declare_exit_history(batch, k)  # energy, volume, pressure at exit (NaN before)
        declare_fields(batch)  # constraints: on batches holding a constrained system
        for i, stage in enumerate(self.plan.stages):
            stage.setup(batch, self.seed, prefix=f"stage{self.offset + i}")
        for band in self.carried:
            band.declare(batch)

    def start(self, batch: Batch, fresh: torch.Tensor, ctx: StepContext | None = None) -> None:
        """Bring new systems (``fresh`` [B] mask) to the plan's entry with valid forces.

        Their status becomes the entry code, the entry stage initialises them and an
        optimizer entry checks convergence before any step.  The caller must have
        computed forces for them (:meth:`compute`).  With ``ctx``, systems that exit at
        once are marked in ``ctx.exited``/``ctx.converged`` for the next ON_CONVERGE.
        """
        self.enter(batch, fresh)
        self.transitions(batch, ctx)

    def not_quarantined(self, batch: Batch) -> torch.Tensor:
        """``[B]`` mask of the systems the last forward did not quarantine (the ones
        :meth:`start` may bring in after the first evaluation)."""
        ok = torch.ones(batch.num_systems, dtype=torch.bool, device=batch.device)
        return ok if self.failed is None else ok & ~self.failed

    def enter(self, batch: Batch, fresh: torch.Tensor) -> None:
        """Entry-stage initialisation of ``fresh`` systems (no convergence check)."""
        batch.status = torch.where(
            fresh, torch.full_like(batch.status, self.plan.entry), batch.status
        )
        batch.step = torch.where(fresh, torch.zeros_like(batch.step), batch.step)
        batch.exit_code = torch.where(fresh, torch.zeros_like(batch.exit_code), batch.exit_code)
        cols = slice(self.offset, self.offset + len(self.plan))
        batch.stage_steps[:, cols] = batch.stage_steps[:, cols].masked_fill(fresh.unsqueeze(-1), 0)
        batch.stage_exit[:, cols] = batch.stage_exit[:, cols].masked_fill(
            fresh.unsqueeze(-1), EXIT_RUNNING
        )
        self._init(self.plan.stages[0], batch, fresh)

    def _init(self, stage: Any, batch: Batch, mask: torch.Tensor) -> None:
        """``init_systems``, then MD velocities constrained (ASE's ``set_momenta``)."""
        stage.init_systems(batch, mask)
        if self.constraint_bits:
            constrain.after_post_update(batch, [(stage, mask)], self.constraint_bits)

    # ----------------------------------------------------------------- step
    def compute(self, batch: Batch, ctx: StepContext) -> None:
        """One model forward; writes energy, forces and stress, constrained.

        If the model raises, the batch is bisected to find the system(s) it fails on;
        those are quarantined (``EXIT_MODEL_ERROR``, the error text in ``batch.info``)
        and the others get their forces from an evaluation without them.  If every
        system fails on its own, the model -- not a structure -- is broken: re-raised.
        """
        self.failed = None
        try:
            out = self.forward(batch, compute_stress=self.needs_stress)
        except Exception as exc:
            out, failed = isolate_failure(self.model, batch, exc, self.needs_stress)
            batch.status = torch.where(failed, self.plan.exit, batch.status)
            batch.exit_code = torch.where(failed, EXIT_MODEL_ERROR, batch.exit_code)
            self.failed = failed
            ctx.exited = failed if ctx.exited is None else ctx.exited | failed
            self.evict = True  # the run loop removes them before the next forward
        self.num_forward_calls += 1
        forces, energy, stress = constrain.adjust_results(
            batch, out["forces"], out["energy"], out.get("stress"), ctx.has_fixed,
            self.constraint_bits,
        )  # fmt: skip
        # systems that left the plan keep the results they left with until they graduate
        status = self.status_masks(batch)
        done = status.finished
        if status.any_finished:
            forces = torch.where(batch.atom_mask(done).unsqueeze(-1), batch.forces, forces)
            energy = torch.where(done, batch.energy, energy)
            if stress is not None:
                stress = torch.where(done.view(-1, 1, 1), batch.stress, stress)
        batch.forces, batch.energy = forces, energy
        if stress is not None:
            batch.stress = stress
        ctx.outputs = out

    def step(self, batch: Batch, ctx: StepContext) -> None:
        hooks, stages = self.hooks, self.plan.stages
        status = batch.status
        version = status._version
        by_status = self.status_masks(batch)
        masks = by_status.stages
        ctx.stage_masks = masks
        hooks(H.BEFORE_STEP, ctx)
        hooks(H.BEFORE_PRE_UPDATE, ctx)
        # a stage without systems changes nothing (CPU: skipped; accelerators: called)
        active = [(s, m) for s, m, held in zip(stages, masks, by_status.held) if held]
        before = constrain.snapshot(batch, bits) if (bits := self.constraint_bits) else None
        for stage, mask in active:
            stage.pre_update(batch, mask)
        if before is not None:
            constrain.after_pre_update(batch, active, before, bits)
        hooks(H.AFTER_PRE_UPDATE, ctx)
        hooks(H.BEFORE_COMPUTE, ctx)
        self.compute(batch, ctx)
        hooks(H.AFTER_COMPUTE, ctx)
        # A hook that moves systems (NaNGuard quarantining one), or a model failure,
        # writes a new status tensor or writes into it: checked by identity, without
        # reading a value.
        if batch.status is not status or status._version != version:
            self._leave_as_bands(batch, masks)
            kept = [m & (batch.status == c) for m, c in zip(masks, self.plan.codes)]
            left = torch.stack([m & ~k for m, k in zip(masks, kept)]).any(0)
            ctx.exited = left if ctx.exited is None else ctx.exited | left  # for ON_CONVERGE
            masks = kept
            ctx.stage_masks = masks
            active = [(stage, mask) for stage, mask in zip(stages, masks) if may_be_set(mask)]
        hooks(H.BEFORE_POST_UPDATE, ctx)
        for stage, mask in active:
            stage.post_update(batch, mask)
        if bits:
            constrain.after_post_update(batch, active, bits)
        hooks(H.AFTER_POST_UPDATE, ctx)
        inc = by_status.steps if masks is by_status.stages else step_increments(masks)
        before = batch.step
        if kernels.usable(batch.step, batch.total_steps, inc):
            steps = kernels.load("bookkeeping").advance_steps(
                batch.step.numpy(), batch.total_steps.numpy(), inc.numpy()
            )
            batch.step, batch.total_steps = (torch.from_numpy(a) for a in steps)
        else:
            batch.step = batch.step + inc
            batch.total_steps = batch.total_steps + inc
        if self._countdowns:
            self._count_down(before, batch.step)
        if self.pending:  # systems that joined at the last refill got their forces just now
            self.enter(batch, batch.status == PENDING)
            self.pending = False
        self.transitions(batch, ctx)
        hooks(H.AFTER_STEP, ctx)
        ctx.step += 1

    def _leave_as_bands(self, batch: Batch, masks: list[torch.Tensor]) -> None:
        """Systems just quarantined take the rest of their nudged elastic band with them
        (a band stage's ``band`` filter, :mod:`~alchemi_lit.integrators.neb`)."""
        bands = [s.band for s in self.plan.stages if getattr(s, "band", None) is not None]
        bands += self.carried
        if bands:
            left = torch.stack([m & (batch.status != c) for m, c in zip(masks, self.plan.codes)])
            for band in bands:
                band.quarantine_bands(batch, left.any(0), self.plan.exit)

    def status_masks(self, batch: Batch) -> StatusMasks:
        """The masks of each stage's systems and of finished ones, recomputed only when
        the status tensor is replaced or written to: systems change stage at a few steps
        of thousands, and every step reads these several times."""
        self._by_status = kept(self._by_status, batch.status, self._masks_of)
        return self._by_status[2]

    def forget_masks(self) -> None:
        """Drop the kept status masks (recomputed at the next use)."""
        self._by_status = None

    def _masks_of(self, status: torch.Tensor) -> StatusMasks:
        stages = [status == code for code in self.plan.codes]
        finished = status == self.plan.exit
        held = [may_be_set(m) for m in stages]
        return StatusMasks(stages, held, step_increments(stages), finished, may_be_set(finished))

    def _count_down(self, before: torch.Tensor, after: torch.Tensor) -> None:
        """The step counters went from ``before`` to ``after``, one more for every system
        of a stage: each countdown made on ``before`` (untouched since) is one step
        shorter; any other is dropped."""
        for i, c in list(self._countdowns.items()):
            if c.step is before and c.step_version == before._version:
                self._countdowns[i] = c._replace(
                    step=after, step_version=after._version, left=c.left - 1
                )
            else:
                del self._countdowns[i]

    def transitions(self, batch: Batch, ctx: StepContext | None = None) -> None:
        """Move systems whose stage exited to the next code (in plan order)."""
        plan = self.plan
        for i, stage in enumerate(plan.stages):
            mask = self.status_masks(batch).stages[i]  # (after the stage before moved some)
            conv = stage.converged(batch)
            countdown = self._countdowns.get(i)
            if conv is None and countdown is not None and countdown.holds(batch, stage.max_steps):
                continue  # an MD stage's systems all have steps left: no exit test
            leave, anyone, left = leaving(batch, stage.max_steps, mask, conv)
            if conv is None and not anyone and left is not None:
                step, status = batch.step, batch.status
                self._countdowns[i] = Countdown(
                    step, step._version, status, status._version, stage.max_steps, left
                )
            if stage.criterion is not None and records_history(stage.criterion):
                stage.criterion.update(batch, mask & ~leave)
            if not anyone:  # nobody leaves: nothing below would change a value
                continue
            done_conv = mask & conv if conv is not None else torch.zeros_like(leave)
            reason = torch.full_like(batch.exit_code, EXIT_COMPLETED)
            if stage.is_optimizer:
                reason = torch.where(done_conv, EXIT_CONVERGED, EXIT_MAX_STEPS)
                batch.velocities = batch.velocities.masked_fill(
                    batch.atom_mask(leave).unsqueeze(-1), 0.0
                )
            col = self.offset + i
            batch.stage_exit[:, col] = torch.where(leave, reason, batch.stage_exit[:, col])
            batch.stage_steps[:, col] = torch.where(leave, batch.step, batch.stage_steps[:, col])
            record_stage_exit(batch, col, leave, self.needs_stress)
            batch.exit_code = torch.where(leave, reason, batch.exit_code)
            if stage.is_optimizer:
                batch.converged = self._all_optimizers_converged(batch, leave, batch.converged)
            batch.status = torch.where(leave, plan.next_code(i), batch.status)
            batch.step = batch.step.masked_fill(leave, 0)
            if ctx is not None:
                ctx.exited = leave if ctx.exited is None else ctx.exited | leave
                ctx.converged = done_conv if ctx.converged is None else ctx.converged | done_conv
            if i + 1 < len(plan):
                self._init(plan.stages[i + 1], batch, leave)

    def _all_optimizers_converged(
        self, batch: Batch, leave: torch.Tensor, current: torch.Tensor
    ) -> torch.Tensor:
        """``converged`` = every optimizer stage visited so far met its criterion."""
        cols = self._optimizer_columns
        if cols is None or cols.device != batch.device:  # (indexing by a list copies it
            cols = torch.tensor(self.optimizer_index, device=batch.device)  # to the device
            self._optimizer_columns = cols  # at every call: a sync, and no CUDA graph)
        ex = batch.stage_exit.index_select(1, cols)
        ok = ((ex == EXIT_CONVERGED) | (ex == EXIT_RUNNING)).all(-1) & (ex != EXIT_RUNNING).any(-1)
        return torch.where(leave, ok, current)

    def finished(self, batch: Batch) -> torch.Tensor:
        """``[B]`` mask of systems at the exit code."""
        return batch.status == self.plan.exit

    # ----------------------------------------------------------------- batch surgery
    def take_finished(self, batch: Batch, ctx: StepContext) -> tuple[Batch | None, Batch]:
        """Host bookkeeping: fire ON_CONVERGE for systems that left a stage, then split off
        the finished systems.  Returns ``(graduates or None, remaining batch)``."""
        finished = self.finished(batch)
        ctx.graduated = finished
        if ctx.exited is not None and self.hooks.has(H.ON_CONVERGE) and bool(ctx.exited.any()):
            self.hooks(H.ON_CONVERGE, ctx)
        ctx.exited = ctx.converged = None
        ctx.graduated = None
        if not bool(finished.any()):
            return None, batch
        graduates = batch.select(finished.nonzero().flatten())
        graduates.converged = graduates.converged & ~failed_exit(graduates.exit_code)
        return graduates, self.keep_rows(batch, (~finished).nonzero().flatten())

    def keep_rows(self, batch: Batch, keep: torch.Tensor) -> Batch:
        """``batch`` reduced to rows ``keep``; neighbour lists carried over, not rebuilt."""
        new = batch.select(keep)
        self.model.neighbors.remap(batch.ptr, keep, new)
        return new

    def append(self, batch: Batch, fresh: list[Batch]) -> Batch:
        """Append new systems as PENDING: the next step's forward computes their forces
        and they enter the plan right after it (no extra model call)."""
        for f in fresh:
            self.declare(f)
            f.status.fill_(PENDING)
            f.step.zero_()
        parts = ([batch] if batch.num_systems else []) + list(fresh)
        merged = Batch.concatenate(parts) if len(parts) > 1 else parts[0].clone()
        new_rows = merged.num_systems - batch.num_systems
        old_rows = torch.cat(
            [
                torch.arange(batch.num_systems, device=merged.device),
                torch.full((new_rows,), -1, dtype=torch.long, device=merged.device),
            ]
        )
        self.model.neighbors.remap(batch.ptr, old_rows, merged)
        self.pending = True
        return merged
