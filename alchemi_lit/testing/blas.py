"""Matrix products whose rounding depends on their operands' shapes, to find the ones
that make a system's values depend on its batch mates.

Why: a BLAS library blocks and vectorises a product according to its shape and the
processor (MKL's AVX-512 kernels on Intel, its AVX2 ones elsewhere), so the bits of one
output row can change when rows are added around it -- a per-system quantity computed
by one product over the whole batch then depends on which systems share the batch.
Which processor shows it is luck; :func:`shape_sensitive_blas` shows it on any: every
matrix product torch dispatches (``mm``, ``bmm``, ``mv``, ``dot``, ``addmm`` ... dense or
sparse, inside autograd and compiled networks alike, since it works at the aten level)
is replaced by a reference that sums its terms in an order set by the output's shape
and the row's position -- a rotation of short contractions, a front-padded blocking of
long ones, as a vectorised kernel's head and tail would.  Code whose results hold bit
for bit under it has no product spanning systems; :func:`count_products` lists the
products a computation still makes.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: aten products (overload packets) replaced; composite ones (matmul, linear, einsum,
#: tensordot) decompose into these before dispatch
PRODUCTS = frozenset({"mm", "bmm", "mv", "dot", "vdot", "addmm", "addmv", "baddbmm", "addbmm"})
#: contractions up to this length are rotated; longer ones are blocked in fours
_SHORT = 32


def _shape_seed(*dims: int) -> int:
    """A number that changes with any of the output's dimensions (a multiplicative hash:
    a sum would repeat modulo small term counts)."""
    seed = 0
    for d in dims:
        seed = (seed * 1_000_003 + d * 2_654_435_761) % 2_147_483_647
    return seed


def _contract(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` for ``[..., M, K]`` and ``[..., K, N]``, summed in a shape-set order
    (one ``[..., M, N]`` product per term: no ``M K N`` tensor is made)."""
    if a.layout == torch.sparse_csr:
        return _contract_csr(a, b)
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = a.expand(*batch, *a.shape[-2:]).reshape(-1, *a.shape[-2:])
    b = b.expand(*batch, *b.shape[-2:]).reshape(-1, *b.shape[-2:])
    g, m, k = a.shape
    n = b.shape[-1]
    seed = _shape_seed(g, m, n)
    if k <= _SHORT:  # each row starts at its own term: (row position + shape) mod k
        start = (torch.arange(g * m).view(g, m) + seed) % k
        total = None
        for t in range(k):
            col = (start + t) % k  # [g, m]: the term each row adds now
            term = a.gather(2, col[..., None]) * b.gather(1, col[..., None].expand(g, m, n))
            total = term if total is None else total + term
    else:  # blocks of four terms counted from a shape-set offset, then block by block
        front = seed % 4
        a = torch.nn.functional.pad(a, (front, (-(k + front)) % 4))
        b = torch.nn.functional.pad(b, (0, 0, front, (-(k + front)) % 4))
        total = None
        for q in range(0, a.shape[-1], 4):
            part = a[..., q : q + 1] * b[..., q : q + 1, :]
            for r in range(q + 1, q + 4):
                part = part + a[..., r : r + 1] * b[..., r : r + 1, :]
            total = part if total is None else total + part
    return total.reshape(*batch, m, n)


def _contract_csr(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A sparse CSR ``[M, K]`` times dense ``[K, N]``: each row's terms added in blocks
    of four columns counted from a shape-set offset, then block by block."""
    crow, col, val = a.crow_indices(), a.col_indices(), a.values()
    m = a.shape[0]
    row = torch.repeat_interleave(torch.arange(m), crow[1:] - crow[:-1])
    terms = val[:, None] * b.index_select(0, col)  # [nnz, N]
    front = _shape_seed(1, m, int(a.shape[1])) % 4
    block = (col + front) // 4
    width = int(block.max()) + 1 if len(block) else 1
    partial = terms.new_zeros((m * width, b.shape[1]))
    partial.index_add_(0, row * width + block, terms)  # (in order: CPU index_add_)
    return partial.reshape(m, width, -1).cumsum(1)[:, -1]


def _reference(name: str, args: tuple, kwargs: dict) -> torch.Tensor:
    """The shape-sensitive value of aten product ``name`` (out= not supported)."""
    beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
    if name in ("dot", "vdot"):
        x, y = args
        return _contract((x.conj() if name == "vdot" else x)[None, :], y[:, None])[0, 0]
    if name == "mv":
        return _contract(args[0], args[1][:, None])[:, 0]
    if name in ("mm", "bmm"):
        return _contract(args[0], args[1])
    c, x, y = args[:3]
    if name == "addmv":
        prod = _contract(x, y[:, None])[:, 0]
    elif name == "addbmm":
        prod = _contract(x, y).cumsum(0)[-1]
    else:  # addmm, baddbmm
        prod = _contract(x, y)
    return prod * alpha if beta == 0 else c * beta + prod * alpha


class ShapeSensitiveBLAS(TorchDispatchMode):
    """Dispatch mode behind :func:`shape_sensitive_blas` (floating products only)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if (
            name in PRODUCTS
            and "out" not in kwargs
            and tensors
            and all(t.is_floating_point() and t.device.type == "cpu" for t in tensors)
        ):
            return _reference(name, args, kwargs).to(tensors[-1].dtype)
        return func(*args, **kwargs)


@contextlib.contextmanager
def shape_sensitive_blas() -> Iterator[None]:
    """Run every floating CPU matrix product through a reference whose rounding depends
    on the product's shape and each row's position (module docstring)."""
    with ShapeSensitiveBLAS():
        yield


class _ProductCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in PRODUCTS:
            shapes = "x".join(str(tuple(a.shape)) for a in args if isinstance(a, torch.Tensor))
            self.counts[f"{name} {shapes}"] += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def count_products() -> Iterator[Counter[str]]:
    """Count the matrix products run inside the block, by aten name and shapes."""
    mode = _ProductCounter()
    with mode:
        yield mode.counts


__all__ = ["ShapeSensitiveBLAS", "count_products", "shape_sensitive_blas"]
