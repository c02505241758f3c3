"""The constraint kinds' per-step work as compiled CPU loops (see :mod:`alchemi_lit.kernels`):
SHAKE / RATTLE sweeps to convergence, Hookean springs, ExternalForce pulls, the axis
projections (FixCartesian, FixedPlane, FixedLine) and FixCom, one call each.

Why: the torch path (:mod:`alchemi_lit.core.constraint_bonds`, :mod:`~alchemi_lit.core.
constraint_forces`) computes every slot of every atom -- 27 periodic images of each and a
host read per SHAKE sweep -- where only a quarter of the atoms may carry a constraint.
A loop visits the constrained atoms alone and sweeps each system until it has converged,
as ASE does; the arithmetic is the torch path's, term after term (the sweeps multiply by
reciprocal masses kept per bond where it divides: the same to rounding).
"""

from __future__ import annotations

import numpy as np

from ..core.constraint_forces import SPRING_ATOM, SPRING_PLANE
from ..core.constraint_kinds import AXIS_CARTESIAN, AXIS_LINE, AXIS_PLANE, COM_FORCES, COM_POSITIONS
from .cache import compiled


@compiled
def mic(d0, d1, d2, cell, inv, pbc, reach):
    """``(d0, d1, d2)`` as its shortest periodic image (the torch ``minimum_image``):
    fractional coordinates wrapped along periodic axes, then the shortest of the 27
    neighbouring images (the first one on a tie, as ``argmin``).  ``cell`` / ``inv``
    ``[3, 3]``: the system's cell with identity rows along open axes and its inverse;
    ``pbc`` ``[3]`` 1.0 / 0.0; ``reach``: a squared length below which the wrapped
    image is the shortest (:func:`lattice_reach`), so the 26 others are not tried."""
    f0 = d0 * inv[0, 0] + d1 * inv[1, 0] + d2 * inv[2, 0]  # (scalars: no array per call)
    f1 = d0 * inv[0, 1] + d1 * inv[1, 1] + d2 * inv[2, 1]
    f2 = d0 * inv[0, 2] + d1 * inv[1, 2] + d2 * inv[2, 2]
    f0, f1, f2 = f0 - np.rint(f0) * pbc[0], f1 - np.rint(f1) * pbc[1], f2 - np.rint(f2) * pbc[2]
    w0 = f0 * cell[0, 0] + f1 * cell[1, 0] + f2 * cell[2, 0]
    w1 = f0 * cell[0, 1] + f1 * cell[1, 1] + f2 * cell[2, 1]
    w2 = f0 * cell[0, 2] + f1 * cell[1, 2] + f2 * cell[2, 2]
    if w0 * w0 + w1 * w1 + w2 * w2 < reach:
        return w0, w1, w2
    best, b0, b1, b2 = np.inf, 0.0, 0.0, 0.0
    for a in range(-1, 2):
        for b in range(-1, 2):
            for c in range(-1, 2):
                g0, g1, g2 = f0 + a * pbc[0], f1 + b * pbc[1], f2 + c * pbc[2]
                i0 = g0 * cell[0, 0] + g1 * cell[1, 0] + g2 * cell[2, 0]
                i1 = g0 * cell[0, 1] + g1 * cell[1, 1] + g2 * cell[2, 1]
                i2 = g0 * cell[0, 2] + g1 * cell[1, 2] + g2 * cell[2, 2]
                sq = i0 * i0 + i1 * i1 + i2 * i2
                if sq < best:
                    best, b0, b1, b2 = sq, i0, i1, i2
    return b0, b1, b2


@compiled
def lattice_reach(inv, pbc):
    """Per system ``[B]``: ``(0.49 h)^2`` with ``h`` the smallest height of the cell
    along its periodic axes (``1 / |column k of the inverse|``).  Every lattice vector
    ``L`` is at least ``h`` long, so a vector ``d`` shorter than ``0.49 h`` is shorter
    than ``d + L`` by at least ``0.02 h`` -- far beyond rounding: the wrapped image is
    the one the 27-image search returns.  Infinite without a periodic axis."""
    out = np.full(inv.shape[0], np.inf)
    for s in range(inv.shape[0]):
        for k in range(3):
            if pbc[s, k]:
                col = inv[s, 0, k] ** 2 + inv[s, 1, k] ** 2 + inv[s, 2, k] ** 2
                out[s] = min(out[s], 0.49 * 0.49 / col)
    return out


