"""Martyna-Tobias-Klein NPT with Nosé-Hoover chains, batched, step for step like ASE's
``IsotropicMTKNPT`` (``isotropic=True``) and ``MTKNPT`` (full cell).

Why: deterministic and time-reversible, it samples NPT with the right measure and has a
conserved energy (Martyna, Tobias & Klein, J. Chem. Phys. 101, 4177 (1994)).  One step::

    cell chain, atoms' chain (dt/2); p_g += dt/2 G; v: exp(iL2 dt/2); r, h: exp(iL1 dt)
       -- force and stress call --
    v: exp(iL2 dt/2); p_g += dt/2 G; atoms' chain, cell chain (dt/2)

with ``G`` from :func:`~.barostat.cell_force` and flows exact in the eigenbasis of ``p_g``
(:func:`~.barostat.exact_flow`); an isotropic cell is ``p_g = p_eps/3 I``.  Masses as
ASE: ``Q = (3N, 1, ..) kT tdamp²``, ``W = (N + 1) kT pdamp²`` (isotropic: 3 times), cell
chain ``R = (9, 1, ..) kT pdamp²`` for 1 (isotropic) or 9 degrees of freedom.  State per
system: ``mtk_p_eps``/``mtk_p_cell``, ``mtk_nhc{M}_eta/_p_eta``, ``mtk_baro{K}_xi/_p_xi``.
"""

from __future__ import annotations

import torch

from ..core.state import Batch
from ..core.units import fs
from . import barostat as baro
from . import formulas, ops
from .barostat import NPTIntegrator, per_system
from .base import FieldSpec
from .params import Param, check_count


