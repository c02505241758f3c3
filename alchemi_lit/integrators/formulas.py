"""Per-system formulas of the built-in integrators, written once for torch, NumPy and
one system's numbers in a compiled kernel.

Each function takes its array namespace ``xp`` first (see
:func:`~alchemi_lit.core.tensor_ops.per_system`): torch on an accelerator, NumPy on CPU, and
:mod:`alchemi_lit.kernels.scalar_xp` inside a numba kernel, which compiles the very same
function.  So FIRE's decisions, Bussi's rescaling factor and the Nosé-Hoover chain are
written here only, and this module imports nothing above the core: the integrators'
torch code (:mod:`.ops`) and the CPU kernels both read it.
"""

from __future__ import annotations

from typing import Any

from ..core.tensor_ops import per_system

#: Suzuki-Yoshida weights by order (number of sub-steps).
SUZUKI_YOSHIDA = {
    1: (1.0,),
    3: (
        1 / (2 - 2 ** (1 / 3)),
        -(2 ** (1 / 3)) / (2 - 2 ** (1 / 3)),
        1 / (2 - 2 ** (1 / 3)),
    ),
    5: (
        1 / (4 - 4 ** (1 / 3)),
        1 / (4 - 4 ** (1 / 3)),
        1 - 4 / (4 - 4 ** (1 / 3)),
        1 / (4 - 4 ** (1 / 3)),
        1 / (4 - 4 ** (1 / 3)),
    ),
}


@per_system
def fire_coefficients(
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


@per_system
def fire2_coefficients(
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
    ``(A, C, P, S, vmax)`` of the update in :func:`~.ops.fire2_update` (``vmax``, the
    per-component clip, is used with ``use_abc`` only), then the new
    ``dt``, ``alpha``, ``n``, ``back`` (unchanged outside ``mask``).  ``xp``: NumPy or
    torch (see :func:`~alchemi_lit.core.tensor_ops.per_system`)."""
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


@per_system
def bussi_alpha(xp: Any, c: Any, kt: Any, nf: Any, ke: Any, r1: Any, s: Any) -> Any:
    """Eq. A7 per system; 1 where there is no kinetic energy or no free atom."""
    ok = (ke > 0) & (nf > 0)
    one = xp.ones_like(c)
    denom = nf * xp.where(ok, ke, one)
    term = (1.0 - c) * (0.5 * nf * kt) / xp.where(denom > 1e-300, denom, 1e-300)
    a2 = c + term * (s + r1 * r1) + 2.0 * r1 * xp.sqrt(c * term)
    return xp.where(ok, xp.sqrt(xp.where(a2 > 0, a2, 0.0)), one)


@per_system
def chain_half_step(
    xp: Any,
    mask: Any,
    old_eta: Any,
    old_p: Any,
    q: Any,
    kt: Any,
    nf: Any,
    mv2: Any,
    delta: Any,
    *,
    weights: tuple[float, ...],
    chain_steps: int,
) -> tuple[Any, Any, Any]:
    """The chain's half step per system (ASE's ``_integrate_nhc``): new ``eta``, ``p_eta``
    (unchanged outside ``mask``) and the velocity scale.  ``xp``: NumPy or torch."""
    m = old_eta.shape[1]
    eta = [old_eta[:, j] for j in range(m)]
    p = [old_p[:, j] for j in range(m)]
    scale = chain_update(xp, eta, p, [q[:, j] for j in range(m)], kt, nf, mv2, delta,
                         weights, chain_steps)  # fmt: skip
    inside = mask[:, None]
    new_eta = xp.where(inside, xp.stack(eta, -1), old_eta)
    new_p = xp.where(inside, xp.stack(p, -1), old_p)
    return new_eta, new_p, xp.where(mask, scale, xp.ones_like(scale))


def chain_update(
    xp: Any,
    eta: list[Any],
    p: list[Any],
    q: list[Any],
    kt: Any,
    nf: Any,
    mv2: Any,
    delta: Any,
    weights: tuple[float, ...],
    chain_steps: int,
) -> Any:
    """ASE's ``_integrate_nhc`` on the chain members ``eta[j]``, ``p[j]`` (updated in
    place) with masses ``q[j]``: per-system ``[B]`` arrays, or one system's numbers in
    the compiled CPU kernel (:mod:`~alchemi_lit.kernels.scalar_xp`).  Returns the
    velocity scale."""
    m = len(p)
    scale = xp.ones_like(kt)
    delta = delta * xp.ones_like(kt)
    for _ in range(chain_steps):
        for w in weights:
            d = w * delta / chain_steps
            for j in range(m - 1, -1, -1):
                p_eta_step(xp, p, q, j, mv2 - nf * kt, kt, d)
            for j in range(m):
                eta[j] = eta[j] + d * p[j] / q[j]
            s = xp.exp(-d * p[0] / q[0])
            scale = scale * s
            mv2 = mv2 * s * s
            for j in range(m):
                p_eta_step(xp, p, q, j, mv2 - nf * kt, kt, d)
    return scale


def p_eta_step(xp: Any, p: list[Any], q: list[Any], j: int, g0: Any, kt: Any, d: Any) -> None:
    """ASE's ``_integrate_p_eta_j``: update chain momentum ``j`` over ``d/2`` in place."""
    m = len(p)
    if j < m - 1:
        p[j] = p[j] * xp.exp(-0.25 * d * p[j + 1] / q[j + 1])
    g = g0 if j == 0 else p[j - 1] * p[j - 1] / q[j - 1] - kt
    p[j] = p[j] + 0.5 * d * g
    if j < m - 1:
        p[j] = p[j] * xp.exp(-0.25 * d * p[j + 1] / q[j + 1])
