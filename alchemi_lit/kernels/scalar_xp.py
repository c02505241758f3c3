"""The array namespace of :func:`~alchemi_lit.core.tensor_ops.per_system` functions, for one
system's numbers inside a compiled kernel.

Why: a kernel calls an integrator's own per-system function (FIRE's decisions, say) with this module
as ``xp`` and one system's scalars, so the decisions stay written once.  Compiling the same function
on NumPy arrays instead took several times longer per kernel and dtype (numba types every array
expression; figures in docs/design/08-compiled-cpu-kernels-for-the-per-step.md), and on scalars the
values are those of the NumPy path (float64: bit for bit, tested).
"""

from __future__ import annotations

import math

import numba


@numba.njit(inline="always")
def where(condition, a, b):
    return a if condition else b


@numba.njit(inline="always")
def sqrt(x):
    return math.sqrt(x)


@numba.njit(inline="always")
def exp(x):
    return math.exp(x)


@numba.njit(inline="always")
def ones_like(x):
    return 1.0


@numba.njit(inline="always")
def zeros_like(x):
    return 0.0


@numba.njit(inline="always")
def full_like(x, value):
    return value
