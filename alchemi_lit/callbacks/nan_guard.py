"""NaNGuard: quarantine systems whose energy, forces, positions or cell turn non-finite.

**Modifies state.**  Before every step it keeps positions, velocities, forces, energy,
cell and stress (and a cell stage's reference cell and cell velocities,
:data:`~alchemi_lit.integrators.stage_fields.CELL_STATE`); after the force call, a system with
a non-finite value gets its last finite state back, its status set to the exit code (it
stops moving and leaves with the next graduation) and ``exit_code = EXIT_QUARANTINED``.
``nan_flags`` records why: bit 1 energy, bit 2 forces, bit 4 positions, bit 8 cell.
Other systems are not touched and the step loop never waits on the host.  The cell is
tested only in steps that replaced or wrote it (cell relaxations, barostats).

Why it costs almost nothing per step: integrators and models replace the batch's
tensors rather than writing into them (the integrator contract), so the guard keeps
*references* to the old tensors, not copies, and checks their version counters to
know they are intact.  An integrator that does write in place is detected that way;
from then on the guard copies the tensors every step instead (and says so once).
On CPU one finiteness test of three sums clears a healthy batch before any
per-system work; on an accelerator the per-system test runs every step, branch-free.
"""

from __future__ import annotations

import torch
from loguru import logger

from .. import kernels
from ..core.state import EXIT_QUARANTINED, Batch
from ..core.tensor_ops import host_reads_free, may_be_set
from ..engine.hooks import Callback, StepContext
from ..integrators.stage_fields import CELL_STATE

NAN_ENERGY, NAN_FORCES, NAN_POSITIONS, NAN_CELL = 1, 2, 4, 8
_ATOM_KEPT = ("positions", "velocities", "forces")
_SYSTEM_KEPT = ("energy", "cell", "stress")
_CELL = len(_ATOM_KEPT) + 1  # where the cell sits in the kept tensors


