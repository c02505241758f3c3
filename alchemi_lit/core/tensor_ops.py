"""Small tensor kernels used in every step, written for speed on both CPU and GPU.

Why a module for this: on CPU, torch's reduction over a length-3 last dimension (``(a * b).sum(-1)``
on ``[N, 3]``) takes a slow generic reduction path, and an MD step does several of these per atom or
per edge (figures in docs/design/05-edge-reductions-segment-sums-and-csr-products.md).  Row sums are
elementwise additions of the columns, in column order: as fast as a matrix-vector product, and
unlike one (whose BLAS kernel blocks by the whole array's shape) a row's bits depend on that row
alone, so on every processor a system's values do not depend on the rows of other systems around it.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import torch

F = TypeVar("F", bound=Callable[..., Any])


def row_dot(a: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """Row-wise dot product ``sum_k a[:, k] * b[:, k]`` of ``[N, k]`` tensors (``b=a``
    by default: squared row norms)."""
    return row_sum(a * a if b is None else a * b)


def row_sum(a: torch.Tensor) -> torch.Tensor:
    """Row sums of an ``[N, k]`` tensor, column after column (module docstring: why not
    ``sum(-1)`` nor a product with ones)."""
    first, *rest = a.unbind(-1)
    total = first.clone() if not rest else first + rest[0]
    for column in rest[1:]:
        total.add_(column)
    return total


def small_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` for ``[..., M, K]`` and ``[..., K, N]`` with a short ``K`` (3 x 3 cells,
    an ``[n, 1, 3]`` row per atom), as elementwise products added term after term in
    ``k`` order.

    Why not ``@``: a batched product goes to a BLAS kernel chosen and blocked by the whole batch's
    shape, so the bits of one system's product could change with the number of systems around it
    (docs/design/45-batch-independence-by-construction.md); here each output element is ``(a0 b0 +
    a1 b1) + a2 b2`` whatever the batch.  Summing in the same order as vesin and ASE's loops, it
    also reproduces their cell shifts bit for bit.
    """
    total = a[..., :, 0:1] * b[..., 0:1, :]
    for k in range(1, a.shape[-1]):
        total = total + a[..., :, k : k + 1] * b[..., k : k + 1, :]
    return total


def rows_times(rows: torch.Tensor, matrices: torch.Tensor) -> torch.Tensor:
    """``rows[n] @ matrices[n]`` for ``[n, K]`` rows and ``[n, K, N]`` matrices
    (:func:`small_matmul`, one row each)."""
    return small_matmul(rows.unsqueeze(-2), matrices).squeeze(-2)


#: Whether reading a CPU tensor's values on the host is free (it is).  Tests set it to
#: False to run the accelerator's path on CPU: branch-free, no value read between
#: bookkeepings (see :func:`host_reads_free`).
CPU_READS_FREE = True


def host_reads_free(t: torch.Tensor) -> bool:
    """Whether ``t``'s values can be read on the host without waiting for a device."""
    return CPU_READS_FREE and t.is_cpu  # (is_cpu: no device object made, every call)


def may_be_set(mask: torch.Tensor) -> bool:
    """False only when ``mask`` is known to hold no True element at no cost.

    On CPU reading a tensor costs nothing, so masked work whose mask is empty (an MD
    stage initialising systems when none entered it, a NaN guard restoring no system)
    can be skipped: that work is a sizeable share of a cheap model's step there.  On an
    accelerator the read would be a host sync, so this returns True and the caller
    takes its branch-free path -- the results are the same either way.
    """
    return not host_reads_free(mask) or bool(mask.any())


def all_set(mask: torch.Tensor) -> bool:
    """True only when ``mask`` is known to be all True at no cost (on CPU).

    The counterpart of :func:`may_be_set`: an update that covers every row can skip
    its ``torch.where`` on CPU; on an accelerator this returns False and the caller
    keeps the masked path.
    """
    return host_reads_free(mask) and bool(mask.all())


def kept(
    memo: tuple[torch.Tensor, int, Any] | None,
    tensor: torch.Tensor,
    compute: Callable[[torch.Tensor], Any],
) -> tuple[torch.Tensor, int, Any]:
    """A ``(tensor, version, compute(tensor))`` memo, the given one while ``tensor`` is
    the same object at the same version, else a fresh one: values derived from a field
    are recomputed when the field is replaced or written in place, and only then."""
    if memo is None or memo[0] is not tensor or memo[1] != tensor._version:
        return (tensor, tensor._version, compute(tensor))
    return memo


