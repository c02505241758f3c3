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


def window_state(seed: int) -> dict:
    """Windows at different lags: system 0 at lag 3 (closes), 1 at lag 1, 2 at lag 3 but
    not sampled, 3 at lag 0 (starts); system 2 has no free atom (its count is 1)."""
    g = torch.Generator().manual_seed(seed)
    n = int(N_ATOMS.sum())
    free = torch.ones(n, dtype=torch.float64)
    free[[1, 6, 8]] = 0.0
    return {
        "x": torch.randn(n, 3, generator=g, dtype=torch.float64),
        "origin": torch.randn(n, 3, generator=g, dtype=torch.float64),
        "rows": torch.tensor([True, True, False, True]),
        "free": free,
        "count": segments().sum(free).clamp_min(1.0),
        "samples": torch.tensor([3, 5, 7, 4]),
        "curve": torch.randn(B, W, generator=g, dtype=torch.float64),
        "total": torch.randn(B, W, generator=g, dtype=torch.float64),
        "estimates": torch.randn(B, 2, generator=g, dtype=torch.float64),
        "windows": torch.tensor([0, 1, 1, 0]),
        "dt": torch.tensor([2.0, 2.0, 0.0, 0.0], dtype=torch.float64),
        "step_dt": torch.tensor([2.0, 2.0, 5.0, 5.0], dtype=torch.float64),
    }


@pytest.mark.parametrize("squared, power, scale", [(True, -1, 1 / 6), (False, 1, 1 / 3)])
def test_window_sample_equals_the_reference_and_closes_windows(
    squared: bool, power: int, scale: float
) -> None:
    st = window_state(0)
    weights = (correlation.fit_weights(W, 0.2, 1.0) if squared
               else correlation.trapezoid_weights(W))  # fmt: skip
    args = (st["x"], st["origin"], st["rows"], st["free"], st["count"], segments(),
            st["samples"], st["curve"], st["total"], st["estimates"], st["windows"], st["dt"],
            st["step_dt"], weights, squared, power, scale)  # fmt: skip
    got, want = both(correlation.window_sample, *args)
    assert_close(got, want)
    origin = got[0]
    assert torch.equal(origin[:9], st["origin"][:9])  # windows going on keep their origins
    assert torch.equal(origin[9:], st["x"][9:])  # system 3 starts a window at this sample
    assert got[5].tolist() == [1, 1, 1, 0] and got[6].tolist() == [4, 6, 7, 5]


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