@compiled
def bond_list(offset, length, masses, starts, counts):
    """The rigid bonds as a list, system after system and in each colour after colour
    (the sweep order): both atoms ``[K]``; the length, the reduced mass (as the torch
    path computes it) and both atoms' reciprocal masses ``[K, 4]``; and where each
    system's bonds start ``[B + 1]``."""
    total = 0
    for i in range(length.shape[0]):
        for c in range(length.shape[1]):
            if length[i, c] > 0:
                total += 1
    a, b, cd = np.empty(total, np.int64), np.empty(total, np.int64), np.empty((total, 4))
    first = np.zeros(starts.shape[0] + 1, np.int64)
    k = 0
    for s in range(starts.shape[0]):
        first[s] = k
        for c in range(length.shape[1]):
            for i in range(starts[s], starts[s] + counts[s]):
                if length[i, c] > 0:
                    j = i + offset[i, c]
                    a[k], b[k], cd[k, 0] = i, j, length[i, c]
                    cd[k, 1] = 1.0 / (1.0 / masses[i] + 1.0 / masses[j])
                    cd[k, 2], cd[k, 3] = 1.0 / masses[i], 1.0 / masses[j]
                    k += 1
    first[starts.shape[0]] = k
    return a, b, cd, first


@compiled
def bond_vectors(ref, a, b, first, cell, inv, pbc, reach):
    """Each bond's vector at ``ref`` (``r0``) and its minimum image (``d0``), ``[K, 3]``."""
    r0, d0 = np.empty((a.shape[0], 3)), np.empty((a.shape[0], 3))
    for s in range(first.shape[0] - 1):
        cs, vs, ps, rs = cell[s], inv[s], pbc[s], reach[s]  # (once per system, not per bond)
        for k in range(first[s], first[s + 1]):
            x0 = ref[a[k], 0] - ref[b[k], 0]
            x1 = ref[a[k], 1] - ref[b[k], 1]
            x2 = ref[a[k], 2] - ref[b[k], 2]
            r0[k, 0], r0[k, 1], r0[k, 2] = x0, x1, x2
            d0[k, 0], d0[k, 1], d0[k, 2] = mic(x0, x1, x2, cs, vs, ps, rs)
    return r0, d0


@compiled
def shake(new, r0, d0, masses, a, b, cd, first, active, tol, max_sweeps):
    """SHAKE: ``new`` positions (a copy) with every bond of the active systems at its
    length, in :func:`bond_list`'s order, sweeping each system until no correction
    exceeds its ``tol``; and the first system row that did not converge in
    ``max_sweeps`` (-1: none)."""
    new = new.copy()
    for s in range(first.shape[0] - 1):
        if not active[s]:
            continue
        moved = True
        for _ in range(max_sweeps):
            moved = False
            for k in range(first[s], first[s + 1]):
                i, j, length = a[k], b[k], cd[k, 0]
                e0 = new[i, 0] - new[j, 0] - r0[k, 0] + d0[k, 0]
                e1 = new[i, 1] - new[j, 1] - r0[k, 1] + d0[k, 1]
                e2 = new[i, 2] - new[j, 2] - r0[k, 2] + d0[k, 2]
                g0, g1, g2 = d0[k, 0], d0[k, 1], d0[k, 2]
                x = 0.5 * (length * length - (e0 * e0 + e1 * e1 + e2 * e2)) / (
                    g0 * e0 + g1 * e1 + g2 * e2
                )
                if abs(x) > tol[s]:
                    moved = True
                    _push(new, i, j, x * cd[k, 1], g0, g1, g2, cd[k, 2], cd[k, 3])
            if not moved:
                break
        if moved:
            return new, s
    return new, -1


@compiled
def rattle(v, d0, masses, a, b, cd, first, active, tol, max_sweeps):
    """RATTLE: velocities ``v`` (a copy) without a component along any bond of the
    active systems, swept as :func:`shake`; and the first unconverged row (-1: none)."""
    v = v.copy()
    for s in range(first.shape[0] - 1):
        if active[s] and not _rattle_system(v, d0, masses, a, b, cd, first, s, tol, max_sweeps):
            return v, s
    return v, -1


@compiled
def rattle_forces(f, d0, masses, starts, counts, a, b, cd, first, active, tol, max_sweeps):
    """RATTLE of forces (the torch ``rattle_forces``): ``f / m`` swept as velocities,
    times ``m`` again, on the atoms of the active systems (a copy); the unconverged row."""
    out = f.copy()
    for s in range(first.shape[0] - 1):
        if not active[s]:
            continue
        for i in range(starts[s], starts[s] + counts[s]):
            for c in range(3):
                out[i, c] = f[i, c] / masses[i]
        if not _rattle_system(out, d0, masses, a, b, cd, first, s, tol, max_sweeps):
            return out, s
        for i in range(starts[s], starts[s] + counts[s]):
            for c in range(3):
                out[i, c] = out[i, c] * masses[i]
    return out, -1


