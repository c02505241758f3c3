"""Constraints step for step against ASE (``ase.constraints`` on an ``ase.Atoms`` driven
by ASE's own optimizers and ``VelocityVerlet``), float64, to 1e-8 Å.

Each case is a small perturbed Lennard-Jones argon cluster (ASE's ``LennardJones`` as the
reference calculator) carrying one kind of constraint, or a mix; every case runs on the
CPU's shortcuts and on the accelerator's branches (``code_path``).  ExternalForce under
velocity Verlet is compared with ASE's ``adjust_momenta`` switched off: ASE inherits the
default ``adjust_momenta = adjust_forces`` for it, which adds the force (eV/Å) to the
momenta at every ``set_momenta`` -- a unit error, not a semantics to copy (Hookean
overrides it with ``pass`` for that reason).
"""

from __future__ import annotations

import numpy as np
import pytest
from ase import units
from ase.constraints import (
    ExternalForce,
    FixAtoms,
    FixBondLengths,
    FixedLine,
    FixedPlane,
)
from ase.md.bussi import Bussi as AseBussi
from ase.md.verlet import VelocityVerlet as AseVV
from ase.optimize import BFGS as AseBFGS
from ase.optimize import FIRE as AseFIRE
from ase.optimize import LBFGS as AseLBFGS
from test_md import SEED, BussiNoise, Recorder, ase_lj, lj_model, moving_argon

import alchemi_lit as al
from alchemi_lit.core.state import Batch
from alchemi_lit.integrators import BFGS, FIRE, LBFGS, Bussi, VelocityVerlet
from alchemi_lit.testing import constraint_cases

#: FixAtoms and rigid bonds are checked apart (test_optimizers.py, test_rigid_water.py)
CASES = {k: v for k, v in constraint_cases().items() if k not in ("FixAtoms", "FixBondLengths")}
#: the fast tier runs the mix (every kind but rigid bonds at once); each kind alone: slow
NAMES = [n if n == "mixed" else pytest.param(n, marks=pytest.mark.slow) for n in CASES]


def cluster(seed: int = 0, temperature: float = 40.0):
    """A 32-atom argon crystal fragment, isolated (no cell), perturbed and moving."""
    atoms = moving_argon(1, temperature=temperature, seed=seed)[0]
    atoms.pbc = False
    atoms.cell = None
    return atoms


def constrained(name: str, seed: int = 0, moving: bool = True):
    atoms = cluster(seed, 40.0 if moving else 0.0)
    if not moving:
        atoms.set_momenta(np.zeros((len(atoms), 3)), apply_constraint=False)
    atoms.set_constraint(CASES[name](atoms))
    if moving:  # ASE's set_momenta applies the constraints: start from allowed momenta
        atoms.set_momenta(atoms.get_momenta())
    return atoms


def run(atoms_list, stage, fields=("positions",)):
    rec = Recorder(fields)
    batch = Batch.from_atoms(atoms_list)
    sim = al.Simulator(model=lj_model(), stages=stage, precision="64", sync_every=1,
                       callbacks=[rec])  # fmt: skip
    return sim.run(batch), rec


def ase_copy(atoms):
    ref = atoms.copy()
    ref.calc = ase_lj()
    return ref


def deviation(dyn, ref, frames) -> float:
    """Largest distance from ASE's positions over ``frames`` (ASE's first ``irun`` yield
    comes before any step)."""
    worst, steps = 0.0, dyn.irun(fmax=1e-6, steps=len(frames)) if hasattr(dyn, "fmax") else None
    if steps is None:  # MD
        for frame in frames:
            dyn.run(1)
            worst = max(worst, float(np.abs(ref.positions - frame).max()))
        return worst
    n = 0
    for n, _ in enumerate(steps):
        if n >= 1:
            worst = max(worst, float(np.abs(ref.positions - frames[n - 1]).max()))
    assert n == len(frames)
    return worst


OPTIMIZERS = {
    "FIRE": (lambda: FIRE(fmax=1e-6, max_steps=25), AseFIRE),
    "BFGS": (lambda: BFGS(fmax=1e-6, max_steps=25), AseBFGS),
    "LBFGS": (lambda: LBFGS(fmax=1e-6, max_steps=25), AseLBFGS),
}


@pytest.mark.parametrize(
    "opt", [o if o == "FIRE" else pytest.param(o, marks=pytest.mark.slow) for o in OPTIMIZERS]
)
@pytest.mark.parametrize("name", NAMES)
def test_optimizers_follow_ase_step_for_step(name: str, opt: str, code_path) -> None:
    atoms = constrained(name, moving=False)
    ours, ase_opt = OPTIMIZERS[opt]
    _, rec = run([atoms], ours())
    frames = rec.trajectory(0)
    assert len(frames) == 25
    ref = ase_copy(atoms)
    assert deviation(ase_opt(ref, logfile=None), ref, frames) < 1e-8


