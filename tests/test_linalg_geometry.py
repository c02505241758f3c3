"""The batched matrix functions (``core.linalg``) on the accelerator's branch, and the
periodic heights (``core.geometry``), against SciPy, closed forms and the reciprocal
lattice.

The CPU branch of the matrix functions is held to SciPy and mpmath in
``tests/integrators/test_cell_filter.py``; their accelerator branch (no host reads:
``solve_ex``/``inv_ex`` and a fixed number of squarings) runs here under
:func:`~alchemi_lit.testing.accelerator_path`.
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import pytest
import scipy.linalg as sl
import torch

from alchemi_lit.core.geometry import periodic_heights
from alchemi_lit.core.linalg import expm, inverse, logm, solve, sqrtm
from alchemi_lit.testing import accelerator_path

EPS = np.finfo(np.float64).eps


def rotation(angle: float) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


@pytest.mark.parametrize("on_accelerator", [False, True])
def test_expm_of_large_generators_is_the_rotation(on_accelerator: bool) -> None:
    """``exp`` of the rotation generator ``theta K`` is the rotation by ``theta``
    (closed form), for 1-norms needing 9 to 12 squarings: the accelerator's branch
    runs its fixed maximum, masked per matrix.  Tolerance: scaling and squaring loses
    about ``|A|_1 eps`` (the rotation's condition number), times a small factor."""
    angles = [0.01, 100.0, 300.0, 900.0]
    gen = np.array([[0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    a = torch.tensor(np.array([t * gen for t in angles]))
    with accelerator_path() if on_accelerator else nullcontext():
        got = expm(a).numpy()
    for t, r in zip(angles, got):
        np.testing.assert_allclose(r, rotation(t), rtol=0, atol=16 * t * EPS + 4 * EPS)


@pytest.mark.parametrize("on_accelerator", [False, True])
def test_logm_sqrtm_and_solves_match_scipy(on_accelerator: bool) -> None:
    """``logm`` (square roots, then a solve) and ``sqrtm`` of deformations near and far
    from the identity, and ``inverse``/``solve``, against SciPy, to 1e-12 as on CPU."""
    rng = np.random.default_rng(3)
    mats = np.array(
        [sl.expm(rng.normal(scale=s, size=(3, 3))) for s in (1e-3, 0.05, 0.3, 1.0)]
        + [np.diag([0.5, 1.0, 2.5]), 1.1 * rotation(1.0)]
    )
    rhs = rng.normal(size=(len(mats), 3, 3))
    a, b = torch.tensor(mats), torch.tensor(rhs)
    with accelerator_path() if on_accelerator else nullcontext():
        log, root = logm(a).numpy(), sqrtm(a).numpy()
        inv, x = inverse(a).numpy(), solve(a, b).numpy()
    for k, m in enumerate(mats):
        np.testing.assert_allclose(log[k], sl.logm(m), rtol=0, atol=1e-12)
        np.testing.assert_allclose(root[k], sl.sqrtm(m), rtol=0, atol=1e-12)
        cond = np.linalg.cond(m)
        np.testing.assert_allclose(inv[k], np.linalg.inv(m), rtol=0, atol=16 * cond * EPS)
        np.testing.assert_allclose(x[k], np.linalg.solve(m, rhs[k]), rtol=0, atol=64 * cond * EPS)


def reciprocal_heights(cell: np.ndarray, pbc: np.ndarray) -> np.ndarray:
    """Lattice-plane spacings ``1 / |b_i|`` (reciprocal vectors ``b_i``) of the periodic
    vectors, the non-periodic ones replaced by unit vectors normal to the periodic ones
    (they must not change a periodic vector's height)."""
    full = np.array(cell, dtype=np.float64)
    periodic = full[pbc]
    if len(periodic) == 2:
        normal = np.cross(periodic[0], periodic[1])
        full[~pbc] = normal / np.linalg.norm(normal)
    elif len(periodic) == 1:
        u = periodic[0] / np.linalg.norm(periodic[0])
        other = np.linalg.svd(u[None])[2][1:]  # two unit vectors normal to it
        full[~pbc] = other
    recip = np.linalg.inv(full).T
    return 1.0 / np.linalg.norm(recip[pbc], axis=1)


@pytest.mark.parametrize(
    "pbc", [(True, True, True), (True, True, False), (True, False, True), (False, True, False)]
)
def test_periodic_heights_are_the_lattice_plane_spacings(pbc: tuple[bool, ...]) -> None:
    """A triclinic cell with edges of different lengths (so that swapping which edge
    divides which area shows): each periodic direction's height is its lattice-plane
    spacing, ``1 / |b_i|`` of the reciprocal lattice, to rounding (``|b_i|`` from an
    inverse of a well-conditioned cell: ~10 eps)."""
    cell = np.array([[3.0, 0.0, 0.0], [1.2, 4.5, 0.0], [0.7, -0.9, 6.1]])
    mask = np.array(pbc)
    want = reciprocal_heights(cell, mask)
    np.testing.assert_allclose(periodic_heights(cell, mask), want, rtol=64 * EPS, atol=0)
