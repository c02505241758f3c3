"""The observables' CPU kernels (MSD/VACF windows, block sums) against their torch
references, on rows that sample, rows that do not, windows that close and systems of
different sizes."""

from __future__ import annotations

import pytest
import torch

from alchemi_lit.core import blocking, correlation
from alchemi_lit.core.segments import Segments

pytest.importorskip("numba")
N_ATOMS = torch.tensor([3, 5, 1, 4])
B, W = len(N_ATOMS), 4


def segments() -> Segments:
    return Segments(torch.repeat_interleave(torch.arange(B), N_ATOMS), N_ATOMS)


def both(primitive, *args):
    assert primitive.choose(*args) == "numba"
    return primitive(*args), primitive.reference(*args)


def assert_close(got, want) -> None:
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("squared", [True, False])
def test_window_lag_equals_the_reference(squared: bool) -> None:
    g = torch.Generator().manual_seed(0)
    n = int(N_ATOMS.sum())
    x, origin = (torch.randn(n, 3, generator=g, dtype=torch.float64) for _ in range(2))
    free = torch.ones(n, dtype=torch.float64)
    free[[1, 6, 8]] = 0.0  # fixed atoms (8: system 2 has no free atom, its count is 1)
    seg = segments()
    count = seg.sum(free).clamp_min(1.0)
    start = torch.tensor([True, False, True, False])
    got, want = both(correlation.window_lag, x, origin, start, free, count, seg, squared)
    assert_close(got, want)
    assert torch.equal(got[0][3:8], origin[3:8])  # a window that goes on keeps its origin


def test_window_update_equals_the_reference_and_closes_windows() -> None:
    g = torch.Generator().manual_seed(1)
    value = torch.randn(B, generator=g, dtype=torch.float64)
    samples = torch.tensor([3, 5, 7, 0])  # lags 3 (closes), 1, 3 (closes, not sampled), 0
    rows = torch.tensor([True, True, False, True])
    curve, total = (torch.randn(B, W, generator=g, dtype=torch.float64) for _ in range(2))
    estimates = torch.randn(B, 2, generator=g, dtype=torch.float64)
    windows = torch.tensor([0, 1, 1, 0])
    dt = torch.tensor([2.0, 2.0, 0.0, 0.0], dtype=torch.float64)
    step_dt = torch.tensor([2.0, 2.0, 5.0, 5.0], dtype=torch.float64)
    for weights, power, scale in ((correlation.trapezoid_weights(W), 1, 1 / 3),
                                  (correlation.fit_weights(W, 0.2, 1.0), -1, 1 / 6)):  # fmt: skip
        args = (value, rows, samples, curve, total, estimates, windows, dt, step_dt, weights,
                power, scale)  # fmt: skip
        got, want = both(correlation.window_update, *args)
        assert_close(got, want)
        assert got[4].tolist() == [1, 1, 1, 0] and got[5].tolist() == [4, 6, 7, 1]


def test_block_update_equals_the_reference_over_a_series() -> None:
    g = torch.Generator().manual_seed(2)
    levels, q = 5, 2
    state = (torch.zeros(B, dtype=torch.int64), torch.zeros(B, q, dtype=torch.float64),
             *(torch.zeros(B, q, levels, dtype=torch.float64) for _ in range(3)))  # fmt: skip
    kernel, reference = state, state
    for step in range(37):
        x = torch.randn(B, q, generator=g, dtype=torch.float64)
        rows = torch.tensor([True, step % 2 == 0, step % 3 == 0, False])
        kernel = blocking.update(*kernel, x, rows)
        reference = blocking.update.reference(*reference, x, rows)
        assert_close(kernel, reference)
    assert kernel[0].tolist() == [37, 19, 13, 0]