@compiled
def _rattle_system(v, d0, masses, a, b, cd, first, s, tol, max_sweeps):
    """System ``s``'s RATTLE sweeps on ``v`` in place; whether they converged."""
    for _ in range(max_sweeps):
        moved = False
        for k in range(first[s], first[s + 1]):
            i, j = a[k], b[k]
            g0, g1, g2 = d0[k, 0], d0[k, 1], d0[k, 2]
            dot = (v[i, 0] - v[j, 0]) * g0 + (v[i, 1] - v[j, 1]) * g1
            dot = dot + (v[i, 2] - v[j, 2]) * g2
            x = -dot / max(cd[k, 0] * cd[k, 0], 1e-300)
            if abs(x) > tol[s]:
                moved = True
                _push(v, i, j, x * cd[k, 1], g0, g1, g2, cd[k, 2], cd[k, 3])
        if not moved:
            return True
    return False


@compiled
def _push(a, i, j, xm, g0, g1, g2, wi, wj):
    """``a[i] += xm g w_i``, ``a[j] -= xm g w_j`` (``xm``: the correction times the
    bond's reduced mass; ``w``: the reciprocal masses, kept per bond -- products where
    the torch path divides: the same to rounding, without six divisions a push)."""
    s0, s1, s2 = xm * g0, xm * g1, xm * g2
    a[i, 0] += s0 * wi
    a[i, 1] += s1 * wi
    a[i, 2] += s2 * wi
    a[j, 0] += -s0 * wj
    a[j, 1] += -s1 * wj
    a[j, 2] += -s2 * wj


@compiled
def springs(r, kind, offset, k, rt, target, starts, counts, active, cell, inv, pbc, reach):
    """Hookean springs (the torch ``spring_terms``): the force on each atom ``[N, 3]``
    and each slot's energy ``[N]``, visiting only the atoms that carry a spring."""
    force, energy = np.zeros_like(r), np.zeros(r.shape[0])
    for s in range(starts.shape[0]):
        if not active[s]:
            continue
        cs, vs, ps, rs = cell[s], inv[s], pbc[s], reach[s]  # (once per system, not per spring)
        for i in range(starts[s], starts[s] + counts[s]):
            kd = kind[i]
            if kd == SPRING_PLANE:
                n0, n1, n2 = target[i, 0], target[i, 1], target[i, 2]
                norm = max(np.sqrt(n0 * n0 + n1 * n1 + n2 * n2), 1e-300)
                dist = (r[i, 0] * n0 + r[i, 1] * n1 + r[i, 2] * n2 + target[i, 3]) / norm
                if dist >= 0:
                    scale = -(k[i] * dist / norm)
                    force[i, 0] += scale * n0
                    force[i, 1] += scale * n1
                    force[i, 2] += scale * n2
                if dist > 0:
                    energy[i] = 0.5 * k[i] * dist * dist
            elif kd != 0:  # SPRING_ATOM or SPRING_POINT
                j = i + offset[i]
                if kd == SPRING_ATOM:
                    p0, p1, p2 = r[j, 0], r[j, 1], r[j, 2]
                else:
                    p0, p1, p2 = target[i, 0], target[i, 1], target[i, 2]
                d0, d1, d2 = mic(p0 - r[i, 0], p1 - r[i, 1], p2 - r[i, 2], cs, vs, ps, rs)
                length = np.sqrt(d0 * d0 + d1 * d1 + d2 * d2)
                stretch = length - rt[i]
                if stretch > 0:
                    scale = k[i] * stretch / max(length, 1e-300)
                    f0, f1, f2 = scale * d0, scale * d1, scale * d2
                    force[i, 0] += f0
                    force[i, 1] += f1
                    force[i, 2] += f2
                    energy[i] = 0.5 * k[i] * stretch * stretch
                    if kd == SPRING_ATOM:
                        force[j, 0] += -f0
                        force[j, 1] += -f1
                        force[j, 2] += -f2
    return force, energy


@compiled
def pulls(r, offset, pull, starts, counts, active):
    """ExternalForce pulls (the torch ``pull_terms``): the force on each atom ``[N, 3]``
    and each slot's energy ``[N]``, visiting only the atoms that carry a pull."""
    force, energy = np.zeros_like(r), np.zeros(r.shape[0])
    for s in range(starts.shape[0]):
        if not active[s]:
            continue
        for i in range(starts[s], starts[s] + counts[s]):
            if offset[i] == 0:
                continue
            j = i + offset[i]
            d0, d1, d2 = r[i, 0] - r[j, 0], r[i, 1] - r[j, 1], r[i, 2] - r[j, 2]
            length = np.sqrt(d0 * d0 + d1 * d1 + d2 * d2)
            scale = pull[i] / max(length, 1e-300)
            for c, dc in enumerate((d0, d1, d2)):
                force[i, c] += scale * dc
                force[j, c] += -(scale * dc)
            energy[i] = -length * pull[i]
    return force, energy


