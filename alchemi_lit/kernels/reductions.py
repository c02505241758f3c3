"""Per-step checks over the forces as compiled CPU loops (see :mod:`alchemi_lit.kernels`):
the force criterion's per-system maximum and NaNGuard's finiteness pre-test, each one
pass over the arrays instead of four to seven torch operations."""

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
