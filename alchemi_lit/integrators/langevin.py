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

import math

import numpy as np
import torch

from .. import kernels
from .. import random as rng
from ..state import Batch
from ..units import fs, kB
from .base import MDIntegrator, Param, _check_param, as_param, per_atom


class Langevin(MDIntegrator):
    """Langevin NVT (BAOAB).  ``dt`` in fs, ``temperature`` in K, ``friction`` in 1/fs.

    ``temperature`` and ``friction`` may be per-system lists/tensors indexed by
    ``system_id``.  Systems entering with zero velocities get Maxwell-Boltzmann ones.
    """

    def __init__(
        self,
        dt: Param = 1.0,
        temperature: Param = 300.0,
        friction: Param = 0.01,
        steps: int = 1000,
    ) -> None:
        super().__init__(dt, steps, temperature)
        self.friction_fs = _check_param("friction (1/fs)", type(self).__name__, as_param(friction))
        self.gamma = self.friction_fs / fs  # 1 / (ASE time unit)

    def __repr__(self) -> str:
        return f"Langevin(dt={_fmt(self.dt_fs)}, T={_fmt(self.temperature)}, steps={self.steps})"

    def pre_update(self, batch: Batch, mask: torch.Tensor) -> None:
        dt = self.dt_tensor(batch)
        if kernels.usable(batch.positions, batch.velocities, batch.forces):
            self._compiled_pre_update(batch, mask, dt)
            return
        moving = self.moving_atoms(batch, mask)
        self.kick(batch, moving, 0.5 * dt)  # B
        self.drift(batch, moving, 0.5 * dt)  # A
        self.ornstein_uhlenbeck(batch, moving, dt)  # O
        self.drift(batch, moving, 0.5 * dt)  # A

    def post_update(self, batch: Batch, mask: torch.Tensor) -> None:
        self.kick_stage(batch, mask, 0.5 * self.dt_tensor(batch))  # B

    def ornstein_uhlenbeck(self, batch: Batch, moving: torch.Tensor | None, dt: Param) -> None:
        """Exact OU update ``v = c1 v + c2 ξ`` over ``dt`` for the atoms ``moving``."""
        c1, sigma = self.ou_coefficients(batch, dt)
        xi = self.normals(batch, rng.PURPOSE_NOISE)
        v = torch.addcmul(self.per_xyz(batch, c1) * batch.velocities, sigma, xi)
        batch.velocities = self.masked(moving, v, batch.velocities)

    def ou_coefficients(self, batch: Batch, dt: Param) -> tuple[Param, torch.Tensor]:
        """The OU update's ``c1 = exp(-γ dt)`` per system (a number when every parameter
        is one) and ``c2 = sqrt((1 - c1²) kT / m)`` per atom component ``[N, 3]``."""
        gamma = self.per_system(batch, self.gamma)
        kt = kB * self.per_system(batch, self.temperature)
        if isinstance(gamma * dt * kt, torch.Tensor):
            c1 = torch.exp(-gamma * dt * torch.ones_like(batch.energy))
            spread = torch.sqrt((1.0 - c1 * c1) * kt)
            return c1, self.per_xyz(batch, spread) * batch.segments.atom_xyz(batch.masses).rsqrt()
        c1 = math.exp(-gamma * dt)
        spread = math.sqrt((1.0 - c1 * c1) * kt)
        sigma = batch.segments.derived_xyz(  # kept for the run
            batch.masses, ("sigma", spread), lambda m: spread * m.rsqrt()
        )
        return c1, sigma

    def _compiled_pre_update(self, batch: Batch, mask: torch.Tensor, dt: Param) -> None:
        """B, A, O, A as one compiled CPU call (:mod:`alchemi_lit.kernels.dynamics`),
        which also picks each system's noise of this step from the draw ahead."""
        params = (self.dt, self.gamma, self.temperature)
        constants = self.kept_constants(
            batch, "baoab", params, lambda: self._half_step_constants(batch, dt)
        )
        half_step = kernels.load("dynamics").baoab_first_half
        self.compiled_noisy_step(batch, mask, rng.PURPOSE_NOISE, half_step, constants)

    def _half_step_constants(self, batch: Batch, dt: Param) -> tuple[np.ndarray, ...]:
        """The compiled half step's ``dt / 2m`` per atom, ``dt / 2`` and ``c1`` per
        system and the noise amplitude per atom."""
        c1, sigma = self.ou_coefficients(batch, dt)
        return (
            per_atom(self.kick_factors(batch, 0.5 * dt)), kernels.per_system(batch, 0.5 * dt),
            kernels.per_system(batch, c1), per_atom(sigma),
        )  # fmt: skip


def _fmt(value: Param | None) -> str:
    """Short text for a parameter: a number, or ``per-system`` for tensors."""
    if isinstance(value, torch.Tensor):
        return "per-system"
    return repr(float(value)) if value is not None else "None"
