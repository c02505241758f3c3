"""Nosé-Hoover chain thermostat (NVT), batched, step for step like ASE's.

Why this splitting: it is the Martyna-Tuckerman-Klein / Tuckerman et al. (2006)
Liouville-operator factorisation used by ``ase.md.nose_hoover_chain.NoseHooverChainNVT``
-- a time-reversible, measure-preserving integrator that conserves the extended
energy, needs one force call per step, and lets us check trajectories against ASE
to round-off.  One step::

    NHC(dt/2)  chain half step, velocities scaled       (pre_update)
    B  v += dt/2 F/m
    A  r += dt v
       -- force call --
    B  v += dt/2 F/m                                    (post_update)
    NHC(dt/2)

Each NHC(dt/2) is ``chain_steps`` multiple-time-step substeps, each split with
``suzuki_yoshida`` (1, 3 or 5) Suzuki-Yoshida weights; ASE uses 3.  Masses as ASE:
``Q_0 = Nf kT tdamp²`` and ``Q_j = kT tdamp²`` with ``Nf = 3 x free atoms``.

Per-system state: ``nhc{M}_eta`` and ``nhc{M}_p_eta`` of shape ``(M,)``, M = chain
length.  The thermostat acts multiplicatively on the velocities, so a system at rest would stay
cold forever; :class:`~.base.MDIntegrator` therefore gives systems that enter with
zero velocities Maxwell-Boltzmann velocities at the target temperature.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from ..state import Batch
from ..tensor_ops import row_dot
from ..units import fs, kB
from .base import FieldSpec, MDIntegrator, Param, _check_param, as_param, system_sum
from .langevin import _fmt

#: Suzuki-Yoshida weights by order (number of sub-steps).
_SY_WEIGHTS = {
    1: (1.0,),
    3: (
        1 / (2 - 2 ** (1 / 3)),
        -(2 ** (1 / 3)) / (2 - 2 ** (1 / 3)),
        1 / (2 - 2 ** (1 / 3)),
    ),
    5: (
        1 / (4 - 4 ** (1 / 3)),
        1 / (4 - 4 ** (1 / 3)),
        1 - 4 / (4 - 4 ** (1 / 3)),
        1 / (4 - 4 ** (1 / 3)),
        1 / (4 - 4 ** (1 / 3)),
    ),
}


class NoseHooverChain(MDIntegrator):
    """NVT with a Nosé-Hoover chain.  ``dt`` and ``tdamp`` in fs, ``temperature`` in K.

    ``chain_length`` thermostats (ASE's ``tchain``), ``chain_steps`` substeps per half
    step (ASE's ``tloop``).  ``temperature``/``tdamp`` may be per-system values.
    """

    fields: ClassVar[dict[str, FieldSpec]] = {}

    def __init__(
        self,
        dt: Param = 1.0,
        temperature: Param = 300.0,
        tdamp: Param = 100.0,
        chain_length: int = 3,
        chain_steps: int = 1,
        suzuki_yoshida: int = 3,
        steps: int = 1000,
    ) -> None:
        owner = type(self).__name__
        # Q ∝ kT: a chain needs a positive temperature (use Langevin/Bussi to cool to 0 K).
        _check_param("temperature (K)", owner, as_param(temperature))
        super().__init__(dt, steps, temperature)
        self.tdamp_fs = _check_param("tdamp (fs)", owner, as_param(tdamp))
        self.tdamp = self.tdamp_fs * fs
        if int(chain_length) < 1 or int(chain_length) != chain_length:
            raise ValueError(f"{owner}: chain_length must be an integer >= 1, got {chain_length}")
        if int(chain_steps) < 1 or int(chain_steps) != chain_steps:
            raise ValueError(f"{owner}: chain_steps must be an integer >= 1, got {chain_steps}")
        if suzuki_yoshida not in _SY_WEIGHTS:
            raise ValueError(f"{owner}: suzuki_yoshida must be 1, 3 or 5, got {suzuki_yoshida}")
        self.chain_length = int(chain_length)
        self.chain_steps = int(chain_steps)
        self.suzuki_yoshida = int(suzuki_yoshida)
        # Fields depend on chain_length (an instance attribute shadows the ClassVar); the
        # length is in their names so chains of different lengths can share a batch.
        self.eta_field = f"nhc{self.chain_length}_eta"
        self.p_eta_field = f"nhc{self.chain_length}_p_eta"
        self.fields = {
            self.eta_field: FieldSpec("system", (self.chain_length,)),
            self.p_eta_field: FieldSpec("system", (self.chain_length,)),
        }

    def __repr__(self) -> str:
        return (
            f"NoseHooverChain(dt={_fmt(self.dt_fs)}, T={_fmt(self.temperature)}, "
            f"steps={self.steps})"
        )

    # ----------------------------------------------------------------- step
    def pre_update(self, batch: Batch, mask: torch.Tensor) -> None:
        am = self.atom_mask(batch, mask)
        dt = self.dt_tensor(batch)
        self.chain_half_step(batch, mask, am, 0.5 * dt)
        self.kick(batch, am, 0.5 * dt)
        self.drift(batch, am, dt)

    def post_update(self, batch: Batch, mask: torch.Tensor) -> None:
        am = self.atom_mask(batch, mask)
        dt = self.dt_tensor(batch)
        self.kick(batch, am, 0.5 * dt)
        self.chain_half_step(batch, mask, am, 0.5 * dt)

    # ----------------------------------------------------------------- chain
    def _constants(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``kT [B]``, ``Nf [B]`` and chain masses ``Q [B, M]``."""
        ones = torch.ones(batch.num_systems, dtype=batch.dtype, device=batch.device)
        kt = kB * self.per_system(batch, self.temperature) * ones
        tdamp = self.per_system(batch, self.tdamp) * ones
        free = (~batch.fixed).to(batch.dtype)
        nf = 3.0 * system_sum(batch, free)
        q = (kt * tdamp * tdamp).unsqueeze(-1).repeat(1, self.chain_length)
        q[:, 0] = q[:, 0] * nf
        return kt, nf, q.clamp_min(1e-300)

    def chain_half_step(
        self, batch: Batch, mask: torch.Tensor, am: torch.Tensor, delta: Param
    ) -> None:
        """``exp(iL_NHC delta)`` for masked systems: update the chain, scale velocities."""
        kt, nf, q = self._constants(batch)
        old_eta, old_p = getattr(batch, self.eta_field), getattr(batch, self.p_eta_field)
        eta, p = list(old_eta.unbind(-1)), list(old_p.unbind(-1))
        m = self.chain_length
        v = batch.velocities
        scale = torch.ones(batch.num_systems, dtype=batch.dtype, device=batch.device)
        # 2 KE is tracked as a number and rescaled with the velocities (MTK)
        mv2 = system_sum(batch, (batch.masses * row_dot(v)) * am)
        delta = delta * torch.ones_like(kt)
        for _ in range(self.chain_steps):
            for w in _SY_WEIGHTS[self.suzuki_yoshida]:
                d = w * delta / self.chain_steps
                for j in reversed(range(m)):
                    _p_eta_step(p, q, j, mv2 - nf * kt, kt, d)
                for j in range(m):
                    eta[j] = eta[j] + d * p[j] / q[:, j]
                s = torch.exp(-d * p[0] / q[:, 0])
                scale = scale * s
                mv2 = mv2 * s * s
                for j in range(m):
                    _p_eta_step(p, q, j, mv2 - nf * kt, kt, d)
        m2 = mask.unsqueeze(-1)
        setattr(batch, self.eta_field, torch.where(m2, torch.stack(eta, -1), old_eta))
        setattr(batch, self.p_eta_field, torch.where(m2, torch.stack(p, -1), old_p))
        scaled = v * scale.index_select(0, batch.system_idx).unsqueeze(-1)
        batch.velocities = torch.where(am.unsqueeze(-1), scaled, v)

    def thermostat_energy(self, batch: Batch) -> torch.Tensor:
        """Energy of the chain ``[B]`` (eV); add E_pot + KE for the conserved quantity."""
        kt, nf, q = self._constants(batch)
        eta, p = getattr(batch, self.eta_field), getattr(batch, self.p_eta_field)
        return nf * kt * eta[:, 0] + kt * eta[:, 1:].sum(-1) + (0.5 * p * p / q).sum(-1)

    def conserved_energy(self, batch: Batch) -> torch.Tensor:
        """Extended-system energy ``[B]`` (eV), constant up to integration error."""
        return batch.energy + batch.kinetic_energy() + self.thermostat_energy(batch)


def _p_eta_step(
    p: list[torch.Tensor], q: torch.Tensor, j: int, g0: torch.Tensor, kt: torch.Tensor, d: Param
) -> None:
    """ASE's ``_integrate_p_eta_j``: update chain momentum ``j`` over ``d/2`` in place."""
    m = len(p)
    if j < m - 1:
        p[j] = p[j] * torch.exp(-0.25 * d * p[j + 1] / q[:, j + 1])
    g = g0 if j == 0 else p[j - 1] * p[j - 1] / q[:, j - 1] - kt
    p[j] = p[j] + 0.5 * d * g
    if j < m - 1:
        p[j] = p[j] * torch.exp(-0.25 * d * p[j + 1] / q[:, j + 1])
