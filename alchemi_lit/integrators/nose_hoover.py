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

from typing import Any, ClassVar

import torch

from .. import kernels
from ..state import Batch
from ..tensor_ops import per_system
from ..units import fs, kB
from .base import FieldSpec, MDIntegrator, Param, _check_param, as_param
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
        dt = self.dt_tensor(batch)
        self.chain_half_step(batch, mask, 0.5 * dt)
        self.kick_drift_stage(batch, mask, dt)

    def post_update(self, batch: Batch, mask: torch.Tensor) -> None:
        dt = self.dt_tensor(batch)
        self.kick_stage(batch, mask, 0.5 * dt)
        self.chain_half_step(batch, mask, 0.5 * dt)

    # ----------------------------------------------------------------- chain
    def _constants(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``kT [B]``, ``Nf [B]`` and chain masses ``Q [B, M]``."""
        ones = torch.ones(batch.num_systems, dtype=batch.dtype, device=batch.device)
        kt = kB * self.per_system(batch, self.temperature) * ones
        tdamp = self.per_system(batch, self.tdamp) * ones
        nf = batch.degrees_of_freedom()
        q = (kt * tdamp * tdamp).unsqueeze(-1).repeat(1, self.chain_length)
        q[:, 0] = q[:, 0] * nf
        return kt, nf, q.clamp_min(1e-300)

    def chain_half_step(self, batch: Batch, mask: torch.Tensor, delta: Param) -> None:
        """``exp(iL_NHC delta)`` for masked systems: update the chain, scale the
        velocities of their free atoms."""
        if kernels.usable(batch.velocities):  # one compiled pass (kernels.dynamics)
            kt, nf, q = self.kept_constants(  # (kept: the same for every half step)
                batch, "chain", (self.temperature, self.tdamp),
                lambda: [t.numpy() for t in self._constants(batch)],
            )  # fmt: skip
            starts, counts = batch.segments.bounds
            v, eta, p = kernels.load("dynamics").nhc_half_step(
                batch.velocities.numpy(), batch.masses.numpy(), starts, counts, mask.numpy(),
                batch.fixed.numpy(), getattr(batch, self.eta_field).numpy(),
                getattr(batch, self.p_eta_field).numpy(), q, kt, nf,
                kernels.per_system(batch, delta), _SY_WEIGHTS[self.suzuki_yoshida],
                self.chain_steps,
            )  # fmt: skip
            batch.velocities = torch.from_numpy(v)
            setattr(batch, self.eta_field, torch.from_numpy(eta))
            setattr(batch, self.p_eta_field, torch.from_numpy(p))
            return
        kt, nf, q = self._constants(batch)
        seg, v = batch.segments, batch.velocities
        moving = self.moving_atoms(batch, mask)
        mv2 = 2.0 * batch.kinetic_energy(moving)  # tracked as a number and rescaled (MTK)
        eta, p, scale = _chain_half_step(
            mask, getattr(batch, self.eta_field), getattr(batch, self.p_eta_field), q, kt, nf,
            mv2, delta, weights=_SY_WEIGHTS[self.suzuki_yoshida], chain_steps=self.chain_steps,
        )  # fmt: skip
        setattr(batch, self.eta_field, eta)
        setattr(batch, self.p_eta_field, p)
        (scale3,) = seg.to_xyz(scale)
        batch.velocities = self.masked(moving, v * scale3, v)

    def thermostat_energy(self, batch: Batch) -> torch.Tensor:
        """Energy of the chain ``[B]`` (eV); add E_pot + KE for the conserved quantity."""
        kt, nf, q = self._constants(batch)
        eta, p = getattr(batch, self.eta_field), getattr(batch, self.p_eta_field)
        return nf * kt * eta[:, 0] + kt * eta[:, 1:].sum(-1) + (0.5 * p * p / q).sum(-1)

    def conserved_energy(self, batch: Batch) -> torch.Tensor:
        """Extended-system energy ``[B]`` (eV), constant up to integration error."""
        return batch.energy + batch.kinetic_energy() + self.thermostat_energy(batch)


@per_system
def _chain_half_step(
    xp: Any,
    mask: Any,
    old_eta: Any,
    old_p: Any,
    q: Any,
    kt: Any,
    nf: Any,
    mv2: Any,
    delta: Any,
    *,
    weights: tuple[float, ...],
    chain_steps: int,
) -> tuple[Any, Any, Any]:
    """The chain's half step per system (ASE's ``_integrate_nhc``): new ``eta``, ``p_eta``
    (unchanged outside ``mask``) and the velocity scale.  ``xp``: NumPy or torch."""
    m = old_eta.shape[1]
    eta = [old_eta[:, j] for j in range(m)]
    p = [old_p[:, j] for j in range(m)]
    scale = chain_update(xp, eta, p, [q[:, j] for j in range(m)], kt, nf, mv2, delta,
                         weights, chain_steps)  # fmt: skip
    inside = mask[:, None]
    new_eta = xp.where(inside, xp.stack(eta, -1), old_eta)
    new_p = xp.where(inside, xp.stack(p, -1), old_p)
    return new_eta, new_p, xp.where(mask, scale, xp.ones_like(scale))


def chain_update(
    xp: Any,
    eta: list[Any],
    p: list[Any],
    q: list[Any],
    kt: Any,
    nf: Any,
    mv2: Any,
    delta: Any,
    weights: tuple[float, ...],
    chain_steps: int,
) -> Any:
    """ASE's ``_integrate_nhc`` on the chain members ``eta[j]``, ``p[j]`` (updated in
    place) with masses ``q[j]``: per-system ``[B]`` arrays, or one system's numbers in
    the compiled CPU kernel (:mod:`~alchemi_lit.kernels.scalar_xp`).  Returns the
    velocity scale."""
    m = len(p)
    scale = xp.ones_like(kt)
    delta = delta * xp.ones_like(kt)
    for _ in range(chain_steps):
        for w in weights:
            d = w * delta / chain_steps
            for j in range(m - 1, -1, -1):
                _p_eta_step(xp, p, q, j, mv2 - nf * kt, kt, d)
            for j in range(m):
                eta[j] = eta[j] + d * p[j] / q[j]
            s = xp.exp(-d * p[0] / q[0])
            scale = scale * s
            mv2 = mv2 * s * s
            for j in range(m):
                _p_eta_step(xp, p, q, j, mv2 - nf * kt, kt, d)
    return scale


def _p_eta_step(xp: Any, p: list[Any], q: list[Any], j: int, g0: Any, kt: Any, d: Any) -> None:
    """ASE's ``_integrate_p_eta_j``: update chain momentum ``j`` over ``d/2`` in place."""
    m = len(p)
    if j < m - 1:
        p[j] = p[j] * xp.exp(-0.25 * d * p[j + 1] / q[j + 1])
    g = g0 if j == 0 else p[j - 1] * p[j - 1] / q[j - 1] - kt
    p[j] = p[j] + 0.5 * d * g
    if j < m - 1:
        p[j] = p[j] * xp.exp(-0.25 * d * p[j + 1] / q[j + 1])
