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
``Q_0 = Nf kT tdamp²`` and ``Q_j = kT tdamp²`` with ``Nf = 3 x free atoms``
(:func:`~.ops.chain_constants`; the chain itself: :func:`~.formulas.chain_half_step`).

Per-system state: ``nhc{M}_eta`` and ``nhc{M}_p_eta`` of shape ``(M,)``, M = chain
length.  The thermostat acts multiplicatively on the velocities, so a system at rest
would stay cold forever; :class:`~.md.MDIntegrator` therefore gives systems that enter
with zero velocities Maxwell-Boltzmann velocities at the target temperature.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from ..core.state import Batch
from ..core.units import fs
from . import ops
from .base import FieldSpec
from .formulas import SUZUKI_YOSHIDA
from .md import MDIntegrator, describe
from .params import Param, check_count


class NoseHooverChain(MDIntegrator):
    """NVT with a Nosé-Hoover chain (as ``ase.md.nose_hoover_chain.NoseHooverChainNVT``).

    Args:
        dt: time step in fs (a number, or one per system as a list indexed by system_id).
        temperature: bath temperature in K, > 0: the chain's masses are ``∝ kT``, so it
            cannot run at 0 K (a number, or one per system).
        tdamp: damping time of the chain in fs, at least 2 dt (sets its masses; ASE
            suggests 100 dt; a number or per system).
        chain_length: number of thermostats in the chain (ASE's ``tchain``).
        chain_steps: substeps per half step of the chain (ASE's ``tloop``).
        suzuki_yoshida: order of the Suzuki-Yoshida splitting of a substep: 1, 3 or 5.
        steps: the stage's number of steps.
    """

    fields: ClassVar[dict[str, FieldSpec]] = {}
    no_zero_kelvin: ClassVar[str | None] = (
        "the chain's masses are proportional to kT (Q = Nf kT tdamp²): at 0 K they vanish"
    )

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
        super().__init__(dt, steps, temperature)
        self.tdamp_fs = self.time_constant("tdamp", tdamp)
        self.tdamp = self.tdamp_fs * fs
        self.chain_length = check_count(owner, "chain_length", chain_length, 1)
        self.chain_steps = check_count(owner, "chain_steps", chain_steps, 1)
        if suzuki_yoshida not in SUZUKI_YOSHIDA:
            raise ValueError(f"{owner}: suzuki_yoshida must be 1, 3 or 5, got {suzuki_yoshida}")
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
        dt, t = describe(self.dt_fs), describe(self.temperature)
        return f"NoseHooverChain(dt={dt}, T={t}, steps={self.steps})"

    def pre_update(self, batch: Batch, mask: torch.Tensor) -> None:
        self.chain_half_step(batch, mask)
        ops.kick_drift(batch, mask, self.dt)

    def post_update(self, batch: Batch, mask: torch.Tensor) -> None:
        ops.kick(batch, mask, 0.5 * self.dt)
        self.chain_half_step(batch, mask)

    def chain_half_step(self, batch: Batch, mask: torch.Tensor) -> None:
        """``exp(iL_NHC dt/2)`` for ``mask``'s systems (:func:`~.ops.nhc_half_step`)."""
        eta, p_eta = ops.nhc_half_step(
            batch, mask, getattr(batch, self.eta_field), getattr(batch, self.p_eta_field),
            self.dt, self.temperature, self.tdamp, self.suzuki_yoshida, self.chain_steps,
        )  # fmt: skip
        setattr(batch, self.eta_field, eta)
        setattr(batch, self.p_eta_field, p_eta)

    def thermostat_energy(self, batch: Batch) -> torch.Tensor:
        """Energy of the chain ``[B]`` (eV); add E_pot + KE for the conserved quantity."""
        kt, nf, q = ops.chain_constants(batch, self.temperature, self.tdamp, self.chain_length)
        eta, p = getattr(batch, self.eta_field), getattr(batch, self.p_eta_field)
        return nf * kt * eta[:, 0] + kt * eta[:, 1:].sum(-1) + (0.5 * p * p / q).sum(-1)

    def conserved_energy(self, batch: Batch) -> torch.Tensor:
        """Extended-system energy ``[B]`` (eV), constant up to integration error."""
        return batch.energy + batch.kinetic_energy() + self.thermostat_energy(batch)
