"""Batched functions of small matrices (``[B, n, n]``, float64-accurate): the principal
logarithm and square root, the exponential and the adjoint of its Frechet derivative.

Used by the cell filters (``integrators/cell.py``), where the deformation gradient's
log, its exponential and the gradient through it are taken every step for every
system.  Why not ``scipy.linalg`` (ASE's choice): one system at a time on the host,
a call per matrix; why not ``torch.linalg.matrix_exp``: in float64 it loses up to 1e-11 for
1-norms of ~0.008-0.05 -- a cell step -- on one matrix, and picks one Taylor degree for
a whole batch, so a result depends on the other systems.  Why not an eigendecomposition
for the log: a sheared cell's deformation is defective (no eigenbasis), a rotating one
has complex eigenvalues.  Loops that converge stop as soon as every matrix has on CPU,
where reading is free, and run their fixed maximum elsewhere (no host sync).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .tensor_ops import host_reads_free, may_be_set, small_matmul

#: ``|F - I|_1`` below which the log series is used without further square roots
_LOG_RADIUS = 0.25
#: series terms: |z| <= 1/7 there, and (1/7)^21 < 1e-17
_LOG_TERMS = 11
#: square roots at most (log norms up to ~2^8 / 4: any physical deformation)
_MAX_ROOTS = 8
#: Denman-Beavers iterations at most (|F - I| ~ 1e3 needs 12)
_MAX_DB = 16
#: ``|A|_1`` below which the Taylor series of exp is used without squaring
_EXP_RADIUS = 0.25
#: Taylor terms: 0.25^14 / 14! < 5e-18
_EXP_TERMS = 13
#: squarings at most (1-norms up to 0.25 2^20), all of them run on accelerators
_MAX_SQUARINGS = 20


def inverse(a: torch.Tensor) -> torch.Tensor:
    """``torch.linalg.inv``; where host reads are not free, without its error check,
    which reads LAPACK's status on the host (a sync per call on a GPU, and no CUDA
    graph): callers keep singular matrices out (the cell filters swap them for I)."""
    if host_reads_free(a):
        return torch.linalg.inv(a)
    return torch.linalg.inv_ex(a).inverse


def solve(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch.linalg.solve(a, b)``, without the error check off CPU (see :func:`inverse`)."""
    if host_reads_free(a):
        return torch.linalg.solve(a, b)
    return torch.linalg.solve_ex(a, b).result


def one_at_a_time(fn: Callable[..., Any], *args: torch.Tensor) -> Any:
    """``fn(*args)`` over ``[G, ...]`` tensors, one matrix at a time on CPU; ``fn``
    returns a tuple of ``[G, ...]`` tensors.

    Why: LAPACK's eigensolver and torch's reductions over a matrix's rows pick their blocking by the
    whole tensor's shape and memory, so a matrix's results changed in their last bits with the
    matrices batched beside it (BFGS: with the number of systems of its size in the batch;
    docs/design/45-batch-independence-by-construction.md).  One at a time, every call has the same
    shapes and fresh buffers whatever the batch.  On accelerators: one batched call.
    """
    if args[0].device.type != "cpu" or len(args[0]) <= 1:
        return fn(*args)
    parts = [fn(*(a[k : k + 1].clone() for a in args)) for k in range(len(args[0]))]
    return tuple(torch.cat(column) for column in zip(*parts))


def _norm1(a: torch.Tensor) -> torch.Tensor:
    """Matrix 1-norm (largest column sum of magnitudes) of ``[..., 3, 3]``."""
    return a.abs().sum(-2).amax(-1)


def sqrtm(a: torch.Tensor) -> torch.Tensor:
    """Principal square root of ``[B, 3, 3]`` matrices (product-form Denman-Beavers,
    stable; converged on CPU as soon as every matrix has, else after ``_MAX_DB``)."""
    eye = torch.eye(3, dtype=a.dtype, device=a.device).expand_as(a)
    tol = max(1e-15, 4 * torch.finfo(a.dtype).eps)  # float32 stalls at its round-off
    m, y = a, a
    for _ in range(_MAX_DB):
        m_inv = inverse(m)
        y = small_matmul(y, eye + m_inv) * 0.5
        m = (eye + (m + m_inv) * 0.5) * 0.5
        if not may_be_set(_norm1(m - eye) > tol):
            break
    return y


