"""Bussi-Donadio-Parrinello stochastic velocity rescaling (NVT), batched.

Why: it samples the canonical ensemble exactly like a Langevin thermostat but acts on
one collective variable (the kinetic energy), so the dynamics is perturbed far less
(diffusion, vibrational spectra) and the perturbation does not grow with system size.
Bussi, Donadio & Parrinello, J. Chem. Phys. 126, 014101 (2007).

Same order as ``ase.md.bussi.Bussi``: at the start of each step the velocities are
scaled by ``alpha`` (the exact solution of the kinetic-energy SDE over ``dt``, eq. A7),
then one velocity-Verlet step follows.  With ``c = exp(-dt/taut)``,
``K_t = Nf kT/2`` and ``Nf = 3 x free atoms`` (ASE's count)::

    alpha² = c + (1 - c) K_t/(Nf K) (R1² + S) + 2 R1 sqrt(c (1 - c) K_t/(Nf K))

``R1`` is one standard normal and ``S`` a sum of ``Nf - 1`` squared normals.  All of
them come from the counter-based stream (3 per free atom, ``PURPOSE_THERMOSTAT``):
``R1`` is the first component of the first free atom and ``S`` the sum of the squares
of all the others -- so a system's noise depends on nothing outside it
(:func:`~.ops.bussi_noise`; the factor: :func:`~.formulas.bussi_alpha`).
"""

from __future__ import annotations

import torch

from ..core.state import Batch
from ..core.units import fs
from . import ops
from .md import MDIntegrator, describe
from .params import Param


class Bussi(MDIntegrator):
    """Stochastic velocity rescaling NVT (as ``ase.md.bussi.Bussi``).

    Args:
        dt: time step in fs (a number, or one per system as a list indexed by system_id).
        temperature: bath temperature in K, >= 0 (0 K: a quench; a number, or one per system).
        taut: coupling time in fs, >= 2 dt: how fast the kinetic energy relaxes to the bath's.
        steps: the stage's number of steps.
    """

    def __init__(
        self,
        dt: Param = 1.0,
        temperature: Param = 300.0,
        taut: Param = 100.0,
        steps: int = 1000,
    ) -> None:
        super().__init__(dt, steps, temperature)
        self.taut_fs = self.time_constant("taut", taut)
        self.taut = self.taut_fs * fs

    def __repr__(self) -> str:
        dt, t = describe(self.dt_fs), describe(self.temperature)
        return f"Bussi(dt={dt}, T={t}, steps={self.steps})"

    def pre_update(self, batch: Batch, mask: torch.Tensor) -> None:
        ops.bussi_opening(batch, mask, self, self.dt, self.taut, self.temperature)

    def post_update(self, batch: Batch, mask: torch.Tensor) -> None:
        ops.kick(batch, mask, 0.5 * self.dt)