def identity_key(values: tuple[Any, ...] | list[Any]) -> list[Any]:
    """A key of ``values`` for :func:`same_key`: each tensor followed by its version.
    (Plain loops: keys are built and compared every step, right after the model.)"""
    key = []
    for v in values:
        key.append(v)
        if isinstance(v, torch.Tensor):
            key.append(v._version)
    return key


def same_key(a: list[Any], b: list[Any]) -> bool:
    """Equal keys: tensors by identity (not by value, which would read them), everything
    else by value."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):  # noqa: SIM110 (all() over a generator resumes a frame per item)
        if x is not y and (isinstance(x, torch.Tensor) or x != y):
            return False
    return True


def per_system(fn: F) -> F:
    """Run ``fn(xp, *arrays, **params)`` -- arithmetic on per-system ``[B]`` values --
    in NumPy on CPU and in torch elsewhere; tensors in, tensors out.

    Why: an integrator's per-system bookkeeping (FIRE's power test and time step, step-length
    control) is a chain of ~30 operations on a few dozen numbers, where torch's per-operation
    dispatch on CPU is the whole cost and NumPy's is a fraction of it (figures in
    docs/design/07-per-system-arithmetic-in-numpy-on-cpu.md).  Written once with operators,
    ``xp.where`` and ``xp.sqrt``, the function gives the same results in both to an ulp (torch's
    vectorised CPU ``sqrt`` is not always correctly rounded, NumPy's is; divide tensor by tensor, as
    torch computes ``number / tensor`` as a reciprocal times the number). On an accelerator the
    values never leave the device, and tensors that track gradients (or are bfloat16) stay in torch
    too.  Tensor arguments on CPU are viewed (no copy) as arrays; array results come back as tensors
    sharing their memory. Floating-point warnings are silenced, as torch never raises them (a
    non-finite system is NaNGuard's business).
    """

    @functools.wraps(fn)
    def run(*args: Any, **params: Any) -> Any:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if any(not numpy_viewable(t) for t in tensors):  # accelerator, autograd, bfloat16
            return fn(torch, *args, **params)
        arrays = [a.numpy() if isinstance(a, torch.Tensor) else a for a in args]
        with np.errstate(all="ignore"):
            out = fn(np, *arrays, **params)
        if isinstance(out, tuple):
            return tuple(_as_tensor(o) for o in out)
        return _as_tensor(out)

    return run  # type: ignore[return-value]


def numpy_viewable(t: torch.Tensor) -> bool:
    """A CPU tensor NumPy can view as it is (no graph to keep, a dtype NumPy has) and
    whose values may be read for free (not on the accelerator's path: a NumPy view is a
    host read)."""
    return host_reads_free(t) and not t.requires_grad and t.dtype != torch.bfloat16


def _as_tensor(value: Any) -> Any:
    return torch.from_numpy(value) if isinstance(value, np.ndarray) else value


__all__ = [
    "all_set",
    "identity_key",
    "kept",
    "may_be_set",
    "numpy_viewable",
    "per_system",
    "row_dot",
    "row_sum",
    "rows_times",
    "same_key",
    "small_matmul",
]


#: id(parameter tensor) -> (a weak reference to it, its version, its copies by device)
_moved: dict[int, tuple[weakref.ref, int, dict[Any, torch.Tensor]]] = {}


def on_device(value: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A parameter tensor on the batch's device, copied once (again if written to):
    copying it at every step would be a host-to-device copy per step, a sync, and
    impossible inside a CUDA graph.  (Keyed by identity: a WeakKeyDictionary would
    compare tensors with ``==``.)"""
    if value.device == device and value.dtype == dtype:
        return value
    entry = _moved.get(id(value))
    if entry is None or entry[0]() is not value or entry[1] != value._version:
        for k in [k for k, (ref, _, _) in _moved.items() if ref() is None]:
            del _moved[k]
        entry = _moved[id(value)] = (weakref.ref(value), value._version, {})
    copies = entry[2]
    key = (device, dtype)
    if key not in copies:
        copies[key] = value.to(device=device, dtype=dtype)
    return copies[key]
