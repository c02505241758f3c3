"""Langevin NPT: BAOAB for the atoms, Langevin-Hoover for the cell, batched, step for
step like ASE's ``LangevinBAOAB`` with ``externalstress`` (``hydrostatic`` = ``isotropic``).

Why: a stochastic NPT robust far from equilibrium (atoms and cell are both thermalised,
nothing resonates) with BAOAB's small configurational error (Leimkuhler & Matthews,
J. Chem. Phys. 138, 174102 (2013); Quigley & Probert, ibid. 120, 11432 (2004))::

    p_cell += dt/2 G;  B;  cell A (dt/2);  A (dt/2)                    (pre_update)
    O: v <- exp(-(gamma + g) dt) v + c2 xi,  g = (p_cell + tr(p_cell)/Nf I)/W
    cell O: p_cell <- exp(-dt/pdamp) p_cell + sqrt((1 - e^{-2 dt/pdamp}) kT W) xi_cell
    A (dt/2);  cell A (dt/2)
       -- force and stress call --
    G from the new stress and the velocities as they are;  B;  p_cell += dt/2 G

A cell A scales cell and positions by ``exp(dt/2 p_cell/W)``; ``G`` is :func:`~.barostat.cell_force`
(a trace if isotropic), kept in a field from the force call to the next step as ASE keeps it.  Cell
noise is symmetrised (no rotations); ``W`` is ASE's heuristic ``((pdamp/4) / 1.66 fs)² N^(1/3)``
unless given.  One departure: ASE's full-cell ``g`` adds ``tr(p_cell)/Nf`` to every entry, not the
diagonal (docs/design/42-npt-integrators.md). Noise: the atoms' ``PURPOSE_NOISE`` (as
:class:`~.langevin.Langevin`), the cell's ``PURPOSE_BAROSTAT`` (:func:`~.ops.system_normals`).
State: ``nptl_p_eps``/``nptl_force_eps`` ``[B]`` (isotropic) or ``nptl_p_cell``/``nptl_force_cell``
``[B, 3, 3]``.
"""

from __future__ import annotations

import torch

from ..core import random as rng
from ..core.linalg import expm
from ..core.state import Batch
from ..core.units import fs
from . import barostat as baro
from . import ops
from .barostat import NPTIntegrator, per_system
from .base import FieldSpec
from .params import FRICTION, Param, check_param

#: ASE's constant of the cell-mass heuristic, in fs
_ASE_MASS_PERIOD = 1.66


