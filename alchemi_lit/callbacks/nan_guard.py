"""NaNGuard: quarantine systems whose energy, forces or positions turn non-finite.

**Modifies state.**  Before every step it keeps a copy of positions, velocities,
forces and energy; after the force call, a system with a non-finite value gets its
last finite state back, its status set to the exit code (it stops moving and leaves
with the next graduation) and ``exit_code = EXIT_QUARANTINED``.  ``nan_flags``
records why: bit 1 energy, bit 2 forces, bit 4 positions.  Other systems are not
touched and the step loop never waits on the host.
"""

from __future__ import annotations

import torch

from ..hooks import Callback, StepContext
from ..state import EXIT_QUARANTINED
from ..tensor_ops import may_be_set

NAN_ENERGY, NAN_FORCES, NAN_POSITIONS = 1, 2, 4


class NaNGuard(Callback):
    """Quarantine non-finite systems (see module docstring).  Added by default."""

    modifies_state = True

    def __init__(self) -> None:
        super().__init__(frequency=1)
        self._saved: tuple[torch.Tensor, ...] | None = None

    def on_run_start(self, ctx: StepContext) -> None:
        ctx.batch.ensure_field("nan_flags", "system", dtype=torch.int64, fill=0)

    def before_pre_update(self, ctx: StepContext) -> None:
        b = ctx.batch
        b.ensure_field("nan_flags", "system", dtype=torch.int64, fill=0)
        self._saved = (
            b.positions.clone(),
            b.velocities.clone(),
            b.forces.clone(),
            b.energy.clone(),
        )

    def after_compute(self, ctx: StepContext) -> None:
        b = ctx.batch
        if self._saved is None or self._saved[0].shape != b.positions.shape:
            return
        # A NaN or inf anywhere in a system makes its sum of squares non-finite, so one
        # sum over forces and positions (plus the energy) finds every broken system;
        # which quantity broke is worked out only when one did.  (A component above
        # ~1e154 overflows the square and counts as broken, too.)
        seg = b.segments
        squares = torch.addcmul(b.forces * b.forces, b.positions, b.positions)
        bad = ~torch.isfinite(seg.sum_xyz(squares) + b.energy)
        bad &= b.status != ctx.state["exit_code"]  # already out: leave as is
        if not may_be_set(bad):
            return
        flags = (
            (~torch.isfinite(b.energy)).long() * NAN_ENERGY
            + (~torch.isfinite(seg.sum_xyz(b.forces * b.forces))).long() * NAN_FORCES
            + (~torch.isfinite(seg.sum_xyz(b.positions * b.positions))).long() * NAN_POSITIONS
        )
        am = b.atom_mask(bad).unsqueeze(-1)
        pos, vel, frc, en = self._saved
        b.positions = torch.where(am, pos, b.positions)
        b.velocities = torch.where(am, vel, b.velocities)
        b.forces = torch.where(am, frc, b.forces)
        b.energy = torch.where(bad, en, b.energy)
        b.nan_flags = torch.where(bad, flags, b.nan_flags)
        b.exit_code = torch.where(bad, EXIT_QUARANTINED, b.exit_code)
        b.status = torch.where(bad, ctx.state["exit_code"], b.status)

    def on_run_end(self, ctx: StepContext) -> None:
        self._saved = None
