"""fx_slim: the rewritten graph computes the same values and gradients, with no dead
nodes and one split where there were many slices; nothing with side effects goes."""

from __future__ import annotations

import importlib.util
import operator

import pytest
import torch
from torch import fx

from alchemi_lit.models.fx_slim import slim_graph, slim_graph_modules


class Sliced(torch.nn.Module):
    """The shapes of e3nn's generated code: per-instruction slices of a weight tensor,
    a dead outer product, and an in-place copy whose result nobody reads."""

    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        a = x[..., 0:4] * w[..., 0:4]
        b = x[..., 4:6] * w[..., 6:8]  # a gap (4:6) in w
        torch.einsum("ea,eb->eab", a, b)  # dead
        buffer = torch.zeros_like(a)
        buffer.copy_(a)  # in place: must stay
        c = (x[..., 6:9] * 2.0).sum(-1, keepdim=True)
        return torch.cat([buffer, b, c], dim=-1)


def _calls(gm: fx.GraphModule, target: object) -> int:
    return sum(1 for n in gm.graph.nodes if n.target is target or n.target == target)


def test_same_values_and_gradients_fewer_slices_no_dead_nodes() -> None:
    torch.manual_seed(0)
    x = torch.randn(7, 9, dtype=torch.float64, requires_grad=True)
    w = torch.randn(7, 8, dtype=torch.float64, requires_grad=True)
    reference = Sliced()(x, w)
    gx, gw = torch.autograd.grad(reference.square().sum(), (x, w))

    gm = fx.symbolic_trace(Sliced())
    assert _calls(gm, torch.einsum) == 1
    assert slim_graph(gm) is True
    assert _calls(gm, torch.einsum) == 0  # the dead outer product is gone
    assert _calls(gm, "copy_") == 1  # the in-place copy stays
    assert _calls(gm, torch.split) == 2  # x and w: one split each
    slices = [
        n for n in gm.graph.nodes if n.target is operator.getitem and n.args[0].op == "placeholder"
    ]
    assert slices == []
    out = gm(x, w)
    assert torch.equal(out, reference)
    hx, hw = torch.autograd.grad(out.square().sum(), (x, w))
    assert torch.equal(hx, gx) and torch.equal(hw, gw)
    assert slim_graph(gm) is False  # nothing left to do


def test_overlapping_slices_and_other_dims_are_left_alone() -> None:
    class Overlap(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x[:, 0:3].sum(-1) + x[:, 2:5].sum(-1) + x[..., 1:2].sum(-1)

    class ThreeD(torch.nn.Module):  # x[:, a:b] cuts dim 1 of a 3-D tensor, not the last
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x[:, 0:2].sum((1, 2)) * x[:, 2:3].sum((1, 2))

    overlap = fx.symbolic_trace(Overlap())
    assert slim_graph(overlap) is False
    three_d = fx.symbolic_trace(ThreeD())
    assert slim_graph(three_d) is True
    x = torch.randn(4, 3, 5, dtype=torch.float64)
    assert torch.equal(three_d(x), ThreeD()(x))


def test_out_arguments_are_kept() -> None:
    class Out(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            torch.add(x, 1.0, out=y)
            return y

    gm = fx.symbolic_trace(Out())
    slim_graph(gm)
    y = torch.zeros(3)
    assert torch.equal(gm(torch.ones(3), y), torch.full((3,), 2.0))


@pytest.mark.skipif(importlib.util.find_spec("e3nn") is None, reason="e3nn is not installed")
def test_e3nn_tensor_product_with_per_edge_weights_is_unchanged() -> None:
    """The case the MLIP plugins slim: a tensor product whose weights come per edge."""
    from e3nn import o3

    torch.manual_seed(1)
    irreps_in, irreps_sh = o3.Irreps("8x0e+4x1e+2x2e"), o3.Irreps.spherical_harmonics(2)
    out = o3.Irreps("8x0e+8x1e+8x2e")
    instructions = [
        (i, j, k, "uvu", True)
        for i, (_, a) in enumerate(irreps_in)
        for j, (_, b) in enumerate(irreps_sh)
        for k, (_, c) in enumerate(out)
        if c in a * b
    ]
    mid = o3.Irreps([(irreps_in[i].mul, out[k].ir) for i, _, k, _, _ in instructions])
    instructions = [(i, j, n, m, t) for n, (i, j, _, m, t) in enumerate(instructions)]
    plain = o3.TensorProduct(
        irreps_in, irreps_sh, mid, instructions, shared_weights=False, internal_weights=False
    ).double()
    slimmed = o3.TensorProduct(
        irreps_in, irreps_sh, mid, instructions, shared_weights=False, internal_weights=False
    ).double()
    assert slim_graph_modules(slimmed) >= 1
    x = torch.randn(30, irreps_in.dim, dtype=torch.float64, requires_grad=True)
    y = torch.randn(30, irreps_sh.dim, dtype=torch.float64, requires_grad=True)
    w = torch.randn(30, plain.weight_numel, dtype=torch.float64, requires_grad=True)
    a, b = plain(x, y, w), slimmed(x, y, w)
    assert torch.equal(a, b)
    ga = torch.autograd.grad(a.square().sum(), (x, y, w))
    gb = torch.autograd.grad(b.square().sum(), (x, y, w))
    for u, v in zip(ga, gb, strict=True):
        torch.testing.assert_close(u, v, rtol=1e-12, atol=1e-12)


def test_strided_slices_are_left_alone() -> None:
    """Only plain ``a:b`` slices are fused into a split: ``x[..., 0:4:2]`` takes every
    other column, which no piece of a split is.  The rewritten graph computes what the
    untouched module does (two slices of ``x`` along the last dim, one of them strided)."""

    class Strided(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x[..., 0:4:2] * x[..., 4:6]

    gm = fx.symbolic_trace(Strided())
    slim_graph(gm)
    x = torch.arange(12.0).reshape(2, 6)
    assert torch.equal(gm(x), Strided()(x))
