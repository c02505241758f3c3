"""Rigid water (RATTLE) with ASE's TIP3P calculator through ``ASECalculatorModel``.

References: ASE's ``VelocityVerlet`` on the same ``ase.Atoms`` with ``FixBondLengths``
(trajectory and energy drift), ASE's bond tolerance (bond lengths held), and
equipartition with ASE's degree-of-freedom count (``3N - bonds``: the long Langevin run
is in the slow tier; the fast sibling checks the count the thermostat uses).
"""

from __future__ import annotations

import numpy as np
import pytest
from ase import Atoms, units
from ase.calculators.tip3p import TIP3P, angleHOH, rOH
from ase.constraints import FixBondLengths
from ase.md.verlet import VelocityVerlet as AseVV
from test_md import Recorder

import alchemi_lit as al
from alchemi_lit.core.state import Batch
from alchemi_lit.integrators import Langevin, VelocityVerlet
from alchemi_lit.models import ASECalculatorModel

CUTOFF = 4.0  # (ASE's TIP3P needs a cell of twice the cutoff)


def water_box(n: int = 2, spacing: float = 4.0, seed: int = 0) -> Atoms:
    """``n^3`` rigid TIP3P waters (O, H, H each) on a jittered lattice, moving at 300 K."""
    gen = np.random.default_rng(seed)
    half = np.radians(angleHOH) / 2
    mol = np.array([[0, 0, 0], [0, rOH * np.cos(half), rOH * np.sin(half)],
                    [0, rOH * np.cos(half), -rOH * np.sin(half)]])  # fmt: skip
    positions = []
    for ijk in np.ndindex(n, n, n):
        q, _ = np.linalg.qr(gen.normal(size=(3, 3)))  # a random orientation
        positions.extend(mol @ q.T + spacing * np.asarray(ijk) + gen.normal(0, 0.05, 3))
    atoms = Atoms("OH2" * n**3, positions=positions, cell=[spacing * n] * 3, pbc=True)
    pairs = [(3 * i + a, 3 * i + b) for i in range(n**3) for a, b in ((0, 1), (0, 2), (1, 2))]
    atoms.set_constraint(FixBondLengths(pairs))
    m = atoms.get_masses()[:, None]
    atoms.set_momenta(gen.normal(size=(len(atoms), 3)) * np.sqrt(units.kB * 300.0 * m))
    return atoms  # (set_momenta applies the constraint: velocities along bonds removed)


def model() -> ASECalculatorModel:
    return ASECalculatorModel(TIP3P, {"rc": CUTOFF}, cutoff=CUTOFF + 1.0, compute_stress=False)


@pytest.mark.slow  # (ASE's TIP3P on the host every step; the fast sibling: test_constraints)
def test_rigid_water_under_velocity_verlet_follows_ase() -> None:
    atoms = water_box(2, seed=1)
    rec = Recorder(("positions",))
    sim = al.Simulator(model=model(), stages=VelocityVerlet(dt=1.0, steps=15), precision="64",
                       sync_every=1, callbacks=[rec])  # fmt: skip
    res = sim.run(Batch.from_atoms([atoms]))
    ref = atoms.copy()
    ref.calc = TIP3P(rc=CUTOFF)
    e0 = ref.get_total_energy()
    dyn = AseVV(ref, timestep=1.0 * units.fs)
    worst = 0.0
    for frame in rec.trajectory(0):
        dyn.run(1)
        worst = max(worst, float(np.abs(ref.positions - frame).max()))
    assert worst < 1e-8
    (out,) = res.to_atoms()
    bonds = ref.constraints[0]
    for (a, b), cd in zip(bonds.pairs, bonds.bondlengths):  # held to ASE's tolerance
        assert abs(out.get_distance(a, b, mic=True) - cd) < 1e-10
    drift_ase = ref.get_total_energy() - e0
    ours = float(res.batch.energy[0]) + float(res.batch.kinetic_energy()[0])
    assert abs((ours - e0) - drift_ase) < 1e-7


def test_the_thermostat_counts_three_per_atom_less_the_bonds() -> None:
    atoms = water_box(2)
    batch = Batch.from_atoms([atoms])
    assert float(batch.degrees_of_freedom()[0]) == atoms.get_number_of_degrees_of_freedom()
    assert float(batch.degrees_of_freedom()[0]) == 3 * len(atoms) - len(atoms)  # 3 bonds/3 atoms
    assert float(batch.temperature()[0]) == pytest.approx(atoms.get_temperature(), rel=1e-12)


@pytest.mark.slow
def test_rigid_water_equipartition_with_the_removed_dof() -> None:
    """Langevin at 300 K: the mean kinetic temperature over ASE's DOF (6 per rigid water)
    is 300 K within the run's statistical error; bonds stay rigid throughout."""
    atoms = water_box(3, spacing=3.2, seed=2)
    temps = []

    class Temperatures(al.Callback):
        def after_step(self, ctx) -> None:
            if int(ctx.batch.step[0]) > 300:
                temps.append(float(ctx.batch.temperature()[0]))

    stage = Langevin(dt=1.0, temperature=300.0, friction=0.02, steps=2300)
    res = al.Simulator(model=model(), stages=stage, precision="64", sync_every=1,
                       callbacks=[Temperatures()]).run(Batch.from_atoms([atoms]))  # fmt: skip
    t = np.asarray(temps)
    blocks = t[: len(t) // 20 * 20].reshape(20, -1).mean(1)
    error = blocks.std(ddof=1) / np.sqrt(len(blocks))
    assert abs(t.mean() - 300.0) < 4 * error + 3.0, (t.mean(), error)
    (out,) = res.to_atoms()
    bonds = out.constraints[0]
    for (a, b), cd in zip(bonds.pairs, bonds.bondlengths):
        assert abs(out.get_distance(a, b, mic=True) - cd) < 1e-8