@compiled
def axis_project(f, kind, vec, starts, counts, active):
    """FixCartesian / FixedPlane / FixedLine on forces or velocities (the torch
    ``axis_project``): a copy of ``f`` with the fixed components removed."""
    out = f.copy()
    for s in range(starts.shape[0]):
        if not active[s]:
            continue
        for i in range(starts[s], starts[s] + counts[s]):
            kd = kind[i]
            if kd == 0:
                continue
            d0, d1, d2 = vec[i, 0], vec[i, 1], vec[i, 2]
            if kd == AXIS_CARTESIAN:
                for c in range(3):
                    out[i, c] = f[i, c] * (1.0 - vec[i, c])  # f * ~mask
                continue
            dot = f[i, 0] * d0 + f[i, 1] * d1 + f[i, 2] * d2
            a0, a1, a2 = dot * d0, dot * d1, dot * d2
            if kd == AXIS_PLANE:
                out[i, 0], out[i, 1], out[i, 2] = f[i, 0] - a0, f[i, 1] - a1, f[i, 2] - a2
            elif kd == AXIS_LINE:
                out[i, 0], out[i, 1], out[i, 2] = a0, a1, a2
    return out


@compiled
def axis_positions(old, new, kind, vec, starts, counts, active):
    """FixCartesian / FixedPlane / FixedLine on a move ``old -> new`` (the torch
    ``axis_positions``): a copy of ``new`` with the fixed part of the move undone."""
    out = new.copy()
    for s in range(starts.shape[0]):
        if not active[s]:
            continue
        for i in range(starts[s], starts[s] + counts[s]):
            kd = kind[i]
            if kd == 0:
                continue
            if kd == AXIS_CARTESIAN:
                for c in range(3):
                    if vec[i, c] != 0:
                        out[i, c] = old[i, c]
                continue
            d0, d1, d2 = vec[i, 0], vec[i, 1], vec[i, 2]
            m0, m1, m2 = new[i, 0] - old[i, 0], new[i, 1] - old[i, 1], new[i, 2] - old[i, 2]
            dot = m0 * d0 + m1 * d1 + m2 * d2
            a0, a1, a2 = dot * d0, dot * d1, dot * d2
            if kd == AXIS_PLANE:
                out[i, 0], out[i, 1], out[i, 2] = new[i, 0] - a0, new[i, 1] - a1, new[i, 2] - a2
            elif kd == AXIS_LINE:
                out[i, 0], out[i, 1], out[i, 2] = old[i, 0] + a0, old[i, 1] + a1, old[i, 2] + a2
    return out


@compiled
def fix_com(x, ref, masses, what, starts, counts, on):
    """FixCom (the torch ``fix_com``) for the systems ``on``: a copy of ``x`` moved by
    the centre's move from ``ref`` (``COM_POSITIONS``), less the centre's velocity
    (``COM_VELOCITIES``) or less ``m λ`` (``COM_FORCES``); each sum runs atom after atom
    from zero, as the run sums of the reference (one pass for all of them)."""
    out = x.copy()
    for s in range(starts.shape[0]):
        if not on[s]:
            continue
        a, e = starts[s], starts[s] + counts[s]
        w, x0, x1, x2, r0, r1, r2 = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
        for i in range(a, e):
            m = masses[i]
            w += m * m if what == COM_FORCES else m
            x0, x1, x2 = x0 + x[i, 0] * m, x1 + x[i, 1] * m, x2 + x[i, 2] * m
            r0, r1, r2 = r0 + ref[i, 0] * m, r1 + ref[i, 1] * m, r2 + ref[i, 2] * m
        w = max(w, 1e-300)
        x0, x1, x2 = x0 / w, x1 / w, x2 / w
        if what == COM_POSITIONS:  # (new + (mean(ref) - mean(new)), as the reference)
            x0, x1, x2 = -(r0 / w - x0), -(r1 / w - x1), -(r2 / w - x2)
        for i in range(a, e):
            scale = masses[i] if what == COM_FORCES else 1.0
            out[i, 0] = x[i, 0] - scale * x0
            out[i, 1] = x[i, 1] - scale * x1
            out[i, 2] = x[i, 2] - scale * x2
    return out


@compiled
def drift_velocities(v, new, unconstrained, dt, starts, counts, on):
    """``v + (new - unconstrained) / dt[s]`` on the atoms of the systems ``on`` (the
    torch ``constrain.drift_velocities``: RATTLE's first half), a copy."""
    out = v.copy()
    for s in range(starts.shape[0]):
        if on[s]:
            for i in range(starts[s], starts[s] + counts[s]):
                for c in range(3):
                    out[i, c] = v[i, c] + (new[i, c] - unconstrained[i, c]) / dt[s]
    return out
