"""FIRE's and FIRE2's whole updates as one compiled CPU call each (see
:mod:`alchemi_lit.kernels`).

The per-system decisions are the integrators' own coefficient functions
(``_fire_coefficients``, ``_fire2_coefficients``), compiled with NumPy as their array
library; around them one loop sums ``v.F``, ``F.F`` and ``v.v`` per system and one
loop moves the atoms with the per-system coefficients, as the torch path does.
"""

from __future__ import annotations

import numba
import numpy as np

from ..integrators.fire import _fire_coefficients
from ..integrators.fire2 import _fire2_coefficients

_coefficients = numba.njit(cache=True, nogil=True)(_fire_coefficients.__wrapped__)
_coefficients2 = numba.njit(cache=True, nogil=True)(_fire2_coefficients.__wrapped__)


@numba.njit(cache=True, nogil=True)
def power_sums(v, f, starts, counts):
    """Per-system ``v.F``, ``F.F`` and ``v.v`` ``[B]`` (see
    :func:`~alchemi_lit.integrators.fire.power_sums`), one pass over the atoms."""
    num = starts.shape[0]
    vf = np.zeros(num, dtype=f.dtype)
    ff = np.zeros(num, dtype=f.dtype)
    vv = np.zeros(num, dtype=f.dtype)
    for b in range(num):
        s_vf = s_ff = s_vv = 0.0
        for i in range(starts[b], starts[b] + counts[b]):
            for k in range(3):
                s_vf += v[i, k] * f[i, k]
                s_ff += f[i, k] * f[i, k]
                s_vv += v[i, k] * v[i, k]
        vf[b], ff[b], vv[b] = s_vf, s_ff, s_vv
    return vf, ff, vv


@numba.njit(cache=True, nogil=True)
def fire_update(
    r, v, f, masses, starts, counts, fixed, mask, step, dt, alpha, n,
    n_min, finc, fdec, dtmax, astart, fa, maxstep, whole_step,
):  # fmt: skip
    """New ``(positions, velocities, dt, alpha, n)``; atoms outside ``mask``'s systems
    and ``fixed`` atoms keep their positions and velocities."""
    num = starts.shape[0]
    vf, ff, vv = power_sums(v, f, starts, counts)
    a, c, s, dt_new, alpha_new, n_new = _coefficients(
        np, mask, step, vf, ff, vv, dt, alpha, n,
        n_min, finc, fdec, dtmax, astart, fa, maxstep, whole_step,
    )  # fmt: skip
    r_new = np.empty_like(r)
    v_new = np.empty_like(v)
    for b in range(num):
        for i in range(starts[b], starts[b] + counts[b]):
            if not mask[b] or fixed[i]:
                for k in range(3):
                    r_new[i, k], v_new[i, k] = r[i, k], v[i, k]
            elif whole_step:  # ASE: v' = a v + c F, r' = r + s v'
                for k in range(3):
                    vk = a[b] * v[i, k] + c[b] * f[i, k]
                    v_new[i, k] = vk
                    r_new[i, k] = r[i, k] + s[b] * vk
            else:  # mass-weighted: v' = a v + (c + dt / m) F, each atom's step clamped
                w = c[b] + s[b] / masses[i]
                for k in range(3):
                    v_new[i, k] = a[b] * v[i, k] + w * f[i, k]
                d0, d1, d2 = s[b] * v_new[i, 0], s[b] * v_new[i, 1], s[b] * v_new[i, 2]
                norm = np.sqrt(d0 * d0 + d1 * d1 + d2 * d2)
                scale = maxstep / max(norm, 1e-300) if norm > maxstep else 1.0
                r_new[i, 0] = r[i, 0] + (d0 * scale if norm > maxstep else d0)
                r_new[i, 1] = r[i, 1] + (d1 * scale if norm > maxstep else d1)
                r_new[i, 2] = r[i, 2] + (d2 * scale if norm > maxstep else d2)
    return r_new, v_new, dt_new.astype(dt.dtype), alpha_new.astype(alpha.dtype), n_new


@numba.njit(cache=True, nogil=True)
def fire2_update(
    r, v, f, starts, counts, fixed, mask, step, back, dt, alpha, n,
    n_min, finc, fdec, dtmax, dtmin, astart, fa, maxstep, use_abc,
):  # fmt: skip
    """FIRE2's step (:meth:`~alchemi_lit.integrators.FIRE2.pre_update`): new
    ``(positions, velocities, dt, alpha, n, back)``; atoms outside ``mask``'s systems
    and ``fixed`` atoms keep their positions and velocities."""
    vf, ff, vv = power_sums(v, f, starts, counts)
    a, c, p, s, vmax, dt_new, alpha_new, n_new, back_new = _coefficients2(
        np, mask, step, back, vf, ff, vv, dt, alpha, n,
        n_min, finc, fdec, dtmax, dtmin, astart, fa, maxstep, use_abc,
    )  # fmt: skip
    r_new = np.empty_like(r)
    v_new = np.empty_like(v)
    for b in range(starts.shape[0]):
        for i in range(starts[b], starts[b] + counts[b]):
            for k in range(3):
                if not mask[b] or fixed[i]:
                    r_new[i, k], v_new[i, k] = r[i, k], v[i, k]
                    continue
                vk = a[b] * v[i, k] + c[b] * f[i, k]  # v' = A v + C F
                if use_abc:  # ABC-FIRE clips each Cartesian component
                    vk = min(max(vk, -vmax[b]), vmax[b])
                v_new[i, k] = vk
                r_new[i, k] = (r[i, k] + p[b] * v[i, k]) + s[b] * vk  # r' = r + P v + S v'
    cast = dt.dtype
    return r_new, v_new, dt_new.astype(cast), alpha_new.astype(cast), n_new, back_new
