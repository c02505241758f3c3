"""Molecular-dynamics updates as compiled CPU loops (see :mod:`alchemi_lit.kernels`).

Each runs one primitive of :mod:`alchemi_lit.integrators.ops` (registered by
:mod:`.backend`) and takes the factors the torch path builds and keeps for the run
(``dt / m`` and the noise amplitude), so both paths multiply the same numbers in the
same order -- one per atom ``[N]`` here (the torch path's ``[N, 3]`` repeats it per
component): a third less to read in a pass that, right after the forward, runs at
memory speed.
"""

from __future__ import annotations

import numpy as np
from numba.extending import register_jitable

from ..integrators import formulas
from . import scalar_xp
from .cache import compiled

# the chain's own update, on one system's numbers (its helper compiled where it is called)
register_jitable(formulas.p_eta_step)
_chain_update = compiled(formulas.chain_update)
_bussi_alpha = compiled(formulas.bussi_alpha.__wrapped__)


@compiled
def baoab_first_half(r, v, f, kick, half_dt, c1, sigma, xi, xi_base, step, xi_steps, starts,
                     counts, mask, fixed):  # fmt: skip
    """Langevin BAOAB up to the force call -- ``v += (dt/2m) F``, ``r += (dt/2) v``,
    ``v = c1 v + sigma xi``, ``r += (dt/2) v`` -- for the free atoms of ``mask``'s
    systems.  ``xi`` holds the noise of ``xi_steps`` steps from ``xi_base`` per system
    (:class:`~alchemi_lit.core.random.NormalsWindow`): a system at ``step`` reads block
    ``step - xi_base``.  New ``(positions, velocities, True)``, the others' unchanged;
    ``(r, v, False)``, nothing computed, if a system of ``mask`` lies outside the draw."""
    for b in range(starts.shape[0]):
        if mask[b] and (step[b] < xi_base[b] or step[b] - xi_base[b] >= xi_steps):
            return r, v, False
    n = r.shape[0]
    r_new = np.empty_like(r)
    v_new = np.empty_like(v)
    for b in range(starts.shape[0]):
        h, c = half_dt[b], c1[b]
        row = (step[b] - xi_base[b]) * n
        for i in range(starts[b], starts[b] + counts[b]):
            if not mask[b] or fixed[i]:
                for k in range(3):
                    r_new[i, k], v_new[i, k] = r[i, k], v[i, k]
                continue
            for k in range(3):
                vk = v[i, k] + kick[i] * f[i, k]  # B
                rk = r[i, k] + h * vk  # A
                vk = c * vk + sigma[i] * xi[row + i, k]  # O
                r_new[i, k] = rk + h * vk  # A
                v_new[i, k] = vk
    return r_new, v_new, True


@compiled
def kick(v, f, factors, starts, counts, mask, frozen):
    """``v + factors * F`` (``factors = dt / m`` per atom) for the atoms of
    ``mask``'s systems that are not ``frozen`` (an empty ``frozen``: none is); new
    velocities, the others' unchanged."""
    v_new = np.empty_like(v)
    none_frozen = frozen.shape[0] == 0
    for b in range(starts.shape[0]):
        for i in range(starts[b], starts[b] + counts[b]):
            moves = mask[b] and (none_frozen or not frozen[i])
            for k in range(3):
                v_new[i, k] = v[i, k] + factors[i] * f[i, k] if moves else v[i, k]
    return v_new


@compiled
def kick_drift(r, v, f, kick, dt, scale, starts, counts, mask, fixed):
    """The opening of a velocity-Verlet step -- ``v = scale v + kick F`` (``kick = dt/2m``
    per atom, ``scale`` per system), ``r += dt v`` -- for the free atoms of
    ``mask``'s systems; new ``(positions, velocities)``, the others' unchanged."""
    r_new = np.empty_like(r)
    v_new = np.empty_like(v)
    for b in range(starts.shape[0]):
        h, s = dt[b], scale[b]
        for i in range(starts[b], starts[b] + counts[b]):
            moves = mask[b] and not fixed[i]
            for k in range(3):
                if moves:
                    vk = v[i, k] * s + kick[i] * f[i, k]
                    r_new[i, k], v_new[i, k] = r[i, k] + h * vk, vk
                else:
                    r_new[i, k], v_new[i, k] = r[i, k], v[i, k]
    return r_new, v_new


