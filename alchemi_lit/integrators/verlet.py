"""Velocity Verlet (NVE), the reference symplectic integrator.

Same update as ``ase.md.VelocityVerlet``: half kick with the current forces, drift,
new forces, half kick.  The current forces are always valid at the start of a step
because the Simulator evaluates the model once before the first step.
"""

from __future__ import annotations

import torch

from ..state import Batch
from .base import MDIntegrator, Param


class VelocityVerlet(MDIntegrator):
    """NVE molecular dynamics; ``dt`` in fs.  ``temperature`` only seeds velocities."""

    def __init__(
        self, dt: Param = 1.0, steps: int = 1000, temperature: Param | None = None
    ) -> None:
        super().__init__(dt, steps, temperature)

    def __repr__(self) -> str:
        return f"VelocityVerlet(dt={self.dt_fs}, steps={self.steps})"

    def pre_update(self, batch: Batch, mask: torch.Tensor) -> None:
        self.kick_drift_stage(batch, mask, self.dt_tensor(batch))

    def post_update(self, batch: Batch, mask: torch.Tensor) -> None:
        self.kick_stage(batch, mask, 0.5 * self.dt_tensor(batch))
