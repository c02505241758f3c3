"""``tensor_ops.per_system``: one function, NumPy on CPU and torch elsewhere.

The GPU path of every per-system kernel is its torch namespace; these tests run it on
CPU and require the NumPy path's results: the same decisions (step counters, which
branch) and the same values to an ulp (torch's vectorised CPU sqrt is not always
correctly rounded; NumPy's is).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from alchemi_lit.integrators.formulas import fire_coefficients
from alchemi_lit.tensor_ops import per_system


def fire_inputs(dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    """Per-system FIRE inputs covering every branch: first step, uphill, downhill past
    n_min, zero force, outside the stage, a NaN power and a huge step."""
    g = torch.Generator().manual_seed(seed)
    n = 64
    mask = torch.rand(n, generator=g) < 0.8
    step = torch.randint(0, 3, (n,), generator=g)
    vf = torch.randn(n, generator=g, dtype=torch.float64)
    ff = torch.rand(n, generator=g, dtype=torch.float64) * 4
    vv = torch.rand(n, generator=g, dtype=torch.float64) * 9
    ff[:3] = 0.0  # no force
    vf[3] = float("nan")
    vv[4] = 1e6  # step-length control kicks in
    dt = torch.full((n,), 0.1, dtype=torch.float64) * (1 + torch.rand(n, generator=g))
    alpha = torch.full((n,), 0.1, dtype=torch.float64)
    nn = torch.randint(0, 9, (n,), generator=g)
    floats = [t.to(dtype) for t in (vf, ff, vv, dt, alpha)]
    return mask, step, *floats[:3], *floats[3:], nn


def assert_same_outputs(via_numpy: tuple, via_torch: tuple, ulps: int) -> None:
    """Tensors of the same dtype and shape; integer and boolean outputs (counters,
    branches taken) equal, floating ones within ``ulps`` ulps (NaN where NaN)."""
    for a, b in zip(via_numpy, via_torch):
        assert isinstance(a, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
        if a.is_floating_point():
            eps = torch.finfo(a.dtype).eps
            torch.testing.assert_close(a, b, rtol=ulps * eps, atol=0, equal_nan=True)
        else:
            assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("whole_step", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def testfire_coefficients_numpy_equals_torch(dtype, whole_step, seed):
    args = fire_inputs(dtype, seed)
    params = dict(
        n_min=2, finc=1.1, fdec=0.5, dtmax=0.4, astart=0.1, fa=0.99, maxstep=0.2,
        whole_step=whole_step,
    )  # fmt: skip
    via_numpy = fire_coefficients(*args, **params)  # CPU tensors: the NumPy path
    via_torch = fire_coefficients.__wrapped__(torch, *args, **params)  # the GPU path
    assert len(via_numpy) == len(via_torch) == 6
    assert_same_outputs(via_numpy, via_torch, ulps=2)


def test_per_system_views_and_returns_tensors_without_warnings():
    @per_system
    def ratio(xp, a, b, *, floor: float):
        return a / xp.where(b > floor, b, floor), b == 0

    a = torch.tensor([1.0, 0.0, -1.0], dtype=torch.float64)
    b = torch.tensor([2.0, 0.0, 0.0], dtype=torch.float64)
    with np.errstate(all="raise"):  # silenced inside, whatever the caller's setting
        q, zero = ratio(a, b, floor=0.0)
    assert isinstance(q, torch.Tensor) and q.tolist()[0] == 0.5
    assert torch.isnan(q[1]) and q[2] == -float("inf")
    assert zero.dtype == torch.bool and zero.tolist() == [False, True, True]


@pytest.mark.parametrize("use_abc", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def testfire2_coefficients_numpy_equals_torch(use_abc, seed):
    from alchemi_lit.integrators.formulas import fire2_coefficients

    mask, step, vf, ff, vv, dt, alpha, n = fire_inputs(torch.float64, seed)
    back = torch.rand(len(mask), generator=torch.Generator().manual_seed(seed)) < 0.2
    args = (mask, step, back, vf, ff, vv, dt, alpha * 1e-3 ** (seed % 2), n)
    params = dict(
        n_min=2, finc=1.1, fdec=0.5, dtmax=0.4, dtmin=0.01, astart=0.25, fa=0.99,
        maxstep=0.2, use_abc=use_abc,
    )  # fmt: skip
    via_numpy = fire2_coefficients(*args, **params)
    via_torch = fire2_coefficients.__wrapped__(torch, *args, **params)
    assert len(via_numpy) == len(via_torch) == 9
    assert_same_outputs(via_numpy, via_torch, ulps=4)


def test_per_system_stays_in_torch_for_autograd_and_bfloat16():
    seen = []

    @per_system
    def double(xp, a):
        seen.append(xp)
        return 2.0 * a

    w = torch.ones(3, dtype=torch.float64, requires_grad=True)
    out = double(w)
    out.sum().backward()  # the graph survives
    assert torch.equal(w.grad, torch.full((3,), 2.0, dtype=torch.float64))
    assert double(torch.ones(3, dtype=torch.bfloat16)).dtype == torch.bfloat16
    assert double(torch.ones(3)).dtype == torch.float32
    assert seen == [torch, torch, np]
