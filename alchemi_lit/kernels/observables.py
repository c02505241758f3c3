"""The MD observables' per-sample updates as compiled CPU loops (see
:mod:`alchemi_lit.kernels`): the windows of MSD and VACF and the block sums of
BlockAverages, one pass each.

Why: an observable sampled every step is a few dozen small torch operations, each run
cold right after the model's forward, a sizeable share of a cheap model's step (figures:
benchmark page 17).  The same arithmetic in one loop pays that once.  Results are
the torch references' (:mod:`alchemi_lit.core.correlation`, :mod:`alchemi_lit.core.
blocking`) to rounding; rows not sampled keep their bits.
"""

from __future__ import annotations

import numpy as np

from .cache import compiled


@compiled
def window_lag(x, origin, start, free, count, starts, counts, squared, value):
    """Origins of the systems ``start`` set to ``x`` (in place: ``origin`` is a copy),
    and into ``value`` each system's free-atom mean of ``|x - o|^2`` or ``x . o``, the
    atoms added in order from zero (as the torch reference's run sums)."""
    for b in range(starts.shape[0]):
        acc = value[b] * 0.0
        for i in range(starts[b], starts[b] + counts[b]):
            if start[b]:
                origin[i, 0], origin[i, 1], origin[i, 2] = x[i, 0], x[i, 1], x[i, 2]
            if squared:
                d0, d1, d2 = x[i, 0] - origin[i, 0], x[i, 1] - origin[i, 1], x[i, 2] - origin[i, 2]
                v = d0 * d0 + d1 * d1 + d2 * d2
            else:
                v = x[i, 0] * origin[i, 0] + x[i, 1] * origin[i, 1] + x[i, 2] * origin[i, 2]
            acc += v * free[i]
        value[b] = acc / count[b]


@compiled
def window_update(value, rows, samples, curve, total, estimates, windows, dt, step_dt,
                  weights, dt_power, scale):  # fmt: skip
    """In place on copies: the sampled rows' lag, lag time and, where a window closes,
    its curve and estimate added (core.correlation.window_update)."""
    w = curve.shape[1]
    for b in range(rows.shape[0]):
        if not rows[b]:
            continue
        pos = samples[b] % w
        curve[b, pos] = value[b]
        dt[b] = step_dt[b]
        if pos == w - 1:
            acc = 0.0
            for k in range(w):
                acc += curve[b, k] * weights[k]
                total[b, k] += curve[b, k]
            if dt_power > 0:
                est = acc * dt[b] * scale
            else:
                est = acc * (1.0 / (dt[b] if dt[b] > 0 else 1.0)) * scale
            estimates[b, 0] += est
            estimates[b, 1] += est * est
            windows[b] += 1
        samples[b] += 1


@compiled
def window_sample(x, origin, rows, free, count, starts, counts, squared, samples, curve, total,
                  estimates, windows, dt, step_dt, weights, dt_power, scale, value):  # fmt: skip
    """:func:`window_lag` with the windows that start at this sample, then
    :func:`window_update`, in place on copies (core.correlation.window_sample)."""
    start = np.empty(rows.shape[0], dtype=np.bool_)
    for b in range(rows.shape[0]):
        start[b] = rows[b] and samples[b] % curve.shape[1] == 0
    window_lag(x, origin, start, free, count, starts, counts, squared, value)
    window_update(value, rows, samples, curve, total, estimates, windows, dt, step_dt,
                  weights, dt_power, scale)  # fmt: skip


@compiled
def block_update(n, shift, partial, sums, squares, x, rows):
    """In place on copies: one sample of each row's series into its block sums
    (core.blocking.update)."""
    for b in range(rows.shape[0]):
        if not rows[b]:
            continue
        if n[b] == 0:
            for q in range(x.shape[1]):
                shift[b, q] = x[b, q]
        count = n[b] + 1
        for q in range(x.shape[1]):
            y = x[b, q] - shift[b, q]
            for level in range(partial.shape[2]):
                partial[b, q, level] += y
                size = 1 << level
                if count % size == 0:
                    mean = partial[b, q, level] / size
                    sums[b, q, level] += mean
                    squares[b, q, level] += mean * mean
                    partial[b, q, level] = 0.0
        n[b] = count
