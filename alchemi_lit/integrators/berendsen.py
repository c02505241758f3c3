"""Berendsen weak-coupling thermostat (NVT), batched, step for step like ASE's.

Why: the simplest, smoothest way to bring systems to a temperature (equilibration,
annealing ramps).  It relaxes the kinetic temperature exponentially towards the
target with time constant ``taut`` but suppresses its fluctuations, so it does NOT
sample the canonical ensemble; use Langevin, Bussi or NoseHooverChain for production.
Berendsen et al., J. Chem. Phys. 81, 3684 (1984).

Same order as ``ase.md.nvtberendsen.NVTBerendsen``: velocities scaled by
``lambda = sqrt(1 + (T0/T - 1) dt/taut)`` (clamped to [0.9, 1.1]), half kick, the
mean momentum removed (``fixcm``), drift; force call; half kick.
"""

from __future__ import annotations

import torch

from ..core.state import Batch
from ..core.units import fs
from . import ops
from .md import MDIntegrator, describe
from .params import Param


class Berendsen(MDIntegrator):
    """Berendsen NVT (as ``ase.md.nvtberendsen.NVTBerendsen``); not canonical.

    Args:
        dt: time step in fs (a number, or one per system as a list indexed by system_id).
        temperature: target temperature in K, >= 0 (0 K: a quench; a number, or one per system).
        taut: coupling time in fs, >= 2 dt: how fast the temperature relaxes to the target.
        steps: the stage's number of steps.
        fixcm: remove each system's mean momentum every step (as ASE).
    """

    def __init__(
        self,
        dt: Param = 1.0,
        temperature: Param = 300.0,
        taut: Param = 100.0,
        steps: int = 1000,
        fixcm: bool = True,
    ) -> None:
        super().__init__(dt, steps, temperature)
        self.taut_fs = self.time_constant("taut", taut)
        self.taut = self.taut_fs * fs
        self.fixcm = bool(fixcm)

    def __repr__(self) -> str:
        dt, t = describe(self.dt_fs), describe(self.temperature)
        return f"Berendsen(dt={dt}, T={t}, steps={self.steps})"

    def pre_update(self, batch: Batch, mask: torch.Tensor) -> None:
        am = ops.atom_mask(batch, mask)
        am3 = am.unsqueeze(-1)
        lam = self.scale_factor(batch)
        scaled = batch.velocities * lam.index_select(0, batch.system_idx).unsqueeze(-1)
        batch.velocities = torch.where(am3, scaled, batch.velocities)
        ops.kick(batch, mask, 0.5 * self.dt)
        if self.fixcm:  # ASE: p -= sum(p) / N over the (free) atoms
            m = batch.masses.unsqueeze(-1)
            p_sum = ops.system_sum(batch, torch.where(am3, m * batch.velocities, 0.0))
            n = ops.system_sum(batch, am.to(batch.dtype)).clamp_min(1.0)
            v = batch.velocities - (p_sum / n.unsqueeze(-1)).index_select(0, batch.system_idx) / m
            batch.velocities = torch.where(am3, v, batch.velocities)
        ops.drift(batch, mask, self.dt)

    def post_update(self, batch: Batch, mask: torch.Tensor) -> None:
        ops.kick(batch, mask, 0.5 * self.dt)

    def scale_factor(self, batch: Batch) -> torch.Tensor:
        """``lambda [B]``; a system at 0 K is heated at the maximum rate (as ASE)."""
        ones = torch.ones(batch.num_systems, dtype=batch.dtype, device=batch.device)
        t0 = ops.per_system(batch, self.temperature) * ones
        ratio = ops.per_system(batch, self.dt) / ops.per_system(batch, self.taut) * ones
        t = batch.temperature()
        at_rest = torch.where(t0 > 0, ones * 1e6, ones)  # T0/0: clamped to 1.1 below
        rel = torch.where(t > 0, t0 / torch.where(t > 0, t, ones), at_rest)
        lam = torch.sqrt((1.0 + (rel - 1.0) * ratio).clamp_min(0.0))
        return lam.clamp(0.9, 1.1)