class NaNGuard(Callback):
    """Quarantine non-finite systems (see module docstring).  Added by default."""

    modifies_state = True
    graph_safe = True  # (its accelerator branch is branch-free device work)

    def __init__(self) -> None:
        super().__init__(every=1)
        self._saved: tuple[torch.Tensor, ...] | None = None
        self._names: tuple[str, ...] = ()  # the system fields kept, after the atoms'
        self._versions: tuple[int, ...] = ()
        self._copy = False  # set once an in-place writer was seen

    def on_run_start(self, ctx: StepContext) -> None:
        ctx.batch.ensure_field("nan_flags", "system", dtype=torch.int64, fill=0)

    def before_pre_update(self, ctx: StepContext) -> None:
        b = ctx.batch
        if "nan_flags" not in b.system:  # (a batch refilled since on_run_start)
            b.ensure_field("nan_flags", "system", dtype=torch.int64, fill=0)
        atom, system = b.atom, b.system  # (the stores themselves: read every step)
        names = _SYSTEM_KEPT + tuple(n for n in CELL_STATE if n in system)
        kept = (atom["positions"], atom["velocities"], atom["forces"])
        kept += tuple(system[n] for n in names)
        if self._copy:
            kept = tuple(t.clone() for t in kept)
        self._saved, self._names = kept, names
        self._versions = tuple(t._version for t in kept)

    def after_compute(self, ctx: StepContext) -> None:
        b = ctx.batch
        saved = self._saved
        if saved is None or saved[0].shape != b.positions.shape:
            return
        intact = self._check_intact(saved)
        cell = b.cell  # tested only where this step replaced or wrote it
        cell_moved = cell is not saved[_CELL] or cell._version != self._versions[_CELL]
        if not _may_be_non_finite(b) and not (cell_moved and _may_be_non_finite_cell(cell)):
            return  # CPU: a healthy batch costs three sums
        # A NaN or inf anywhere in a system makes its sum of squares non-finite, so one
        # sum over forces and positions (plus the energy and a moved cell) finds every
        # broken system; which quantity broke is worked out only when one did.  (A
        # component above ~1e154 overflows the square and counts as broken, too.)
        seg = b.segments
        squares = torch.addcmul(b.forces * b.forces, b.positions, b.positions)
        total = seg.sum_xyz(squares) + b.energy
        if cell_moved:
            total = total + (cell * cell).sum((-2, -1))
        bad = ~torch.isfinite(total)
        bad &= b.status != ctx.state["exit_code"]  # already out: leave as is
        if not may_be_set(bad):
            return
        flags = (
            (~torch.isfinite(b.energy)).long() * NAN_ENERGY
            + (~torch.isfinite(seg.sum_xyz(b.forces * b.forces))).long() * NAN_FORCES
            + (~torch.isfinite(seg.sum_xyz(b.positions * b.positions))).long() * NAN_POSITIONS
            + (~torch.isfinite(cell).flatten(1).all(1)).long() * NAN_CELL
        )
        if intact:  # otherwise the last finite state is gone: quarantined as they are
            self._restore(b, bad, saved)
        b.nan_flags = torch.where(bad, flags, b.nan_flags)
        b.exit_code = torch.where(bad, EXIT_QUARANTINED, b.exit_code)
        b.status = torch.where(bad, ctx.state["exit_code"], b.status)

    def _restore(self, b: Batch, bad: torch.Tensor, saved: tuple[torch.Tensor, ...]) -> None:
        """The kept state of the systems of ``bad`` ``[B]`` back into the batch."""
        am = b.atom_mask(bad).unsqueeze(-1)
        for name, old in zip(_ATOM_KEPT, saved):
            if b.atom[name] is not old:  # (the same tensor: nothing to restore)
                setattr(b, name, torch.where(am, old, b.atom[name]))
        for name, old in zip(self._names, saved[len(_ATOM_KEPT) :]):
            now = b.system.get(name)
            # a field the step left alone keeps its identity (the neighbour list tells an
            # unchanged cell by it, without reading it: docs/design/16-*.md)
            if now is not None and now is not old and now.shape == old.shape:
                setattr(b, name, torch.where(bad.view(-1, *[1] * (old.dim() - 1)), old, now))

    def _check_intact(self, saved: tuple[torch.Tensor, ...]) -> bool:
        """Whether the kept tensors still hold the step's starting state; switches to
        copying when something wrote into them."""
        for t, v in zip(saved, self._versions):  # (a plain loop: every step)
            if t._version != v:
                break
        else:
            return True
        kept = _ATOM_KEPT + self._names
        names = [n for n, t, v in zip(kept, saved, self._versions) if t._version != v]
        logger.warning(
            f"NaNGuard: {', '.join(names)} written in place during a step (an integrator "
            f"or model not following the integrator contract); copying them every step "
            f"from now on so non-finite systems can still be restored"
        )
        self._copy = True
        return False

    def on_run_end(self, ctx: StepContext) -> None:
        self._saved = None


def _may_be_non_finite(b: Batch) -> bool:
    """False when every force, position and energy is known finite at no cost: on CPU
    from one test of their sums (NaN and inf propagate through a sum; a force component
    above ~1e154 overflows its square and is sent to the per-system test, which counts
    it as broken); on an accelerator always True, and the per-system test runs
    branch-free."""
    forces, positions, energy = b.forces, b.positions, b.energy
    if kernels.usable(forces, positions, energy):  # the same sum, one compiled pass
        check = kernels.load("reductions").finite_total
        return not check(forces.numpy(), positions.numpy(), energy.numpy())
    if not host_reads_free(forces):
        return True
    total = b.force_sq_norms().sum() + b.positions.sum() + b.energy.sum()  # (|F|^2: shared)
    return not bool(torch.isfinite(total))


def _may_be_non_finite_cell(cell: torch.Tensor) -> bool:
    """False when every cell is known finite at no cost (CPU: one sum); else True."""
    if not host_reads_free(cell):
        return True
    return not bool(torch.isfinite(cell.sum()))
