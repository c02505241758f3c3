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

from typing import Any, ClassVar

import torch

from .. import kernels
from ..convergence import Criterion, ForceMax
from ..state import Batch
from ..tensor_ops import per_system
from ..units import fs
from .base import FieldSpec, Integrator, _check_param
from .fire import power_sums

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
        if kernels.usable(batch.positions, batch.velocities, batch.forces, batch.fire2_dt):
            self._compiled_update(batch, mask)
            return
        # As per-system coefficients (see FIRE): v' = A v + C F, r' = r + P v + S v'.
        # Uphill systems step back (P = -dt/2, A = C = S = 0), the others take the mixed
        # Euler step (P = 0); outside the stage A = 1 and C = P = S = 0.  The norms the
        # mixing and the step control need follow from the sums v.F, F.F and v.v.
        seg = batch.segments
        f, v = batch.forces, batch.velocities
        vf, ff, vv = power_sums(batch)
        a_, c_, p_, s_, vmax, *state = _fire2_coefficients(
            mask, batch.step, batch.fire2_back, vf, ff, vv,
            batch.fire2_dt, batch.fire2_alpha, batch.fire2_n,
            n_min=self.n_min, finc=self.finc, fdec=self.fdec, dtmax=self.dtmax,
            dtmin=self.dtmin, astart=self.astart, fa=self.fa, maxstep=self.maxstep,
            use_abc=self.use_abc,
        )  # fmt: skip
        batch.fire2_dt, batch.fire2_alpha, batch.fire2_n, batch.fire2_back = state
        a3, c3, p3, s3 = seg.to_xyz(a_, c_, p_, s_)
        v_new = torch.addcmul(a3 * v, c3, f)
        if self.use_abc:  # ABC-FIRE clips each Cartesian component
            (vmax3,) = seg.to_xyz(vmax)
            v_new = torch.minimum(torch.maximum(v_new, -vmax3), vmax3)
        r_new = torch.addcmul(torch.addcmul(batch.positions, p3, v), s3, v_new)
        moving = self.moving_atoms(batch, mask)
        batch.velocities = self.masked(moving, v_new, v)
        batch.positions = self.masked(moving, r_new, batch.positions)

    def _compiled_update(self, batch: Batch, mask: torch.Tensor) -> None:
        """The same update as one compiled CPU call (:mod:`alchemi_lit.kernels.fire`)."""
        starts, counts = batch.segments.bounds
        out = kernels.load("fire").fire2_update(
            batch.positions.numpy(), batch.velocities.numpy(), batch.forces.numpy(),
            starts, counts, batch.fixed.numpy(), mask.numpy(), batch.step.numpy(),
            batch.fire2_back.numpy(), batch.fire2_dt.numpy(), batch.fire2_alpha.numpy(),
            batch.fire2_n.numpy(), self.n_min, self.finc, self.fdec, self.dtmax, self.dtmin,
            self.astart, self.fa, self.maxstep, self.use_abc,
        )  # fmt: skip
        r, v, *state = map(torch.from_numpy, out)
        batch.positions, batch.velocities = r, v
        batch.fire2_dt, batch.fire2_alpha, batch.fire2_n, batch.fire2_back = state


@per_system
def _fire2_coefficients(
    xp: Any,
    mask: Any,
    step: Any,
    back: Any,
    vf: Any,
    ff: Any,
    vv: Any,
    dt: Any,
    a: Any,
    n: Any,
    n_min: int,
    finc: float,
    fdec: float,
    dtmax: float,
    dtmin: float,
    astart: float,
    fa: float,
    maxstep: float,
    use_abc: bool,
) -> tuple[Any, ...]:
    """FIRE2's per-system step from the sums v.F, F.F, v.v (``ase.optimize.fire2``):
    ``(A, C, P, S, vmax)`` of the update in :meth:`FIRE2.pre_update` (``vmax``, the
    per-component clip, is used with ``use_abc`` only), then the new
    ``dt``, ``alpha``, ``n``, ``back`` (unchanged outside ``mask``).  ``xp``: NumPy or
    torch (see :func:`~alchemi_lit.tensor_ops.per_system`)."""
    one, zero = xp.ones_like(vf), xp.zeros_like(vf)
    # 1. power check (not on the first step, nor right after a half step back)
    check = mask & (step > 0) & ~back
    downhill = check & (vf > 0)
    uphill = check & ~(vf > 0)
    n = xp.where(downhill, n + 1, n)
    grow = downhill & (n > n_min)
    dt = xp.where(grow, xp.where(dt * finc > dtmax, dtmax, dt * finc), dt)
    a = xp.where(grow, a * fa, a)
    n = xp.where(uphill, 0, n)
    dt = xp.where(uphill, xp.where(dt * fdec < dtmin, dtmin, dt * fdec), dt)
    a = xp.where(uphill, astart, a)
    # 2. semi-implicit Euler with velocity mixing, for the systems not stepping back:
    # v' = (1 - a)(v + dt F) + a |v + dt F| F/|F|
    euler = mask & ~uphill
    f_norm = xp.sqrt(ff)
    vnew2 = vv + 2.0 * dt * vf + dt * dt * ff
    v_norm = xp.sqrt(xp.where(vnew2 > 0, vnew2, zero))
    toward_f = xp.where(f_norm > 0, v_norm / xp.where(f_norm > 0, f_norm, one), zero)
    if use_abc:
        a = xp.where(euler & (a < 1e-10), 1e-10, a)
        bias = 1.0 / (1.0 - (1.0 - a) ** (n + 1))
        coef_v, coef_f = bias * (1.0 - a), bias * ((1.0 - a) * dt + a * toward_f)
        step_len = dt
        vmax = xp.where(euler, maxstep / dt, float("inf"))
    else:
        coef_v, coef_f = 1.0 - a, (1.0 - a) * dt + a * toward_f
        v2 = coef_v * coef_v * vv + 2.0 * coef_v * coef_f * vf + coef_f * coef_f * ff
        norm = dt * xp.sqrt(xp.where(v2 > 0, v2, zero))
        step_len = xp.where(norm > maxstep, dt * maxstep / xp.where(norm > 0, norm, one), dt)
        vmax = xp.full_like(dt, float("inf"))  # no clip
    coef_v = xp.where(euler, coef_v, xp.where(uphill, zero, one))
    coef_f = xp.where(euler, coef_f, zero)
    back_step = xp.where(uphill, -0.5 * dt, zero)
    step_len = xp.where(euler, step_len, zero)
    return coef_v, coef_f, back_step, step_len, vmax, dt, a, n, uphill | (back & ~mask)
