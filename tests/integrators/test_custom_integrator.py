"""The custom integrator of docs/tutorials/custom-integrator.md (the block marked
``<!-- example: custom-integrator -->``), run as written, against an independent reference.

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

from alchemi_lit.engine.hooks import Callback
from conftest import doc_block

EXAMPLE = doc_block("custom-integrator")
LJ = {"epsilon": 0.0104, "sigma": 3.40, "rc": 8.5}


@pytest.fixture(scope="module")
def example() -> dict:
    namespace: dict = {"__name__": "readme_custom_integrator"}
    exec(compile(EXAMPLE, "docs: custom-integrator", "exec"), namespace)
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
    """The tutorial's ``relax_argon`` to fmax = 1e-3 eV/Å: every system converges, in the
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


# ---------------------------------------------------------------------- OBABO (ops)
MD_EXAMPLE = doc_block("custom-md")
SEED, DT, TEMPERATURE, FRICTION, MD_STEPS = 5, 4.0, 60.0, 0.02, 30


@pytest.fixture(scope="module")
def md_example() -> dict:
    namespace: dict = {"__name__": "readme_custom_md"}
    exec(compile(MD_EXAMPLE, "docs: custom-md", "exec"), namespace)
    return namespace


def moving(atoms: Atoms, seed: int) -> Atoms:
    """``atoms`` with Gaussian velocities (about 40 K) and zero momentum."""
    from ase import units

    atoms, m = atoms.copy(), atoms.get_masses()[:, None]
    v = np.random.default_rng(seed).normal(size=(len(atoms), 3)) * np.sqrt(units.kB * 40 / m)
    atoms.set_velocities(v - (m * v).sum(0) / m.sum())
    return atoms


def obabo_reference(atoms: Atoms, system_id: int) -> np.ndarray:
    """OBABO on one structure in NumPy with ASE's LJ; the O steps read the keyed normals
    of this system (purposes 11 and 12 at each step), as ``Langevin``'s test feeds them
    to ASE.  Returns the positions after every step."""
    import torch
    from ase import units

    from alchemi_lit.core import random as rng

    def normals(step: int, purpose: int) -> np.ndarray:
        n = len(atoms)
        z = rng.atom_normals(
            SEED, torch.tensor([system_id]), torch.tensor([step]),
            torch.zeros(n, dtype=torch.long), torch.arange(n), purpose, torch.float64,
        )  # fmt: skip
        return z.numpy()

    atoms = atoms.copy()
    atoms.calc = AseLennardJones(**LJ)
    m = atoms.get_masses()[:, None]
    dt, gamma = DT * units.fs, FRICTION / units.fs
    c1 = np.exp(-gamma * 0.5 * dt)
    c2 = np.sqrt((1.0 - c1 * c1) * units.kB * TEMPERATURE / m)
    v, f, frames = atoms.get_velocities(), atoms.get_forces(), []
    for step in range(MD_STEPS):
        v = c1 * v + c2 * normals(step, 11)
        v = v + 0.5 * dt * f / m
        atoms.positions = atoms.positions + dt * v
        f = atoms.get_forces()
        v = v + 0.5 * dt * f / m
        v = c1 * v + c2 * normals(step, 12)
        frames.append(atoms.positions.copy())
    return np.array(frames)


class Positions(Callback):
    """Positions of every system after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: list[np.ndarray] = []

    def after_step(self, ctx) -> None:
        self.frames.append(ctx.batch.positions.detach().clone().numpy())


@pytest.mark.parametrize("cpu_kernels", [True, False], ids=["kernels", "torch"])
def test_obabo_follows_the_reference_step_for_step(md_example, monkeypatch, cpu_kernels):
    """Three moving argon structures in one batch, 30 steps, the kicks on the compiled CPU
    path and on the torch path: every position after every step agrees to round-off with
    the one-structure NumPy loop."""
    from alchemi_lit import Simulator, kernels
    from alchemi_lit.models import LennardJones

    monkeypatch.setattr(kernels, "ENABLED", cpu_kernels)
    systems = [moving(a, k) for k, a in enumerate(structures())]
    stage = md_example["OBABO"](dt=DT, temperature=TEMPERATURE, friction=FRICTION,
                                steps=MD_STEPS)  # fmt: skip
    probe = Positions()
    model = LennardJones(epsilon=0.0104, sigma=3.40, cutoff=8.5)
    sim = Simulator(model=model, stages=stage, precision="64", seed=SEED, sync_every=MD_STEPS,
                    accelerator="cpu", callbacks=[probe])  # fmt: skip
    res = sim.run(systems)
    assert res.steps.tolist() == [MD_STEPS] * 3
    ptr = np.cumsum([0] + [len(a) for a in systems])
    ours = np.array(probe.frames)
    for k, atoms in enumerate(systems):
        want = obabo_reference(atoms, system_id=k)
        np.testing.assert_allclose(ours[:, ptr[k] : ptr[k + 1]], want, rtol=0, atol=1e-9)
