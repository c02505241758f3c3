"""Block averaging (Flyvbjerg-Petersen): the arithmetic on a hand-checkable series, the
accumulated form equal to the one-shot form, and (slow) errors that cover the truth at
the stated rate over 50 seeds of an Einstein crystal, whose mean potential energy is
3 N kT / 2 exactly (BAOAB samples a harmonic configuration space exactly)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.units import kB

from alchemi_lit import Simulator
from alchemi_lit.callbacks import BlockAverages
from alchemi_lit.core.blocking import block_average, result, update
from alchemi_lit.integrators import Langevin
from alchemi_lit.testing.potentials import EinsteinCrystal


def test_the_series_one_to_eight_by_hand() -> None:
    """1..8: mean 4.5; level 0: population variance 5.25 over 7 -> sqrt(0.75); level 1
    (1.5, 3.5, 5.5, 7.5): 5 over 3; level 2 (2.5, 6.5): 4 over 1; Lee et al.'s rule
    (B^3 > 2 n (s_B / s_0)^4) is met at no level with >= 2 blocks: no plateau, read at
    the last level with >= 4 blocks (block size 2)."""
    r = block_average(np.arange(1.0, 9.0))
    assert r.mean == 4.5 and r.samples == 8
    np.testing.assert_allclose(r.errors[:3], [np.sqrt(0.75), np.sqrt(5 / 3), 2.0], rtol=1e-15)
    assert np.isnan(r.errors[3:]).all()
    assert (r.block_size, r.plateau) == (2, False)
    assert r.error == pytest.approx(np.sqrt(5 / 3)) and r.error_of_error == pytest.approx(
        np.sqrt(5 / 3) / np.sqrt(6)
    )
    white = block_average(np.tile([1.0, -1.0], 512))  # anticorrelated: every block mean 0
    assert white.mean == 0 and white.errors[1] == 0


def test_the_accumulated_sums_equal_the_one_shot_ones() -> None:
    """update() one sample at a time, for rows sampled on different steps, gives
    block_average() of each row's own samples (to rounding: blocks summed in order)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 300)).cumsum(1)
    levels = 12
    n, shift = torch.zeros(2, dtype=torch.int64), torch.zeros(2, 1, dtype=torch.float64)
    partial = torch.zeros(2, 1, levels, dtype=torch.float64)
    sums, squares = partial.clone(), partial.clone()
    for t in range(300):
        rows = torch.tensor([True, t % 3 == 0])
        n, shift, partial, sums, squares = update(
            n, shift, partial, sums, squares, torch.tensor(x[:, t : t + 1]), rows
        )
    for k, series in enumerate((x[0], x[1, ::3])):
        online = result(int(n[k]), float(shift[k, 0]), sums[k, 0].numpy(), squares[k, 0].numpy())
        offline = block_average(series, levels)
        assert online.samples == offline.samples == len(series)
        assert online.mean == pytest.approx(offline.mean, rel=1e-12)
        np.testing.assert_allclose(online.errors, offline.errors, rtol=1e-9)
        assert online.block_size == offline.block_size


@pytest.mark.slow
def test_block_errors_cover_the_truth_at_the_stated_rate_over_50_seeds() -> None:
    """50 Einstein crystals (8 atoms, T = 100 K, each its own noise stream) under BAOAB
    Langevin: the block-averaged mean potential energy lies within one stated error of
    3 N kT / 2 for 68 % of them and within two for 95 % (binomial bounds, 3 sigma)."""
    a, temperature = 4.0, 100.0
    sites = np.array([[i, j, k] for i in range(2) for j in range(2) for k in range(2)]) * a
    crystal = Atoms("Ar8", positions=sites, cell=[2 * a] * 3, pbc=True)
    averages = BlockAverages(("energy",), every=1, skip=500)
    stage = Langevin(dt=4.0, temperature=temperature, friction=0.02, steps=500 + 2**14)
    sim = Simulator(model=EinsteinCrystal(k=0.5, a=a), stages=stage, callbacks=[averages],
                    precision="64", accelerator="cpu")  # fmt: skip
    sim.run([crystal.copy() for _ in range(50)])
    table = averages.to_pandas()
    truth = 1.5 * 8 * kB * temperature
    z = np.abs(table["energy"] - truth) / table["energy_error"]
    assert table["energy_plateau"].all()
    one, two = (z < 1).mean(), (z < 2).mean()
    spread = 3 * np.sqrt(0.683 * 0.317 / 50)
    print(f"coverage: {one:.2f} within 1 sigma, {two:.2f} within 2")
    assert 0.683 - spread <= one <= 0.683 + spread, (one, two)
    assert two >= 0.954 - 3 * np.sqrt(0.954 * 0.046 / 50), (one, two)