class MTKNPT(NPTIntegrator):
    """NPT by Martyna-Tobias-Klein with Nosé-Hoover chains (as ASE's ``IsotropicMTKNPT``
    and ``MTKNPT``).

    Args:
        dt: time step in fs (a number, or one per system as a list indexed by system_id).
        temperature: K, > 0: the chains' and cell's masses are ``∝ kT`` (a number, or
            one per system).
        pressure_gpa: external pressure in GPa (0 by default; a number or one per system).
        pressure_bar: the same in bar (give one of the two).
        tdamp: damping time of the thermostat chain in fs, >= 2 dt (ASE suggests 100 dt).
        pdamp: damping time of the barostat in fs, >= 2 dt (ASE suggests 1000 dt).
        isotropic: volume fluctuations only (``IsotropicMTKNPT``); False: the full cell.
        tchain: thermostats in the atoms' chain.
        pchain: thermostats in the cell's chain.
        tloop: substeps of the atoms' chain per half step.
        ploop: substeps of the cell's chain per half step.
        steps: the stage's number of steps.
    """

    no_zero_kelvin = "its chains' and cell's masses are proportional to kT: at 0 K they vanish"

    def __init__(
        self,
        dt: Param = 1.0,
        temperature: Param = 300.0,
        pressure_gpa: Param | None = None,
        pressure_bar: Param | None = None,
        tdamp: Param = 100.0,
        pdamp: Param = 1000.0,
        isotropic: bool = True,
        tchain: int = 3,
        pchain: int = 3,
        tloop: int = 1,
        ploop: int = 1,
        steps: int = 1000,
    ) -> None:
        super().__init__(dt, steps, temperature, pressure_gpa, pressure_bar, isotropic)
        owner = type(self).__name__
        self.tdamp = self.time_constant("tdamp", tdamp) * fs
        self.pdamp = self.time_constant("pdamp", pdamp) * fs
        counts = {"tchain": tchain, "pchain": pchain, "tloop": tloop, "ploop": ploop}
        self.tchain, self.pchain, self.tloop, self.ploop = (
            check_count(owner, name, value, 1) for name, value in counts.items())  # fmt: skip
        self.p_field = "mtk_p_eps" if isotropic else "mtk_p_cell"
        t, p = f"mtk_nhc{self.tchain}_", f"mtk_baro{self.pchain}_"
        self.chain_fields = (t + "eta", t + "p_eta", p + "xi", p + "p_xi")
        lengths = (self.tchain, self.tchain, self.pchain, self.pchain)
        self.fields = {n: FieldSpec("system", (m,)) for n, m in zip(self.chain_fields, lengths)}
        self.fields[self.p_field] = FieldSpec("system", () if isotropic else (3, 3))

    def pre_update(self, batch: Batch, mask: torch.Tensor) -> None:
        self.chains(batch, mask)
        baro.kick_cell(batch, mask, self.p_field, self.cell_force(batch), 0.5 * self.dt)
        self.kick(batch, mask)
        self.drift(batch, mask)

    def post_update(self, batch: Batch, mask: torch.Tensor) -> None:
        self.kick(batch, mask)
        baro.kick_cell(batch, mask, self.p_field, self.cell_force(batch), 0.5 * self.dt)
        self.chains(batch, mask)

    def cell_mass(self, batch: Batch) -> torch.Tensor:
        """``W [B]``: ``(N + 1) kT pdamp²``, three times that if isotropic."""
        n = (batch.n_atoms + 1).to(batch.dtype)
        w = n * self.kt(batch) * per_system(batch, self.pdamp) ** 2
        return 3.0 * w if self.isotropic else w

    def kick(self, batch: Batch, mask: torch.Tensor) -> None:
        """``exp(iL2 dt/2)``: velocities under the forces, damped by the cell momentum."""
        u, rate = baro.eigen_rates(getattr(batch, self.p_field), self.cell_mass(batch))
        n = 3.0 * batch.n_atoms.to(batch.dtype)[:, None]
        accel = batch.forces / batch.masses[:, None]
        kappa = -(rate + rate.sum(-1, keepdim=True) / n)
        v = baro.exact_flow(batch, batch.velocities, accel, kappa, u, 0.5 * self.dt)
        baro.set_atoms(batch, mask, velocities=v)

    def drift(self, batch: Batch, mask: torch.Tensor) -> None:
        """``exp(iL1 dt)``: positions and cell."""
        u, rate = baro.eigen_rates(getattr(batch, self.p_field), self.cell_mass(batch))
        r = baro.exact_flow(batch, batch.positions, batch.velocities, rate, u, self.dt)
        e = baro.flow_matrix(torch.exp(rate * per_system(batch, self.dt)[:, None]), u)
        baro.set_atoms(batch, mask, positions=r)
        baro.set_system(batch, mask, "cell", baro.scaled_cell(batch.cell, e))

    def cell_force(self, batch: Batch) -> torch.Tensor:
        return baro.cell_force(batch, self.pressure, self.isotropic)

    def cell_energy(self, batch: Batch) -> torch.Tensor:
        return baro.cell_kinetic_energy(getattr(batch, self.p_field), self.cell_mass(batch))

    def chains(self, batch: Batch, mask: torch.Tensor) -> None:
        """Both chains over dt/2 (they commute: one scales the velocities, the other the
        cell momentum; ASE's ``integrate_nhc`` and ``integrate_nhc_baro``)."""
        names, dof = self.chain_fields, 1.0 if self.isotropic else 9.0
        eta = ops.nhc_half_step(batch, mask, *(getattr(batch, n) for n in names[:2]), self.dt,
                                self.temperature, self.tdamp, 3, self.tloop)  # fmt: skip
        *xi, scale = formulas.chain_half_step(
            mask, *(getattr(batch, n) for n in names[2:]), self.chain_masses(batch), self.kt(batch),
            dof, 2.0 * self.cell_energy(batch), per_system(batch, 0.5 * self.dt),
            weights=formulas.SUZUKI_YOSHIDA[3], chain_steps=self.ploop,
        )  # fmt: skip
        for name, value in zip(names, (*eta, *xi)):
            setattr(batch, name, value)
        p = getattr(batch, self.p_field)
        setattr(batch, self.p_field, p * scale.view(-1, *[1] * (p.dim() - 1)))

    def chain_masses(self, batch: Batch) -> torch.Tensor:
        return baro.chain_masses(self.kt(batch), per_system(batch, self.pdamp), self.pchain, 9.0)

    def conserved_energy(self, batch: Batch) -> torch.Tensor:
        """The extended energy ``[B]`` (eV; ASE's ``get_conserved_energy``), constant up
        to the integration error."""
        kt, (eta, p_eta, xi, p_xi) = self.kt(batch), (getattr(batch, n) for n in self.chain_fields)
        _, nf, q = ops.chain_constants(batch, self.temperature, self.tdamp, self.tchain)
        chains = baro.chain_energy(kt, nf, eta, p_eta, q) + baro.chain_energy(
            kt, 1.0 if self.isotropic else 9.0, xi, p_xi, self.chain_masses(batch))  # fmt: skip
        pv = per_system(batch, self.pressure) * batch.volume
        return batch.energy + batch.kinetic_energy() + self.cell_energy(batch) + chains + pv
