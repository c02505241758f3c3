"""The README's custom integrator (the block marked ``<!-- example: custom-integrator -->``),
run as written, against an independent reference.

The reference is a plain NumPy loop over one structure at a time with ASE's own
Lennard-Jones calculator: the same steepest-descent rule (halve the per-system step
after an uphill move, cap each atom's displacement at ``maxstep``), no alchemi_lit code.
Three structures of different sizes relax together in one batch, so any leak of one
system's state (its step size, its last energy) into another shows up as a difference.
"""

from __future__ import annotations

import numpy as np
import pytest
from ase import Atoms
from ase.build import bulk
from ase.calculators.lj import LennardJones as AseLennardJones
from conftest import readme_block

EXAMPLE = readme_block("custom-integrator")
LJ = {"epsilon": 0.0104, "sigma": 3.40, "rc": 8.5}


@pytest.fixture(scope="module")
def example() -> dict:
    namespace: dict = {"__name__": "readme_custom_integrator"}
    exec(compile(EXAMPLE, "README.md: custom-integrator", "exec"), namespace)
    return namespace


def structures() -> list[Atoms]:
    rng = np.random.default_rng(0)
    out = []
    for repeat, noise in [(1, 0.1), (2, 0.05), (2, 0.15)]:
        atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(repeat)
        atoms.positions += rng.normal(scale=noise, size=atoms.positions.shape)
        out.append(atoms)
    return out


def reference(atoms: Atoms, fmax: float, maxstep: float, max_steps: int) -> tuple[Atoms, int]:
    """Steepest descent on one structure, ASE's LJ: (final structure, steps taken)."""
    atoms = atoms.copy()
    atoms.calc = AseLennardJones(**LJ)
    alpha, last_energy = 1.0, np.inf
    for step in range(max_steps):
        energy, forces = atoms.get_potential_energy(), atoms.get_forces()
        if step > 0 and np.linalg.norm(forces, axis=1).max() < fmax:
            return atoms, step  # converged on the forces after `step` moves
        if energy > last_energy:
            alpha *= 0.5
        last_energy = energy
        dr = alpha * forces
        dr *= maxstep / np.maximum(np.linalg.norm(dr, axis=1, keepdims=True), maxstep)
        atoms.positions = atoms.positions + dr
    return atoms, max_steps


def test_a_few_steps_follow_the_reference_exactly(example: dict) -> None:
    """12 steps, no convergence: positions after each system's 12 moves agree to
    round-off with the one-structure-at-a-time reference."""
    from alchemi_lit import Simulator
    from alchemi_lit.models import LennardJones

    model = LennardJones(epsilon=0.0104, sigma=3.40, cutoff=8.5)
    stage = example["SteepestDescent"](fmax=1e-9, maxstep=0.1, max_steps=12)
    res = Simulator(model=model, stages=stage, accelerator="cpu", sync_every=5).run(structures())
    assert res.exit_reasons == ["max_steps"] * 3
    assert res.steps.tolist() == [12] * 3
    for got, atoms in zip(res.to_atoms(), structures()):
        want, _ = reference(atoms, 1e-9, 0.1, 12)
        np.testing.assert_allclose(got.positions, want.positions, rtol=0, atol=1e-9)


def test_relax_argon_converges_like_the_reference(example: dict) -> None:
    """The README's ``relax_argon`` to fmax = 1e-3 eV/Å: every system converges, in the
    reference's number of steps, at its positions; ASE confirms max |F| < fmax and a
    lower energy; velocities are zeroed on exit."""
    fmax = 1e-3
    res = example["relax_argon"](structures(), fmax=fmax, accelerator="cpu", sync_every=5)
    assert res.exit_reasons == ["converged"] * 3
    assert bool(res.converged.all())
    for n, (before, after) in enumerate(zip(structures(), res.to_atoms())):
        want, steps = reference(before, fmax, 0.1, 300)
        assert int(res.steps[n]) == steps, (n, int(res.steps[n]), steps)
        np.testing.assert_allclose(after.positions, want.positions, rtol=0, atol=1e-8)
        before.calc = AseLennardJones(**LJ)
        after.calc = AseLennardJones(**LJ)
        assert np.linalg.norm(after.get_forces(), axis=1).max() < fmax
        assert after.get_potential_energy() < before.get_potential_energy()
        np.testing.assert_allclose(after.get_velocities(), 0.0)
