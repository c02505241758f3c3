"""The shape-sensitive matrix products of :mod:`alchemi_lit.testing.blas`: right to
rounding, and rounding by shape -- else they could not find a product that spans systems."""

from __future__ import annotations

import pytest
import torch

from alchemi_lit.testing import count_products, shape_sensitive_blas


def rand(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


CASES = {
    "mv": lambda: (rand(50, 3), rand(3, seed=1)),
    "mm-long": lambda: (rand(20, 70), rand(70, 4, seed=1)),
    "bmm": lambda: (rand(9, 3, 3), rand(9, 3, 3, seed=1)),
    "dot": lambda: (rand(40), rand(40, seed=1)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_products_equal_torchs_to_rounding(name: str) -> None:
    a, b = CASES[name]()
    want = a @ b
    with shape_sensitive_blas():
        got = a @ b
    k = a.shape[-1]  # a sum of k terms in any order: within (k - 1) eps sum |terms|
    bound = (k - 1) * torch.finfo(a.dtype).eps * (a.abs() @ b.abs())
    assert (got - want).abs().le(bound + 1e-300).all()


def test_addmm_linear_and_a_sparse_product_are_replaced_too() -> None:
    x, w, bias = rand(6, 5), rand(3, 5, seed=1), rand(3, seed=2)
    crow = torch.tensor([0, 2, 5, 9])
    csr = torch.sparse_csr_tensor(crow, torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8]),
                                  rand(9, seed=3), size=(3, 9))  # fmt: skip
    v = rand(9, seed=4)
    with count_products() as seen:
        want = (torch.nn.functional.linear(x, w, bias), csr @ v)
    with shape_sensitive_blas():
        got = (torch.nn.functional.linear(x, w, bias), csr @ v)
    for g, w_ in zip(got, want):
        torch.testing.assert_close(g, w_, rtol=1e-14, atol=1e-14)
    assert sum(seen.values()) == 2, seen


def test_a_rows_bits_follow_the_products_shape() -> None:
    """Rows of ``[n, 3] @ [3]`` (a row sum the old code made by a product with ones)
    change bits between a batch and its first rows alone -- as MKL's kernels may."""
    a, b = rand(200, 3), rand(3, seed=1)
    with shape_sensitive_blas():
        whole, head = a @ b, a[:50] @ b
    assert not torch.equal(whole[:50], head)
    # and a sparse row sum by where its run starts
    n = torch.tensor([7, 9, 13])
    crow = torch.cat([torch.zeros(1, dtype=torch.int64), n.cumsum(0)])
    ones = torch.sparse_csr_tensor(crow, torch.arange(29), torch.ones(29, dtype=torch.float64),
                                   size=(3, 29))  # fmt: skip
    v = rand(29, seed=2) * 1e3
    alone = torch.sparse_csr_tensor(torch.tensor([0, 13]), torch.arange(13),
                                    torch.ones(13, dtype=torch.float64), size=(1, 13))  # fmt: skip
    with shape_sensitive_blas():
        together, single = ones @ v, alone @ v[16:]
    assert not torch.equal(together[2:], single)