@compiled
def bussi_kick_drift(r, v, f, kick, dt, masses, c, kt, xi, xi_base, step, xi_steps, starts,
                     counts, mask, fixed):  # fmt: skip
    """Bussi's opening of a step for ``mask``'s systems: each one's kinetic energy over
    its free atoms, ``R1`` (its first free atom's first noise component) and ``S`` (the
    other squares), its velocity scale from :func:`~alchemi_lit.integrators.formulas.
    bussi_alpha`, then
    ``v = alpha v + kick F``, ``r += dt v`` for its free atoms (``kick = dt/2m`` per
    atom).  The noise is read as in :func:`baoab_first_half`; ``(r, v, False)``,
    nothing computed, if a system of ``mask`` lies outside the draw."""
    for b in range(starts.shape[0]):
        if mask[b] and (step[b] < xi_base[b] or step[b] - xi_base[b] >= xi_steps):
            return r, v, False
    n = r.shape[0]
    r_new = r.copy()
    v_new = v.copy()
    for b in range(starts.shape[0]):
        if not mask[b]:
            continue
        lo, hi, row = starts[b], starts[b] + counts[b], (step[b] - xi_base[b]) * n
        mv2 = squares = r1 = nf = 0.0
        for i in range(lo, hi):
            if fixed[i]:
                continue
            if nf == 0.0:
                r1 = xi[row + i, 0]
            nf += 3.0
            for k in range(3):
                mv2 += v[i, k] * v[i, k] * masses[i]
                squares += xi[row + i, k] * xi[row + i, k]
        alpha = _bussi_alpha(scalar_xp, c[b], kt[b], nf, 0.5 * mv2, r1, squares - r1 * r1)
        h = dt[b]
        for i in range(lo, hi):
            if not fixed[i]:
                for k in range(3):
                    vk = v[i, k] * alpha + kick[i] * f[i, k]
                    r_new[i, k], v_new[i, k] = r[i, k] + h * vk, vk
    return r_new, v_new, True


@compiled
def nhc_half_step(v, masses, starts, counts, mask, fixed, eta, p, q, kt, nf, delta, weights,
                  chain_steps):  # fmt: skip
    """A Nosé-Hoover chain's half step (:func:`~alchemi_lit.integrators.ops.nhc_half_step`)
    for ``mask``'s systems: ``m v^2`` over their free atoms, the chain
    update, the free atoms' velocities scaled.  New ``(velocities, eta, p_eta)``."""
    v_new = v.copy()
    eta_new, p_new = eta.copy(), p.copy()
    m = eta.shape[1]
    for b in range(starts.shape[0]):
        if not mask[b]:
            continue
        lo, hi = starts[b], starts[b] + counts[b]
        mv2 = 0.0
        for i in range(lo, hi):
            if not fixed[i]:
                for k in range(3):
                    mv2 += v[i, k] * v[i, k] * masses[i]
        e = [eta[b, j] for j in range(m)]
        pp = [p[b, j] for j in range(m)]
        qq = [q[b, j] for j in range(m)]
        scale = _chain_update(scalar_xp, e, pp, qq, kt[b], nf[b], mv2, delta[b], weights,
                              chain_steps)  # fmt: skip
        for j in range(m):
            eta_new[b, j], p_new[b, j] = e[j], pp[j]
        for i in range(lo, hi):
            if not fixed[i]:
                for k in range(3):
                    v_new[i, k] = v[i, k] * scale
    return v_new, eta_new, p_new