class _PlainExternalForce(ExternalForce):
    """ASE's ExternalForce without its inherited ``adjust_momenta`` (module docstring)."""

    def adjust_momenta(self, atoms, momenta) -> None:
        return None


@pytest.mark.parametrize("name", NAMES)
def test_velocity_verlet_follows_ase_step_for_step(name: str, code_path) -> None:
    atoms = constrained(name)
    _, rec = run([atoms], VelocityVerlet(dt=4.0, steps=30))
    ref = ase_copy(atoms)
    ref.set_constraint([
        _PlainExternalForce(*c.indices, c.external_force) if isinstance(c, ExternalForce)
        else c for c in ref.constraints
    ])  # fmt: skip
    assert deviation(AseVV(ref, timestep=4.0 * units.fs), ref, rec.trajectory(0)) < 1e-8


def test_rigid_bonds_under_velocity_verlet_follow_ase(code_path) -> None:
    """RATTLE: two rigid bonds and a rigid triangle in an argon cluster."""
    atoms = cluster(seed=3)
    atoms.set_constraint(FixBondLengths([(0, 1), (2, 3), (3, 4), (2, 4)]))
    atoms.set_momenta(atoms.get_momenta())
    _, rec = run([atoms], VelocityVerlet(dt=4.0, steps=12))
    ref = ase_copy(atoms)
    assert deviation(AseVV(ref, timestep=4.0 * units.fs), ref, rec.trajectory(0)) < 1e-8
    bonds = ref.constraints[0]
    for a, b in bonds.pairs:  # held to ASE's tolerance (1e-13 on the correction)
        assert (
            abs(
                ref.get_distance(a, b)
                - np.linalg.norm(rec.trajectory(0)[-1][a] - rec.trajectory(0)[-1][b])
            )
            < 1e-10
        )


@pytest.mark.parametrize("name", list(CASES))
def test_temperature_and_dof_equal_ase(name: str) -> None:
    atoms = constrained(name)
    batch = Batch.from_atoms([atoms])
    assert float(batch.degrees_of_freedom()[0]) == atoms.get_number_of_degrees_of_freedom()
    assert float(batch.temperature()[0]) == pytest.approx(atoms.get_temperature(), rel=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_results_carry_the_constraints_back_to_ase(name: str) -> None:
    atoms = constrained(name, moving=False)
    res = al.Simulator(model=lj_model(), stages=FIRE(fmax=0.5, max_steps=3),
                       precision="64").run(Batch.from_atoms([atoms]))  # fmt: skip
    out = res.to_atoms()[0] if hasattr(res, "to_atoms") else res[0]
    assert sorted(type(c).__name__ for c in out.constraints) == sorted(
        type(c).__name__ for c in atoms.constraints
    )
    check = out.copy()
    check.calc = ase_lj()
    assert np.abs(out.get_forces() - check.get_forces()).max() < 1e-10
    assert out.get_potential_energy() == pytest.approx(check.get_potential_energy(), abs=1e-10)


class _BussiNoise(BussiNoise):
    """Our ``R1`` and ``S / 2`` for ASE's Bussi, ``S`` over ``Nf - 1`` normals."""

    def standard_gamma(self, shape):
        assert shape == 0.5 * (float(self.batch.degrees_of_freedom()[0]) - 1)
        self.step += 1
        return 0.5 * self.s


def test_bussi_counts_the_removed_dof_as_ase(code_path) -> None:
    """ASE's Bussi (``ndof = get_number_of_degrees_of_freedom()``) fed our noise."""
    atoms = cluster(seed=4)
    atoms.set_constraint([FixedPlane([0], (1, 1, 0)), FixedLine([3, 4], (0, 0, 1)), FixAtoms([9])])
    atoms.set_momenta(atoms.get_momenta())
    rec = Recorder()
    batch = Batch.from_atoms([atoms])
    stage = Bussi(dt=4.0, temperature=90.0, taut=40.0, steps=10)
    sim = al.Simulator(model=lj_model(), stages=stage, precision="64", seed=SEED,
                       sync_every=1, callbacks=[rec])  # fmt: skip
    sim.run(batch)
    ref = ase_copy(atoms)
    dyn = AseBussi(ref, 4.0 * units.fs, 90.0, 40.0 * units.fs, rng=_BussiNoise(ref, 0))
    assert deviation(dyn, ref, rec.trajectory(0)) < 1e-8
