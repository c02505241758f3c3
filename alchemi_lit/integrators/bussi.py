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

import torch

from .. import random as rng
from ..state import Batch
from ..tensor_ops import row_dot
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
        am = self.atom_mask(batch, mask)
        dt = self.dt_tensor(batch)
        alpha = self.alpha(batch)
        scaled = batch.velocities * alpha.index_select(0, batch.system_idx).unsqueeze(-1)
        batch.velocities = torch.where(am.unsqueeze(-1), scaled, batch.velocities)
        self.kick(batch, am, 0.5 * dt)
        self.drift(batch, am, dt)

    def post_update(self, batch: Batch, mask: torch.Tensor) -> None:
        self.kick(batch, self.moving_atoms(batch, mask), 0.5 * self.dt_tensor(batch))

    def alpha(self, batch: Batch) -> torch.Tensor:
        """Velocity scale factor ``[B]`` for this step (1 for systems without kinetic energy)."""
        ones = torch.ones(batch.num_systems, dtype=batch.dtype, device=batch.device)
        c = torch.exp(-self.per_system(batch, self.dt) / self.per_system(batch, self.taut) * ones)
        free = ~batch.fixed
        nf = 3.0 * system_sum(batch, free.to(batch.dtype))
        kt = kB * self.per_system(batch, self.temperature) * ones
        ke = system_sum(batch, 0.5 * batch.masses * row_dot(batch.velocities) * free)
        r1, s = bussi_noise(batch, self.seed, rng.atom_normals_fn(self.compiled_kernels))
        ok = (ke > 0) & (nf > 0)
        term = (1.0 - c) * (0.5 * nf * kt) / (nf * torch.where(ok, ke, ones)).clamp_min(1e-300)
        a2 = c + term * (s + r1 * r1) + 2.0 * r1 * torch.sqrt(c * term)
        return torch.where(ok, torch.sqrt(a2.clamp_min(0.0)), ones)


def bussi_noise(
    batch: Batch, seed: int, draw: Callable[..., torch.Tensor] = rng.atom_normals
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(R1, S)`` per system ``[B]`` for the current step (see module docstring);
    ``draw`` is :func:`~alchemi_lit.random.atom_normals` or its compiled twin."""
    local = batch.segments.local_index
    z = draw(
        seed, batch.system_id, batch.total_steps, batch.system_idx, local,
        rng.PURPOSE_THERMOSTAT, batch.dtype,
    )  # fmt: skip
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
