"""FIRE structure optimizer (Bitzek et al., PRL 97, 170201, 2006), batched.

``mode="ase"`` reproduces ``ase.optimize.FIRE`` step for step: masses ignored,
power ``P = v·F`` and the mixing norms taken over the whole system, the step
``dr = dt v`` scaled down when its norm over *all* atoms exceeds ``maxstep``, no
velocity mixing on the very first step.  ``mode="mass_weighted"`` integrates
``v += dt F/m`` instead and clamps each atom's displacement to ``maxstep`` on its
own, which behaves better for systems mixing light and heavy atoms.

Defaults equal ASE's (``dt = 0.1`` and ``dtmax = 1.0`` ASE time units, here given
in fs).  State per system: ``fire_dt``, ``fire_alpha``, ``fire_n`` (steps since the
last uphill reset); velocities live in ``batch.velocities``.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch

from ..convergence import Criterion, ForceMax
from ..state import Batch
from ..tensor_ops import all_set, may_be_set
from ..units import fs
from .base import FieldSpec, Integrator, _check_param

#: ASE's FIRE defaults expressed in femtoseconds.
ASE_FIRE_DT_FS = 0.1 / fs
ASE_FIRE_DTMAX_FS = 1.0 / fs


class FIRE(Integrator):
    """Fast inertial relaxation engine; converges when max |F| < ``fmax``."""

    is_optimizer = True
    fields: ClassVar[dict[str, FieldSpec]] = {
        "fire_dt": FieldSpec("system", fill=float("nan")),
        "fire_alpha": FieldSpec("system", fill=float("nan")),
        "fire_n": FieldSpec("system", dtype="int64", fill=0),
    }

    def __init__(
        self,
        fmax: float = 0.05,
        max_steps: int = 1000,
        dt: float = ASE_FIRE_DT_FS,
        dtmax: float = ASE_FIRE_DTMAX_FS,
        maxstep: float = 0.2,
        n_min: int = 5,
        finc: float = 1.1,
        fdec: float = 0.5,
        astart: float = 0.1,
        fa: float = 0.99,
        mode: Literal["ase", "mass_weighted"] = "ase",
        criterion: Criterion | None = None,
    ) -> None:
        super().__init__(max_steps)
        name = type(self).__name__
        self.fmax = _check_param("fmax (eV/Å)", name, fmax)
        self.dt0 = _check_param("dt (fs)", name, dt) * fs
        self.dtmax = _check_param("dtmax (fs)", name, dtmax) * fs
        self.maxstep = _check_param("maxstep (Å)", name, maxstep)
        self.finc = _check_param("finc", name, finc, 1.0, strict=False)
        self.fdec = _check_param("fdec", name, fdec)
        self.astart = _check_param("astart", name, astart)
        self.fa = _check_param("fa", name, fa)
        if int(n_min) < 0:
            raise ValueError(f"{name}: n_min must be >= 0, got {n_min}")
        self.n_min = int(n_min)
        if mode not in ("ase", "mass_weighted"):
            raise ValueError(f"{name}: mode must be 'ase' or 'mass_weighted', got {mode!r}")
        self.mode = mode
        self.criterion = criterion if criterion is not None else ForceMax(self.fmax)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(fmax={self.fmax}, max_steps={self.max_steps})"

    def init_systems(self, batch: Batch, mask: torch.Tensor) -> None:
        super().init_systems(batch, mask)
        batch.fire_dt.masked_fill_(mask, self.dt0)
        batch.fire_alpha.masked_fill_(mask, self.astart)
        batch.velocities.masked_fill_(batch.atom_mask(mask).unsqueeze(-1), 0.0)

    def pre_update(self, batch: Batch, mask: torch.Tensor) -> None:
        # Written as per-system coefficients: v' = a v + c F and r' = r + s v', with
        # a = 1, c = s = 0 for systems outside the stage.  Every per-atom operation is
        # then one elementwise pass, and the three per-system sums (v.F, F.F, v.v) are
        # all the reductions needed: |v'|^2 follows from them.  See ``Segments``.
        seg = batch.segments
        f, v = batch.forces, batch.velocities
        dt, alpha, n = batch.fire_dt, batch.fire_alpha, batch.fire_n
        vf, ff, vv = seg.sum_xyz(v * f), seg.sum_xyz(f * f), seg.sum_xyz(v * v)

        # velocity mixing (skipped on a system's first step in the stage, as ASE does)
        moving = mask & (batch.step != 0)
        downhill = moving & (vf > 0)
        uphill = moving & ~(vf > 0)
        f_norm = ff.sqrt()
        scale = torch.where(
            f_norm > 0, alpha * vv.sqrt() / f_norm.clamp_min(1e-300), torch.zeros_like(f_norm)
        )
        one, zero = torch.ones_like(vf), torch.zeros_like(vf)
        a = torch.where(downhill, 1.0 - alpha, torch.where(uphill, zero, one))
        b = torch.where(downhill, scale, zero)
        grow = downhill & (n > self.n_min)
        dt = torch.where(grow, (dt * self.finc).clamp_max(self.dtmax), dt)
        alpha = torch.where(grow, alpha * self.fa, alpha)
        n = torch.where(downhill, n + 1, n)
        dt = torch.where(uphill, dt * self.fdec, dt)
        alpha = torch.where(uphill, torch.full_like(alpha, self.astart), alpha)
        n = torch.where(uphill, torch.zeros_like(n), n)
        batch.fire_dt = torch.where(mask, dt, batch.fire_dt)
        batch.fire_alpha = torch.where(mask, alpha, batch.fire_alpha)
        batch.fire_n = torch.where(mask, n, batch.fire_n)

        # Euler step v' = a v + (b + dt) F, dr = dt v', with step-length control
        step_dt = torch.where(mask, dt, zero)
        if self.mode == "ase":
            c = b + step_dt
            # |dr| over the system from the sums above (every term >= 0 but round-off)
            v2 = (a * a * vv + 2.0 * a * c * vf + c * c * ff).clamp_min(0.0)
            norm = step_dt * v2.sqrt()
            s = step_dt * torch.where(
                norm > self.maxstep, self.maxstep / norm.clamp_min(1e-300), one
            )
            a3, c3, s3 = seg.to_xyz(a, c, s)
            v_new = torch.addcmul(a3 * v, c3, f)
            r_new = torch.addcmul(batch.positions, s3, v_new)
        else:
            a3, b3, dt3 = seg.to_xyz(a, b, step_dt)
            v_new = a3 * v + (b3 + dt3 / batch.masses.unsqueeze(-1)) * f
            dr = dt3 * v_new
            norm = dr.norm(dim=-1, keepdim=True)
            dr = torch.where(norm > self.maxstep, dr * (self.maxstep / norm.clamp_min(1e-300)), dr)
            r_new = batch.positions + dr

        if all_set(mask) and not may_be_set(batch.fixed):
            batch.velocities, batch.positions = v_new, r_new  # every atom moves
        else:
            am = self.atom_mask(batch, mask).unsqueeze(-1)
            batch.velocities = torch.where(am, v_new, batch.velocities)
            batch.positions = torch.where(am, r_new, batch.positions)