def logm(a: torch.Tensor) -> torch.Tensor:
    """Principal matrix logarithm of ``[B, 3, 3]`` matrices with no eigenvalue on the
    closed negative real axis (deformation gradients), by inverse scaling and squaring:
    square roots until ``|F - I|_1 <= 1/4``, then ``2 artanh(z)``, ``z = (F - I)(F + I)^-1``
    (``|z| <= 1/7``), as a series; ~1e-15 near the identity (scipy's ``logm``: ~2e-15)."""
    eye = torch.eye(3, dtype=a.dtype, device=a.device).expand_as(a)
    scale = torch.ones(a.shape[:-2], dtype=a.dtype, device=a.device)
    x = a
    for _ in range(_MAX_ROOTS):
        far = _norm1(x - eye) > _LOG_RADIUS
        if not may_be_set(far):
            break
        x = torch.where(far[..., None, None], sqrtm(x), x)
        scale = torch.where(far, 2.0 * scale, scale)
    z = solve(x + eye, x - eye)  # (x - I)(x + I)^-1: they commute
    z2, term, total = small_matmul(z, z), z, z
    for k in range(1, _LOG_TERMS):
        term = small_matmul(term, z2)
        total = total + term / (2 * k + 1)
    return (2.0 * scale)[..., None, None] * total


def expm(a: torch.Tensor) -> torch.Tensor:
    """Matrix exponential of ``[B, n, n]`` matrices: scaling by powers of two until
    ``|A|_1 <= 1/4``, 13 Taylor terms, squaring back.  (``torch.linalg.matrix_exp`` loses
    up to 1e-11 in float64 for 1-norms between ~0.008 and 0.05, the size of a cell
    step; this keeps ~1e-16.)"""
    norm = _norm1(a)
    squarings = torch.clamp(torch.ceil(torch.log2(norm / _EXP_RADIUS)), 0, _MAX_SQUARINGS)
    squarings = torch.nan_to_num(squarings, nan=0.0)  # (a zero matrix: log2(0) = -inf)
    x = a * torch.exp2(-squarings)[..., None, None]  # exact: a power of two
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device).expand_as(a)
    out = eye
    for k in range(_EXP_TERMS, 0, -1):  # Horner: I + x (I + x/2 (I + ...))
        out = eye + small_matmul(x, out) / k
    rounds = int(squarings.max()) if host_reads_free(a) and len(a) else _MAX_SQUARINGS
    for i in range(rounds):
        out = torch.where((i < squarings)[..., None, None], small_matmul(out, out), out)
    return out


def expm_frechet_adjoint(l: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """``D exp(L^T)[G]``: the matrix ``M`` with ``<M, E> = <D exp(L)[E], G>`` for every
    ``E`` (the gradient of ``<exp(L), G>``), from the block exponential
    ``exp([[L^T, G], [0, L^T]])``."""
    lt = l.transpose(-1, -2)
    # linear in G: scaled to norm ~1 by a power of two, so that |block| stays ~|L| + 1
    size = torch.exp2(torch.round(torch.log2(_norm1(g).clamp_min(1e-300))))[..., None, None]
    unit = g / size
    block = torch.cat([torch.cat([lt, unit], -1), torch.cat([torch.zeros_like(g), lt], -1)], -2)
    return expm(block)[..., :3, 3:] * size


def voigt_mask(mask: torch.Tensor) -> torch.Tensor:
    """6-component Voigt masks (xx, yy, zz, yz, xz, xy) ``[..., 6]`` as ``[..., 3, 3]``."""
    order = [0, 5, 4, 5, 1, 3, 4, 3, 2]
    return mask[..., order].reshape(*mask.shape[:-1], 3, 3)
