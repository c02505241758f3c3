"""A system's energy, forces and stress do not depend on the batch it is evaluated in,
to the bit, for every built-in model.

torch's CPU elementwise kernels run the SIMD body of an array and its tail through
different code, and for some functions the two round differently (``sigmoid``, ``pow``
with an exponent other than 2 or 3: ``exp``, ``log``, ``tanh``, ``sqrt`` and the basic
operations agree).  Where an edge lands in the array depends on the systems before it,
so a model using such a function gave a system last-bit different forces, depending on
its batch mates -- and an elastic constant that differed between a batched run and the
material alone whenever the run loop's timing changed when systems graduated.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from ase.build import bulk

from alchemi_lit.core.state import Batch
from alchemi_lit.models import EMT, LennardJones, Morse
from alchemi_lit.testing import accelerator_path, shape_sensitive_blas


def neighbours() -> list:
    """Crystals of 1 to 8 atoms, so that the followed system's edges (and its atoms)
    start at many different offsets, with different tails, in the arrays."""
    from ase import Atoms

    cu3au = Atoms("AuCu3", scaled_positions=[[0, 0, 0], [0, 0.5, 0.5], [0.5, 0, 0.5],
                                             [0.5, 0.5, 0]], cell=[3.75] * 3, pbc=True)  # fmt: skip
    out = [
        bulk("Cu", "fcc", a=3.59), bulk("Al", "fcc", a=4.05), cu3au,
        bulk("Ni", "fcc", a=3.52, cubic=True), bulk("Pd", "fcc", a=3.94, cubic=True),
        bulk("Ag", "fcc", a=4.09), bulk("Au", "fcc", a=4.08) * (2, 1, 1),
        bulk("Cu", "bcc", a=2.87, cubic=True) * (2, 2, 1),
    ]  # fmt: skip
    for k, atoms in enumerate(out):
        atoms.rattle(0.01, seed=k)
    return [*out, *out[:4]]


def followed():
    """An elastic job: a 1-atom cell under a small shear."""
    atoms = bulk("Ni", "fcc", a=3.52)
    shear = np.eye(3) + np.array([[0, 0, -0.0025], [0, 0, 0], [-0.0025, 0, 0]])
    atoms.set_cell(atoms.cell[:] @ shear, scale_atoms=True)
    return atoms


@pytest.mark.parametrize(
    "model",
    [EMT(), LennardJones(sigma=2.3, epsilon=0.4, cutoff=5.0),
     LennardJones(sigma=2.3, epsilon=0.4, cutoff=5.0, smooth=True),
     Morse(epsilon=0.4, rho0=4.0, r0=2.5, rcut1=1.6, rcut2=2.2)],
    ids=["EMT", "LJ", "LJ-smooth", "Morse"],
)  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("blas", ["native", "shape-sensitive"])
@pytest.mark.parametrize("code_path", ["cpu", "accelerator"])
def test_a_system_gets_the_same_bits_in_any_batch(model, dtype, blas, code_path):
    """Also with every matrix product rounding by its shape (as MKL's AVX-512 kernels
    do on Intel processors: issue #41), on the CPU's path and the accelerator's."""
    with contextlib.ExitStack() as stack:
        if blas == "shape-sensitive":
            stack.enter_context(shape_sensitive_blas())
        if code_path == "accelerator":
            stack.enter_context(accelerator_path())
        same_bits_in_any_batch(model, dtype)


def same_bits_in_any_batch(model, dtype):
    target, others = followed(), neighbours()
    ref = None
    for before in range(len(others) + 1):
        batch = Batch.from_atoms([*others[:before], target], dtype=dtype)
        out = model(batch, compute_stress=True)  # through the model's list (with a skin)
        lo = int(batch.ptr[-2])
        # and the one-off stress of graduating systems (a list without skin)
        got = (out["energy"][-1], out["forces"][lo:], out["stress"][-1], model.stress(batch)[-1])
        if ref is None:
            ref = got
            continue
        for name, a, b in zip(("energy", "forces", "stress", "final stress"), got, ref):
            assert torch.equal(a, b), f"{name} after {before} systems differs from alone"