class NPTLangevin(NPTIntegrator):
    """Langevin NPT (as ASE's ``LangevinBAOAB`` with ``externalstress=-P``).

    Args:
        dt: time step in fs (a number, or one per system as a list indexed by system_id).
        temperature: K; 0 K quenches atoms and cell (a number, or one per system).
        pressure_gpa: external pressure in GPa (0 by default; a number or one per system).
        pressure_bar: the same in bar (give one of the two).
        friction: the atoms' friction in 1/fs (ASE's ``1/T_tau``).
        pdamp: the cell's time constant in fs, >= 2 dt (ASE's ``P_tau``): its friction is
            ``1/pdamp`` and it sets the default cell mass.
        barostat_mass: the cell mass in eV fs² (None: ASE's heuristic from ``pdamp``).
        isotropic: volume fluctuations only (ASE's ``hydrostatic``); False: the full cell.
        steps: the stage's number of steps.
    """

    def __init__(
        self,
        dt: Param = 1.0,
        temperature: Param = 300.0,
        pressure_gpa: Param | None = None,
        pressure_bar: Param | None = None,
        friction: Param = 0.01,
        pdamp: Param = 1000.0,
        barostat_mass: Param | None = None,
        isotropic: bool = True,
        steps: int = 1000,
    ) -> None:
        super().__init__(dt, steps, temperature, pressure_gpa, pressure_bar, isotropic)
        owner = type(self).__name__
        self.gamma = check_param("friction", owner, friction, unit="1/fs", usual=FRICTION) / fs
        self.pdamp = self.time_constant("pdamp", pdamp) * fs
        self.barostat_mass = None if barostat_mass is None else (
            check_param("barostat_mass", owner, barostat_mass, unit="eV fs²") * fs**2
        )  # fmt: skip
        shape, kind = ((), "eps") if isotropic else ((3, 3), "cell")
        self.p_field, self.force_field = f"nptl_p_{kind}", f"nptl_force_{kind}"
        self.fields = {n: FieldSpec("system", shape) for n in (self.p_field, self.force_field)}

    def init_systems(self, batch: Batch, mask: torch.Tensor) -> None:
        super().init_systems(batch, mask)  # (velocities first: the force reads them)
        baro.set_system(batch, mask, self.force_field, self.cell_force(batch))

    def pre_update(self, batch: Batch, mask: torch.Tensor) -> None:
        baro.kick_cell(batch, mask, self.p_field, getattr(batch, self.force_field), 0.5 * self.dt)
        ops.kick(batch, mask, 0.5 * self.dt)
        self.cell_drift(batch, mask)
        ops.drift(batch, mask, 0.5 * self.dt)
        self.thermalise(batch, mask)
        ops.drift(batch, mask, 0.5 * self.dt)
        self.cell_drift(batch, mask)

    def post_update(self, batch: Batch, mask: torch.Tensor) -> None:
        force = self.cell_force(batch)
        baro.set_system(batch, mask, self.force_field, force)
        ops.kick(batch, mask, 0.5 * self.dt)
        baro.kick_cell(batch, mask, self.p_field, force, 0.5 * self.dt)

    # ------------------------------------------------------------ pieces of a step
    def mass(self, batch: Batch) -> torch.Tensor:
        """The cell mass ``W [B]`` in eV (ASE time)²."""
        if self.barostat_mass is not None:
            return per_system(batch, self.barostat_mass)
        period = per_system(batch, self.pdamp) / (4.0 * _ASE_MASS_PERIOD * fs)
        return (period * batch.n_atoms.to(batch.dtype) ** (1.0 / 6.0)) ** 2

    def cell_force(self, batch: Batch) -> torch.Tensor:
        return baro.cell_force(batch, self.pressure, self.isotropic)

    def cell_drift(self, batch: Batch, mask: torch.Tensor) -> None:
        """Cell and positions scaled by ``exp(dt/2 p_cell / W)``."""
        p, w = getattr(batch, self.p_field), self.mass(batch)
        half = per_system(batch, 0.5 * self.dt)
        if self.isotropic:
            baro.deform(batch, mask, torch.exp(half * p / w))
        else:
            baro.deform(batch, mask, expm((half / w)[:, None, None] * p))

    def thermalise(self, batch: Batch, mask: torch.Tensor) -> None:
        """O for the atoms (friction plus the cell's drag) and for the cell momentum."""
        p, w, dt = getattr(batch, self.p_field), self.mass(batch), per_system(batch, self.dt)
        gamma = per_system(batch, self.gamma)
        nf = 3.0 * batch.n_atoms.to(batch.dtype)
        if self.isotropic:
            drag = torch.exp(-(gamma + (1.0 + 3.0 / nf) * p / w) * dt)
        else:
            eye = torch.eye(3, dtype=batch.dtype, device=batch.device)
            mod = (p + (baro.trace(p) / nf)[:, None, None] * eye) / w[:, None, None]
            drag = expm(-(gamma[:, None, None] * eye + mod) * dt[:, None, None])
        _, c2 = ops.ou_coefficients(batch, dt, self.gamma, self.temperature)
        v = baro.times(batch, batch.velocities, drag) + c2 * self.normals(batch, rng.PURPOSE_NOISE)
        baro.set_atoms(batch, mask, velocities=v)
        # the cell: exact Ornstein-Uhlenbeck with friction 1/pdamp
        c1 = torch.exp(-dt / per_system(batch, self.pdamp))
        spread = torch.sqrt((1.0 - c1 * c1) * self.kt(batch) * w)
        z = ops.system_normals(batch, self.seed, rng.PURPOSE_BAROSTAT, 1 if self.isotropic else 9)
        if self.isotropic:
            noise = z[:, 0]
        else:
            z = z.reshape(-1, 3, 3)
            noise = 0.5 * (z + z.transpose(-1, -2))
            c1, spread = c1[:, None, None], spread[:, None, None]
        baro.set_system(batch, mask, self.p_field, c1 * p + spread * noise)


__all__ = ["NPTLangevin"]
