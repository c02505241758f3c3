"""Molecular-dynamics updates as compiled CPU loops (see :mod:`alchemi_lit.kernels`).

Each takes the factors the torch path builds and keeps for the run (``dt / m`` and the
noise amplitude per atom component), so both paths multiply the same numbers in the
same order.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def baoab_first_half(r, v, f, kick, half_dt, c1, sigma, xi, starts, counts, mask, fixed):
    """Langevin BAOAB up to the force call -- ``v += (dt/2m) F``, ``r += (dt/2) v``,
    ``v = c1 v + sigma xi``, ``r += (dt/2) v`` -- for the free atoms of ``mask``'s
    systems; new ``(positions, velocities)``, the others' unchanged."""
    r_new = np.empty_like(r)
    v_new = np.empty_like(v)
    for b in range(starts.shape[0]):
        h, c = half_dt[b], c1[b]
        for i in range(starts[b], starts[b] + counts[b]):
            if not mask[b] or fixed[i]:
                for k in range(3):
                    r_new[i, k], v_new[i, k] = r[i, k], v[i, k]
                continue
            for k in range(3):
                vk = v[i, k] + kick[i, k] * f[i, k]  # B
                rk = r[i, k] + h * vk  # A
                vk = c * vk + sigma[i, k] * xi[i, k]  # O
                r_new[i, k] = rk + h * vk  # A
                v_new[i, k] = vk
    return r_new, v_new


@numba.njit(cache=True, nogil=True)
def kick(v, f, factors, starts, counts, mask, frozen):
    """``v + factors * F`` (``factors = dt / m`` per component) for the atoms of
    ``mask``'s systems that are not ``frozen`` (an empty ``frozen``: none is); new
    velocities, the others' unchanged."""
    v_new = np.empty_like(v)
    none_frozen = frozen.shape[0] == 0
    for b in range(starts.shape[0]):
        for i in range(starts[b], starts[b] + counts[b]):
            moves = mask[b] and (none_frozen or not frozen[i])
            for k in range(3):
                v_new[i, k] = v[i, k] + factors[i, k] * f[i, k] if moves else v[i, k]
    return v_new
