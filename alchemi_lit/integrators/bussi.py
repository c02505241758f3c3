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
of all the others -- so a system's noise depends on nothing outside it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import kernels
from .. import random as rng
from ..state import Batch
from ..tensor_ops import per_system
from ..units import fs, kB
from .base import MDIntegrator, Param, _check_param, as_param, system_sum
from .langevin import _fmt


class Bussi(MDIntegrator):
    """Stochastic velocity rescaling NVT.  ``dt``/``taut`` in fs, ``temperature`` in K."""

    def __init__(
        self,
        dt: Param = 1.0,
        temperature: Param = 300.0,
        taut: Param = 100.0,
        steps: int = 1000,
    ) -> None:
        super().__init__(dt, steps, temperature)
        self.taut_fs = _check_param("taut (fs)", type(self).__name__, as_param(taut))
        self.taut = self.taut_fs * fs

    def __repr__(self) -> str:
        return f"Bussi(dt={_fmt(self.dt_fs)}, T={_fmt(self.temperature)}, steps={self.steps})"

    def pre_update(self, batch: Batch, mask: torch.Tensor) -> None:
        dt = self.dt_tensor(batch)
        if kernels.usable(batch.positions, batch.velocities, batch.forces):
            self._compiled_pre_update(batch, mask, dt)
            return
        self.kick_drift_stage(batch, mask, dt, scale=self.alpha(batch))

    def post_update(self, batch: Batch, mask: torch.Tensor) -> None:
        self.kick_stage(batch, mask, 0.5 * self.dt_tensor(batch))

    def alpha(self, batch: Batch) -> torch.Tensor:
        """Velocity scale factor ``[B]`` for this step (1 for systems without kinetic energy)."""
        c, kt = self.thermostat_constants(batch)
        nf = batch.degrees_of_freedom()
        ke = batch.kinetic_energy(~batch.fixed if batch.may_have_fixed_atoms() else None)
        r1, s = bussi_noise(batch, self.seed, self.noise_source())
        return _bussi_alpha(c, kt, nf, ke, r1, s)

    def _compiled_pre_update(self, batch: Batch, mask: torch.Tensor, dt: Param) -> None:
        """The velocity scale and the opening velocity-Verlet half as one compiled CPU
        call (:func:`~alchemi_lit.kernels.dynamics.bussi_kick_drift`), which reads each
        system's noise of this step from the draw ahead."""
        kick, _ = self._kick_constants(batch, 0.5 * dt)
        params = (self.dt, self.taut, self.temperature)
        c, kt = self.kept_constants(
            batch, "bussi", params, lambda: [t.numpy() for t in self.thermostat_constants(batch)]
        )
        constants = (kick, kernels.per_system(batch, dt), batch.masses.numpy(), c, kt)
        opening = kernels.load("dynamics").bussi_kick_drift
        self.compiled_noisy_step(batch, mask, rng.PURPOSE_THERMOSTAT, opening, constants)

    def thermostat_constants(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """``c = exp(-dt/taut)`` and ``kT`` per system ``[B]``."""
        ones = torch.ones(batch.num_systems, dtype=batch.dtype, device=batch.device)
        c = torch.exp(-self.per_system(batch, self.dt) / self.per_system(batch, self.taut) * ones)
        return c, kB * self.per_system(batch, self.temperature) * ones


@per_system
def _bussi_alpha(xp: Any, c: Any, kt: Any, nf: Any, ke: Any, r1: Any, s: Any) -> Any:
    """Eq. A7 per system; 1 where there is no kinetic energy or no free atom."""
    ok = (ke > 0) & (nf > 0)
    one = xp.ones_like(c)
    denom = nf * xp.where(ok, ke, one)
    term = (1.0 - c) * (0.5 * nf * kt) / xp.where(denom > 1e-300, denom, 1e-300)
    a2 = c + term * (s + r1 * r1) + 2.0 * r1 * xp.sqrt(c * term)
    return xp.where(ok, xp.sqrt(xp.where(a2 > 0, a2, 0.0)), one)


def bussi_noise(
    batch: Batch, seed: int, draw: Callable[..., torch.Tensor] = rng.atom_normals
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(R1, S)`` per system ``[B]`` for the current step (see module docstring);
    ``draw`` is :func:`~alchemi_lit.random.atom_normals` or a source of the same
    numbers (:meth:`~alchemi_lit.integrators.base.Integrator.noise_source`)."""
    seg = batch.segments
    local = seg.local_index
    z = draw(
        seed, batch.system_id, batch.total_steps, batch.system_idx, local,
        rng.PURPOSE_THERMOSTAT, batch.dtype,
    )  # fmt: skip
    if not batch.may_have_fixed_atoms():  # the first free atom is each system's first
        r1 = z[:, 0].index_select(0, seg.starts)
        return r1, seg.sum_xyz(z * z) - r1 * r1
    free = ~batch.fixed
    big = torch.iinfo(torch.int64).max
    first = torch.full_like(batch.n_atoms, big).scatter_reduce(
        0, batch.system_idx, torch.where(free, local, big), "amin", include_self=True
    )
    is_first = free & (local == first.index_select(0, batch.system_idx))
    r1 = system_sum(batch, torch.where(is_first, z[:, 0], torch.zeros_like(z[:, 0])))
    sq = z * z
    sq[:, 0] = torch.where(is_first, torch.zeros_like(sq[:, 0]), sq[:, 0])
    s = system_sum(batch, torch.where(free, sq.sum(-1), torch.zeros_like(sq[:, 0])))
    return r1, s
