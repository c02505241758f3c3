"""``tensor_ops.per_system``: one function, NumPy on CPU and torch elsewhere.

The GPU path of every per-system kernel is its torch namespace; these tests run it on
CPU against the NumPy path.  What must hold on every processor and on a GPU: the same
decisions (step counters, which branch) exactly, and the same values to rounding *as
the formula carries it*.  Two libraries round a chain of operations alike only up to a
few ulps, and their pow/exp (chosen by the processor: NumPy's AVX-512 pow is not glibc's)
differ by an ulp or so; a formula can amplify that far beyond a fixed ulp count --
FIRE2's bias correction ``1 / (1 - (1 - a)**(n + 1))`` by ``q / (1 - q)`` with
``q = (1 - a)**(n + 1)``, about ``1 / ((n + 1) a)`` for a small ``a``, and FIRE's
step-length norm by the cancellation in ``|a v + c F|**2``.  So each comparison's
tolerance is derived per system from those factors (:func:`conftest.
assert_conditioned_close`), not fixed (a fixed 4 ulps failed on an AVX-512 machine).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from alchemi_lit.core.tensor_ops import per_system
from alchemi_lit.integrators.formulas import fire_coefficients
from conftest import TRANSCENDENTAL_ULPS, assert_conditioned_close, fire2_bias_gain


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


def assert_same_outputs(via_numpy: tuple, via_torch: tuple, gains: dict[int, object]) -> None:
    """Every output the same to rounding, output ``k`` with the conditioning gain
    ``gains[k]`` (0 where no cancellation or library function amplifies rounding);
    decisions (integer and boolean outputs) exactly."""
    for k, (a, b) in enumerate(zip(via_numpy, via_torch)):
        assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
        assert_conditioned_close(a, b, gains.get(k, 0.0), msg=f"output {k}")


def cancellation(cv, cf, vv, vf, ff) -> torch.Tensor:
    """How much ``|cv v + cf F|**2 = cv**2 vv + 2 cv cf vf + cf**2 ff`` amplifies a
    rounding difference in its coefficients: the sum of the terms' sizes over the
    result (1 without cancellation)."""
    terms = cv * cv * vv + 2.0 * (cv * cf * vf).abs() + cf * cf * ff
    total = (cv * cv * vv + 2.0 * cv * cf * vf + cf * cf * ff).abs()
    return torch.where(total > 0, terms / total, torch.ones_like(total)).double()


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
    gains = {}
    if whole_step:  # the step length divides by |a v + c F|: cancellation
        _, _, vf, ff, vv, *_ = args
        a, c = via_numpy[0], via_numpy[1]
        gains[2] = cancellation(a.double(), c.double(), vv.double(), vf.double(), ff.double())
    assert_same_outputs(via_numpy, via_torch, gains)


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
    cv, cf, _, _, _, _, a, n, _ = via_numpy
    if use_abc:  # coefficients divide by 1 - (1 - a)**(n + 1): pow's ulp, amplified
        gain = fire2_bias_gain(a, n)
        gains = {0: gain, 1: gain}
        assert gain.max() > (1e3 if seed % 2 else 1.0)  # small alphas: what this is about
    else:  # the step length divides by |cv v + cf F|: cancellation
        _, _, _, vf, ff, vv, *_ = args
        gains = {3: cancellation(cv.double(), cf.double(), vv.double(), vf.double(), ff.double())}
    assert_same_outputs(via_numpy, via_torch, gains)


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


class PowOffByUlps(torch.overrides.TorchFunctionMode):
    """torch's pow, ``ulps`` ulps away from its result (toward +inf): what another
    processor's (or a GPU's) pow may return, as far as ``ulps`` allows."""

    def __init__(self, ulps: int) -> None:
        super().__init__()
        self.ulps = ulps

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if getattr(func, "__name__", "") in ("pow", "__pow__", "__rpow__"):
            for _ in range(self.ulps):
                out = torch.nextafter(out, torch.full_like(out, float("inf")))
        return out


@pytest.mark.parametrize("ulps", [TRANSCENDENTAL_ULPS, 16 * TRANSCENDENTAL_ULPS])
def test_fire2_tolerance_admits_a_pow_off_by_an_ulp_or_so_and_no_more(ulps):
    """The bias correction's tolerance is derived, not generous: a pow a few ulps off
    passes, sixty-four ulps off fails on the small-alpha systems."""
    from alchemi_lit.integrators.formulas import fire2_coefficients

    mask, step, vf, ff, vv, dt, alpha, n = fire_inputs(torch.float64, 1)
    back = torch.zeros(len(mask), dtype=torch.bool)
    args = (mask, step, back, vf, ff, vv, dt, alpha * 1e-3, n)
    params = dict(n_min=2, finc=1.1, fdec=0.5, dtmax=0.4, dtmin=0.01, astart=0.25,
                  fa=0.99, maxstep=0.2, use_abc=True)  # fmt: skip
    via_numpy = fire2_coefficients(*args, **params)
    with PowOffByUlps(ulps):
        off = fire2_coefficients.__wrapped__(torch, *args, **params)
    gain = fire2_bias_gain(via_numpy[6], via_numpy[7])
    if ulps <= TRANSCENDENTAL_ULPS:
        assert_same_outputs(via_numpy, off, {0: gain, 1: gain})
    else:
        with pytest.raises(AssertionError, match="output 0"):
            assert_same_outputs(via_numpy, off, {0: gain, 1: gain})
