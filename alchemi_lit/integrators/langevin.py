"""Langevin dynamics (NVT) with the BAOAB splitting, batched.

Why BAOAB (Leimkuhler & Matthews, Appl. Math. Res. Express 2013, 34): among the
symmetric splittings of Langevin dynamics it has the smallest error in
configurational averages (exact in the high-friction limit for harmonic systems and
second order otherwise), it needs one force call per step, and its Ornstein-Uhlenbeck
part is solved *exactly*, so it is stable for any friction.  One step::

    B  v += dt/2 F/m          (pre_update)
    A  r += dt/2 v
    O  v  = c1 v + c2 ξ       c1 = exp(-γ dt),  c2 = sqrt((1 - c1²) kT/m)
    A  r += dt/2 v
       -- force call --
    B  v += dt/2 F/m          (post_update)

The Gaussian noise ξ is drawn per atom from the counter-based stream keyed by
``(seed, system_id, total_steps, PURPOSE_NOISE, atom index)``, so a system's
trajectory does not depend on the batch it runs in.  Atoms with ``FixAtoms`` never
move and get no noise.
"""

from __future__ import annotations

import torch

from ..core.state import Batch
from ..core.units import fs
from . import ops
from .md import MDIntegrator, describe
from .params import FRICTION, Param, check_param


class Langevin(MDIntegrator):
    """Langevin NVT with the BAOAB splitting (as ``ase.md.langevinbaoab.LangevinBAOAB``).

    Systems entering with zero velocities get Maxwell-Boltzmann ones.

    Args:
        dt: time step in fs (a number, or one per system as a list indexed by system_id).
        temperature: bath temperature in K, >= 0 (0 K: a quench; a number, or one per system).
        friction: friction coefficient gamma in 1/fs (its inverse is the damping time;
            a number, or one per system).
        steps: the stage's number of steps.
    """

    constraint_drift = 0.5  # B A O A: the last drift is half a step

    def __init__(
        self,
        dt: Param = 1.0,
        temperature: Param = 300.0,
        friction: Param = 0.01,
        steps: int = 1000,
    ) -> None:
        super().__init__(dt, steps, temperature)
        owner = type(self).__name__
        self.friction_fs = check_param("friction", owner, friction, unit="1/fs", usual=FRICTION)
        self.gamma = self.friction_fs / fs  # 1 / (ASE time unit)

    def __repr__(self) -> str:
        dt, t = describe(self.dt_fs), describe(self.temperature)
        return f"Langevin(dt={dt}, T={t}, steps={self.steps})"

    def pre_update(self, batch: Batch, mask: torch.Tensor) -> None:
        ops.baoab_opening(batch, mask, self, self.dt, self.gamma, self.temperature)  # B A O A

    def post_update(self, batch: Batch, mask: torch.Tensor) -> None:
        ops.kick(batch, mask, 0.5 * self.dt)  # B
