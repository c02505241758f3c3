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

from typing import Any, ClassVar, Literal

import torch

from .. import kernels
from ..convergence import Criterion, ForceMax
from ..state import Batch
from ..tensor_ops import per_system
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
        if kernels.usable(batch.positions, batch.velocities, batch.forces, batch.fire_dt):
            self._compiled_update(batch, mask)
            return
        # Written as per-system coefficients: v' = a v + c F and r' = r + s v', with
        # a = 1, c = s = 0 for systems outside the stage.  Every per-atom operation is
        # then one elementwise pass, and the three per-system sums (v.F, F.F, v.v) are
        # all the reductions needed: |v'|^2 follows from them.  See ``Segments``.
        seg = batch.segments
        f, v = batch.forces, batch.velocities
        vf, ff, vv = power_sums(batch)
        a, c, s, batch.fire_dt, batch.fire_alpha, batch.fire_n = _fire_coefficients(
            mask, batch.step, vf, ff, vv, batch.fire_dt, batch.fire_alpha, batch.fire_n,
            n_min=self.n_min, finc=self.finc, fdec=self.fdec, dtmax=self.dtmax,
            astart=self.astart, fa=self.fa, maxstep=self.maxstep, whole_step=self.mode == "ase",
        )  # fmt: skip
        a3, c3, s3 = seg.to_xyz(a, c, s)
        if self.mode == "ase":
            v_new = torch.addcmul(a3 * v, c3, f)
            r_new = torch.addcmul(batch.positions, s3, v_new)
        else:  # c = mixing scale, s = the system's dt: v' = a v + (c + dt / m) F
            v_new = a3 * v + (c3 + s3 / seg.atom_xyz(batch.masses)) * f
            dr = s3 * v_new
            norm = dr.norm(dim=-1, keepdim=True)
            dr = torch.where(norm > self.maxstep, dr * (self.maxstep / norm.clamp_min(1e-300)), dr)
            r_new = batch.positions + dr
        moving = self.moving_atoms(batch, mask)
        batch.velocities = self.masked(moving, v_new, batch.velocities)
        batch.positions = self.masked(moving, r_new, batch.positions)

    def _compiled_update(self, batch: Batch, mask: torch.Tensor) -> None:
        """The same update as one compiled CPU call (:mod:`alchemi_lit.kernels.fire`)."""
        starts, counts = batch.segments.bounds
        out = kernels.load("fire").fire_update(
            batch.positions.numpy(), batch.velocities.numpy(), batch.forces.numpy(),
            batch.masses.numpy(), starts, counts, batch.fixed.numpy(), mask.numpy(),
            batch.step.numpy(), batch.fire_dt.numpy(), batch.fire_alpha.numpy(),
            batch.fire_n.numpy(), self.n_min, self.finc, self.fdec, self.dtmax, self.astart,
            self.fa, self.maxstep, self.mode == "ase",
        )  # fmt: skip
        r, v, batch.fire_dt, batch.fire_alpha, batch.fire_n = map(torch.from_numpy, out)
        batch.positions, batch.velocities = r, v


def power_sums(batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-system ``v.F``, ``F.F`` and ``v.v`` ``[B]``: all the reductions a FIRE step needs
    (the norms of its mixed velocity and step follow from them)."""
    seg, f, v = batch.segments, batch.forces, batch.velocities
    return seg.sum_xyz(v * f), seg.sum(batch.force_sq_norms()), seg.sum_xyz(v * v)


@per_system
def _fire_coefficients(
    xp: Any,
    mask: Any,
    step: Any,
    vf: Any,
    ff: Any,
    vv: Any,
    dt: Any,
    alpha: Any,
    n: Any,
    n_min: int,
    finc: float,
    fdec: float,
    dtmax: float,
    astart: float,
    fa: float,
    maxstep: float,
    whole_step: bool,
) -> tuple[Any, ...]:
    """FIRE's per-system update from the sums v.F, F.F, v.v: ``(a, c, s)`` of
    ``v' = a v + c F``, ``r' = r + s v'`` (``whole_step``: ASE's step-length control over
    the system) or ``(a, mixing scale, dt)``, then the new ``dt``, ``alpha``, ``n``
    (unchanged outside ``mask``).  ``xp`` is NumPy or torch (see :func:`per_system`).
    """
    one, zero = xp.ones_like(vf), xp.zeros_like(vf)
    # velocity mixing (skipped on a system's first step in the stage, as ASE does)
    moving = mask & (step != 0)
    downhill = moving & (vf > 0)
    uphill = moving & ~(vf > 0)
    f_norm = xp.sqrt(ff)
    safe_norm = xp.where(f_norm > 1e-300, f_norm, 1e-300)  # clamp_min, in both namespaces
    scale = xp.where(f_norm > 0, alpha * xp.sqrt(vv) / safe_norm, zero)
    a = xp.where(downhill, 1.0 - alpha, xp.where(uphill, zero, one))
    b = xp.where(downhill, scale, zero)
    grow = downhill & (n > n_min)
    dt_new = xp.where(grow, xp.where(dt * finc > dtmax, dtmax, dt * finc), dt)
    alpha_new = xp.where(grow, alpha * fa, alpha)
    n_new = xp.where(downhill, n + 1, n)
    dt_new = xp.where(uphill, dt_new * fdec, dt_new)
    alpha_new = xp.where(uphill, astart, alpha_new)
    n_new = xp.where(uphill, 0, n_new)
    kept = dt_new, alpha_new, n_new  # (downhill, uphill and grow imply mask: others keep theirs)
    # Euler step v' = a v + (b + dt) F, dr = dt v', with step-length control
    step_dt = xp.where(mask, dt_new, zero)
    if not whole_step:
        return (a, b, step_dt, *kept)
    c = b + step_dt
    # |dr| over the system from the sums above (every term >= 0 but round-off)
    v2 = a * a * vv + 2.0 * a * c * vf + c * c * ff
    norm = step_dt * xp.sqrt(xp.where(v2 > 0, v2, zero))
    # (tensor / tensor: torch computes number / tensor as a reciprocal times the number)
    s = xp.where(norm > maxstep, step_dt * maxstep / xp.where(norm > 0, norm, one), step_dt)
    return (a, c, s, *kept)
