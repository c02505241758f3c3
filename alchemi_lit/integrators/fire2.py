"""FIRE 2.0 structure optimizer (Guénolé et al., Comput. Mater. Sci. 175, 109584, 2020).

Why: FIRE 2.0 integrates with semi-implicit Euler (velocity first, then position),
which the paper shows to be the most robust choice, waits ``n_min`` downhill steps
before accelerating, and on an uphill step (``P = F·v <= 0``) steps *back* by half a
step before restarting -- fewer oscillations around the minimum than FIRE 1.
``use_abc`` selects ABC-FIRE (Echeverri Restrepo & Andric, Comput. Mater. Sci. 218,
111978, 2023): the velocity mixing is bias-corrected by ``1/(1 - (1 - a)^(n+1))`` and
velocities are clipped per Cartesian component.

The update is ``ase.optimize.fire2.FIRE2``'s, parameter for parameter (defaults equal
ASE's; times in fs).  One difference is forced by the one-force-call-per-step loop:
after the half step back ASE evaluates the forces at the backed-off positions and then
takes its Euler step within the same ``step()`` -- two force calls.  Here the half
step back is a step of its own (flag ``fire2_back``): its force call gives the forces
the Euler step of the next step uses, and convergence is not tested at the backed-off
positions (ASE does not test there either).  Positions after each Euler step agree with
ASE to round-off; the step count is ASE's number of force calls after the first one
(ASE's ``nsteps`` plus its uphill restarts), and ``max_steps`` bounds force calls.

State per system: ``fire2_dt``, ``fire2_alpha``, ``fire2_n`` and ``fire2_back``.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from ..convergence import Criterion, ForceMax
from ..state import Batch
from ..tensor_ops import row_dot
from ..units import fs
from .base import FieldSpec, Integrator, _check_param, system_sum

#: ASE's FIRE2 defaults (ASE time units) expressed in femtoseconds.
ASE_FIRE2_DT_FS = 0.1 / fs
ASE_FIRE2_DTMAX_FS = 1.0 / fs
ASE_FIRE2_DTMIN_FS = 2e-3 / fs


class FIRE2(Integrator):
    """FIRE 2.0 (or ABC-FIRE with ``use_abc``); converges when max |F| < ``fmax``."""

    is_optimizer = True
    fields: ClassVar[dict[str, FieldSpec]] = {
        "fire2_dt": FieldSpec("system", fill=float("nan")),
        "fire2_alpha": FieldSpec("system", fill=float("nan")),
        "fire2_n": FieldSpec("system", dtype="int64", fill=0),
        "fire2_back": FieldSpec("system", dtype="bool", fill=False),
    }

    def __init__(
        self,
        fmax: float = 0.05,
        max_steps: int = 1000,
        dt: float = ASE_FIRE2_DT_FS,
        maxstep: float = 0.2,
        dtmax: float = ASE_FIRE2_DTMAX_FS,
        dtmin: float = ASE_FIRE2_DTMIN_FS,
        n_min: int = 20,
        finc: float = 1.1,
        fdec: float = 0.5,
        astart: float = 0.25,
        fa: float = 0.99,
        use_abc: bool = False,
        criterion: Criterion | None = None,
    ) -> None:
        super().__init__(max_steps)
        name = type(self).__name__
        self.fmax = _check_param("fmax (eV/Å)", name, fmax)
        self.dt0 = _check_param("dt (fs)", name, dt) * fs
        self.maxstep = _check_param("maxstep (Å)", name, maxstep)
        self.dtmax = _check_param("dtmax (fs)", name, dtmax) * fs
        self.dtmin = _check_param("dtmin (fs)", name, dtmin) * fs
        if self.dtmin > self.dtmax:
            raise ValueError(f"{name}: dtmin must be <= dtmax, got {dtmin} > {dtmax} fs")
        self.finc = _check_param("finc", name, finc, 1.0, strict=False)
        self.fdec = _check_param("fdec", name, fdec)
        if self.fdec > 1.0:
            raise ValueError(f"{name}: fdec must be <= 1, got {fdec}")
        self.astart = _check_param("astart", name, astart)
        self.fa = _check_param("fa", name, fa)
        if int(n_min) < 0 or int(n_min) != n_min:
            raise ValueError(f"{name}: n_min must be an integer >= 0, got {n_min}")
        self.n_min = int(n_min)
        self.use_abc = bool(use_abc)
        self.criterion = criterion if criterion is not None else ForceMax(self.fmax)

    def __repr__(self) -> str:
        abc = ", use_abc=True" if self.use_abc else ""
        return f"{type(self).__name__}(fmax={self.fmax}, max_steps={self.max_steps}{abc})"

    def init_systems(self, batch: Batch, mask: torch.Tensor) -> None:
        super().init_systems(batch, mask)
        batch.fire2_dt.masked_fill_(mask, self.dt0)
        batch.fire2_alpha.masked_fill_(mask, self.astart)
        batch.velocities.masked_fill_(batch.atom_mask(mask).unsqueeze(-1), 0.0)

    def converged(self, batch: Batch) -> torch.Tensor | None:
        conv = super().converged(batch)
        return None if conv is None else conv & ~batch.fire2_back

    def pre_update(self, batch: Batch, mask: torch.Tensor) -> None:
        am = self.atom_mask(batch, mask).unsqueeze(-1)
        sidx = batch.system_idx
        f, v, x = batch.forces, batch.velocities, batch.positions
        dt, a, n, back = batch.fire2_dt, batch.fire2_alpha, batch.fire2_n, batch.fire2_back

        # 1. power check (not on the first step, nor right after a half step back)
        check = mask & (batch.step > 0) & ~back
        power = system_sum(batch, row_dot(f, v))
        downhill = check & (power > 0)
        uphill = check & ~(power > 0)
        n = torch.where(downhill, n + 1, n)
        grow = downhill & (n > self.n_min)
        dt = torch.where(grow, (dt * self.finc).clamp_max(self.dtmax), dt)
        a = torch.where(grow, a * self.fa, a)
        n = torch.where(uphill, torch.zeros_like(n), n)
        dt = torch.where(uphill, (dt * self.fdec).clamp_min(self.dtmin), dt)
        a = torch.where(uphill, torch.full_like(a, self.astart), a)
        up_atoms = uphill.index_select(0, sidx).unsqueeze(-1)
        x = torch.where(up_atoms, x - 0.5 * dt.index_select(0, sidx).unsqueeze(-1) * v, x)
        v = torch.where(up_atoms, torch.zeros_like(v), v)

        # 2. semi-implicit Euler with velocity mixing, for systems not stepping back
        euler = mask & ~uphill
        dt_atom = dt.index_select(0, sidx).unsqueeze(-1)
        v_new = v + dt_atom * f
        f_norm = system_sum(batch, batch.force_sq_norms()).sqrt()
        v_norm = system_sum(batch, row_dot(v_new)).sqrt()
        unit_f = f / f_norm.clamp_min(1e-300).index_select(0, sidx).unsqueeze(-1)
        v_mix = (1.0 - a).index_select(0, sidx).unsqueeze(-1) * v_new + (a * v_norm).index_select(
            0, sidx
        ).unsqueeze(-1) * unit_f
        if self.use_abc:
            a_c = a.clamp_min(1e-10)
            a = torch.where(euler, a_c, a)
            v_mix = (1.0 - a_c).index_select(0, sidx).unsqueeze(-1) * v_new + (
                a_c * v_norm
            ).index_select(0, sidx).unsqueeze(-1) * unit_f
            bias = 1.0 / (1.0 - (1.0 - a_c) ** (n + 1).to(a_c.dtype))
            vmax = (self.maxstep / dt).index_select(0, sidx).unsqueeze(-1)
            v_new = torch.minimum(
                torch.maximum(bias.index_select(0, sidx).unsqueeze(-1) * v_mix, -vmax), vmax
            )
            dr = dt_atom * v_new
        else:
            v_new = v_mix
            dr = dt_atom * v_new
            norm = system_sum(batch, row_dot(dr)).sqrt()
            shrink = torch.where(norm > self.maxstep, self.maxstep / norm.clamp_min(1e-300), 1.0)
            dr = dr * shrink.index_select(0, sidx).unsqueeze(-1)
        e_atoms = euler.index_select(0, sidx).unsqueeze(-1)
        v = torch.where(e_atoms, v_new, v)
        x = torch.where(e_atoms, x + dr, x)

        batch.velocities = torch.where(am, v, batch.velocities)
        batch.positions = torch.where(am, x, batch.positions)
        batch.fire2_dt = torch.where(mask, dt, batch.fire2_dt)
        batch.fire2_alpha = torch.where(mask, a, batch.fire2_alpha)
        batch.fire2_n = torch.where(mask, n, batch.fire2_n)
        batch.fire2_back = torch.where(mask, uphill, batch.fire2_back)
