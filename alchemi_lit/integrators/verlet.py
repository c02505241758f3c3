"""Velocity Verlet (NVE), the reference symplectic integrator.

Same update as ``ase.md.VelocityVerlet``: half kick with the current forces, drift,
new forces, half kick.  The current forces are always valid at the start of a step
because the Simulator evaluates the model once before the first step.
"""

from __future__ import annotations

import torch

from ..core.state import Batch
from . import ops
from .md import MDIntegrator, describe
from .params import Param


class VelocityVerlet(MDIntegrator):
    """NVE molecular dynamics (velocity Verlet, as ``ase.md.VelocityVerlet``).

    Args:
        dt: time step in fs (a number, or one per system).
        steps: the stage's number of steps.
        temperature: K; only seeds Maxwell-Boltzmann velocities for systems that enter
            at rest (None: they stay at rest).
    """

    def __init__(
        self, dt: Param = 1.0, steps: int = 1000, temperature: Param | None = None
    ) -> None:
        super().__init__(dt, steps, temperature)

    def __repr__(self) -> str:
        return f"VelocityVerlet(dt={describe(self.dt_fs)}, steps={self.steps})"

    def pre_update(self, batch: Batch, mask: torch.Tensor) -> None:
        ops.kick_drift(batch, mask, self.dt)

    def post_update(self, batch: Batch, mask: torch.Tensor) -> None:
        ops.kick(batch, mask, 0.5 * self.dt)
