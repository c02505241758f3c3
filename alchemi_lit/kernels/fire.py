"""FIRE's and FIRE2's whole updates as one compiled CPU call each (see
:mod:`alchemi_lit.kernels`).

System by system: one loop sums ``v.F``, ``F.F`` and ``v.v`` over its atoms, the
integrators' own per-system function (:mod:`alchemi_lit.integrators.formulas`)
decides on those numbers (:mod:`~alchemi_lit.kernels.scalar_xp` as its ``xp``), and
one loop moves its atoms with the coefficients, as the torch path does.
"""

from __future__ import annotations

import numpy as np

from ..integrators.formulas import fire2_coefficients, fire_coefficients
from . import scalar_xp
from .cache import compiled

_coefficients = compiled(fire_coefficients.__wrapped__)
_coefficients2 = compiled(fire2_coefficients.__wrapped__)


@compiled
def power_sums(v, f, lo, hi):
    """``v.F``, ``F.F`` and ``v.v`` over atoms ``lo:hi`` (one system; see
    :func:`~alchemi_lit.integrators.ops.power_sums`)."""
    vf = ff = vv = 0.0
    for i in range(lo, hi):
        for k in range(3):
            vf += v[i, k] * f[i, k]
            ff += f[i, k] * f[i, k]
            vv += v[i, k] * v[i, k]
    return vf, ff, vv


@compiled
def fire_update(
    r, v, f, masses, starts, counts, fixed, mask, step, dt, alpha, n,
    n_min, finc, fdec, dtmax, astart, fa, maxstep, whole_step,
):  # fmt: skip
    """New ``(positions, velocities, dt, alpha, n)``; atoms outside ``mask``'s systems
    and ``fixed`` atoms keep their positions and velocities."""
    r_new, v_new = np.empty_like(r), np.empty_like(v)
    dt_new, alpha_new, n_new = np.empty_like(dt), np.empty_like(alpha), np.empty_like(n)
    for b in range(starts.shape[0]):
        lo, hi = starts[b], starts[b] + counts[b]
        vf, ff, vv = power_sums(v, f, lo, hi)
        a, c, s, dt_new[b], alpha_new[b], n_new[b] = _coefficients(
            scalar_xp, mask[b], step[b], vf, ff, vv, dt[b], alpha[b], n[b],
            n_min, finc, fdec, dtmax, astart, fa, maxstep, whole_step,
        )  # fmt: skip
        for i in range(lo, hi):
            if not mask[b] or fixed[i]:
                for k in range(3):
                    r_new[i, k], v_new[i, k] = r[i, k], v[i, k]
            elif whole_step:  # ASE: v' = a v + c F, r' = r + s v'
                for k in range(3):
                    vk = a * v[i, k] + c * f[i, k]
                    v_new[i, k] = vk
                    r_new[i, k] = r[i, k] + s * vk
            else:  # mass-weighted: v' = a v + (c + dt / m) F, each atom's step clamped
                w = c + s / masses[i]
                for k in range(3):
                    v_new[i, k] = a * v[i, k] + w * f[i, k]
                d0, d1, d2 = s * v_new[i, 0], s * v_new[i, 1], s * v_new[i, 2]
                norm = np.sqrt(d0 * d0 + d1 * d1 + d2 * d2)
                scale = maxstep / max(norm, 1e-300) if norm > maxstep else 1.0
                r_new[i, 0] = r[i, 0] + (d0 * scale if norm > maxstep else d0)
                r_new[i, 1] = r[i, 1] + (d1 * scale if norm > maxstep else d1)
                r_new[i, 2] = r[i, 2] + (d2 * scale if norm > maxstep else d2)
    return r_new, v_new, dt_new, alpha_new, n_new


@compiled
def fire2_update(
    r, v, f, starts, counts, fixed, mask, step, back, dt, alpha, n,
    n_min, finc, fdec, dtmax, dtmin, astart, fa, maxstep, use_abc,
):  # fmt: skip
    """FIRE2's step (:func:`~alchemi_lit.integrators.ops.fire2_update`): new
    ``(positions, velocities, dt, alpha, n, back)``; atoms outside ``mask``'s systems
    and ``fixed`` atoms keep their positions and velocities."""
    r_new, v_new = np.empty_like(r), np.empty_like(v)
    dt_new, alpha_new, n_new = np.empty_like(dt), np.empty_like(alpha), np.empty_like(n)
    back_new = np.empty_like(back)
    for b in range(starts.shape[0]):
        lo, hi = starts[b], starts[b] + counts[b]
        vf, ff, vv = power_sums(v, f, lo, hi)
        a, c, p, s, vmax, dt_new[b], alpha_new[b], n_new[b], back_new[b] = _coefficients2(
            scalar_xp, mask[b], step[b], back[b], vf, ff, vv, dt[b], alpha[b], n[b],
            n_min, finc, fdec, dtmax, dtmin, astart, fa, maxstep, use_abc,
        )  # fmt: skip
        for i in range(lo, hi):
            for k in range(3):
                if not mask[b] or fixed[i]:
                    r_new[i, k], v_new[i, k] = r[i, k], v[i, k]
                    continue
                vk = a * v[i, k] + c * f[i, k]  # v' = A v + C F
                if use_abc:  # ABC-FIRE clips each Cartesian component
                    vk = min(max(vk, -vmax), vmax)
                v_new[i, k] = vk
                r_new[i, k] = (r[i, k] + p * v[i, k]) + s * vk  # r' = r + P v + S v'
    return r_new, v_new, dt_new, alpha_new, n_new, back_new
