"""Per-step sums and checks as compiled CPU loops (see :mod:`alchemi_lit.kernels`):
run sums, the force criterion's per-system maximum, NaNGuard's finiteness pre-test, the
kinetic energy and temperature and the cell volumes, each one pass over the arrays
instead of several torch operations."""

from __future__ import annotations

import numpy as np

from .cache import compiled


@compiled
def run_sums(v, counts, out):
    """Sums of consecutive runs of ``v`` ``[P, k]`` rows (``counts[r]`` each) into ``out``
    ``[R, k]`` (zeros, ``v``'s dtype): each run added row after row from zero, as
    ``torch.segment_reduce`` adds -- the same bits (core.segments.run_sums)."""
    e = 0
    for r in range(counts.shape[0]):
        n = counts[r]
        for c in range(v.shape[1]):  # (a local sum per column: registers, not memory)
            acc = out[r, c]  # (zero, of v's dtype: float32 adds in float32)
            for q in range(e, e + n):
                acc += v[q, c]
            out[r, c] = acc
        e += n
    return out


@compiled
def max_sq_norm_below(f, starts, counts, limit):
    """Whether each system's largest squared row norm ``max_i |f_i|^2`` is below
    ``limit`` ``[B]`` (a system without atoms is; a NaN row makes it False, as the
    torch path's ``scatter_reduce`` maximum does)."""
    out = np.empty(starts.shape[0], dtype=np.bool_)
    for b in range(starts.shape[0]):
        top = 0.0
        for i in range(starts[b], starts[b] + counts[b]):
            sq = f[i, 0] * f[i, 0] + f[i, 1] * f[i, 1] + f[i, 2] * f[i, 2]
            if sq > top or sq != sq:
                top = sq
                if sq != sq:
                    break
        out[b] = top < limit
    return out


@compiled
def finite_total(forces, positions, energy):
    """Whether ``sum |F|^2 + sum r + sum E`` is finite: NaN and inf propagate through
    the sum, so True clears every value at once (False only means: test per system).
    One running sum per column: three independent additions per row instead of one
    chain, which the CPU can overlap (the order of a sum does not change whether it is
    finite)."""
    t0 = t1 = t2 = 0.0
    for i in range(forces.shape[0]):
        t0 += forces[i, 0] * forces[i, 0] + positions[i, 0]
        t1 += forces[i, 1] * forces[i, 1] + positions[i, 1]
        t2 += forces[i, 2] * forces[i, 2] + positions[i, 2]
    total = t0 + t1 + t2
    for e in energy:
        total += e
    return np.isfinite(total)


@compiled
def kinetic_sums(v, m, counts, atoms, out):
    """``out[r]`` (zeros, ``v``'s dtype) = ``0.5 sum (v * v) * m`` over run ``r``'s atoms
    (those with ``atoms[i]``; all where ``atoms`` is empty), each atom's components
    added x, y, z: the order and bits of :func:`alchemi_lit.core.system_sums.
    kinetic_energy`."""
    e = 0
    every = atoms.shape[0] == 0
    for r in range(counts.shape[0]):
        acc = out[r]  # (zero of v's dtype: float32 adds in float32)
        for i in range(e, e + counts[r]):
            if every or atoms[i]:
                acc += v[i, 0] * v[i, 0] * m[i]
                acc += v[i, 1] * v[i, 1] * m[i]
                acc += v[i, 2] * v[i, 2] * m[i]
        out[r] = acc * 0.5  # (exact: the same bits in either precision)
        e += counts[r]
    return out


@compiled
def temperatures(v, m, counts, n_atoms, fixed, removed, consts, out):
    """``out[r]`` = ``2 KE / (max(dof, 1) kB)`` of run ``r``, with ``dof = 3 (free atoms)
    - removed[r]`` (free: not ``fixed``, or all where ``fixed`` is empty; ``n_atoms`` and
    ``removed`` in ``v``'s dtype) and ``consts = [kB, 1, 3]`` in ``v``'s dtype, so each
    operation rounds as :func:`alchemi_lit.core.system_sums.temperature`'s does."""
    kinetic_sums(v, m, counts, fixed[:0], out)
    kb, one, three = consts[0], consts[1], consts[2]
    e = 0
    for r in range(counts.shape[0]):
        if fixed.shape[0] == 0:
            free = n_atoms[r]
        else:
            free = one - one
            for i in range(e, e + counts[r]):
                if not fixed[i]:
                    free += one
        dof = three * free - removed[r]
        if dof < one:
            dof = one
        out[r] = (out[r] + out[r]) / (dof * kb)
        e += counts[r]
    return out


@compiled
def cell_volumes(c, out):
    """``out[b] = |det(c[b])|`` by cofactors along the first row, in the order of
    :func:`alchemi_lit.core.system_sums.cell_volume`."""
    for b in range(c.shape[0]):
        minor0 = c[b, 1, 1] * c[b, 2, 2] - c[b, 1, 2] * c[b, 2, 1]
        minor1 = c[b, 1, 0] * c[b, 2, 2] - c[b, 1, 2] * c[b, 2, 0]
        minor2 = c[b, 1, 0] * c[b, 2, 1] - c[b, 1, 1] * c[b, 2, 0]
        out[b] = abs(c[b, 0, 0] * minor0 - c[b, 0, 1] * minor1 + c[b, 0, 2] * minor2)
    return out
