"""LennardJones and Morse against ASE's calculators, finite differences and cutoffs."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.calculators.lj import LennardJones as AseLJ
from ase.calculators.morse import MorsePotential as AseMorse

from alchemi_lit import Batch
from alchemi_lit.models import LennardJones, Morse
from alchemi_lit.testing import accelerator_path
from conftest import AR_EPSILON, AR_SIGMA, mixed_structures, perturbed_argon, strained

DT = torch.float64


def zoo() -> list[Atoms]:
    """Cubic, strained-cubic (triclinic), primitive triclinic, mixed-pbc, slab, cluster."""
    return [*mixed_structures(seed=1), strained(perturbed_argon(1, 2, 0.1, seed=2)[0], seed=3)]


def compare_with_ase(model, make_calc, structures: list[Atoms]) -> None:
    batch = Batch.from_atoms(structures, dtype=DT)
    out = model(batch)
    assert out["energy"].shape == (len(structures),)
    assert out["forces"].shape == (batch.num_atoms, 3)
    assert out["stress"].shape == (len(structures), 3, 3)
    for row, atoms in enumerate(structures):
        lo, hi = int(batch.ptr[row]), int(batch.ptr[row + 1])
        atoms = atoms.copy()
        atoms.calc = make_calc()
        e_ref = atoms.get_potential_energy()
        assert abs(float(out["energy"][row]) - e_ref) < 1e-8, f"system {row} energy"
        np.testing.assert_allclose(
            out["forces"][lo:hi].numpy(),
            atoms.get_forces(),
            rtol=0,
            atol=1e-6,
            err_msg=f"system {row} forces",
        )
        if atoms.cell.rank == 3:
            np.testing.assert_allclose(
                out["stress"][row].numpy(),
                atoms.get_stress(voigt=False),
                rtol=0,
                atol=1e-6,
                err_msg=f"system {row} stress",
            )
        else:  # no volume: stress is defined as zero
            assert not bool(out["stress"][row].any())


@pytest.mark.parametrize("cutoff", [5.0, 7.5, 8.5])
@pytest.mark.parametrize("smooth", [False, True])
def test_lennard_jones_matches_ase(cutoff: float, smooth: bool) -> None:
    kw = dict(epsilon=AR_EPSILON, sigma=AR_SIGMA)
    model = LennardJones(**kw, cutoff=cutoff, smooth=smooth, skin=0.5)
    compare_with_ase(model, lambda: AseLJ(**kw, rc=cutoff, smooth=smooth), zoo())


def test_lennard_jones_custom_onset_and_defaults_match_ase() -> None:
    structures = zoo()[:2]
    kw = dict(epsilon=AR_EPSILON, sigma=AR_SIGMA)
    model = LennardJones(**kw, cutoff=8.0, onset=6.0, smooth=True)
    compare_with_ase(model, lambda: AseLJ(**kw, rc=8.0, ro=6.0, smooth=True), structures)
    model = LennardJones(**kw)  # cutoff 3 sigma, like ASE's default rc
    assert model.cutoff == pytest.approx(3 * AR_SIGMA)
    compare_with_ase(model, lambda: AseLJ(**kw), structures)


@pytest.mark.parametrize(
    ("rho0", "r0", "rcut1", "rcut2"),
    [(6.0, 3.8, 1.9, 2.7), (4.0, 3.7, 1.2, 1.6), (7.0, 3.8, 1.5, 2.0)],
)
def test_morse_matches_ase(rho0: float, r0: float, rcut1: float, rcut2: float) -> None:
    kw = dict(epsilon=0.012, rho0=rho0, r0=r0, rcut1=rcut1, rcut2=rcut2)
    compare_with_ase(Morse(**kw, skin=0.5), lambda: AseMorse(**kw), zoo())


def _energy(model, batch: Batch) -> torch.Tensor:
    model.neighbors.reset()
    return model(batch, compute_stress=False)["energy"]


@pytest.mark.parametrize(
    "model",
    [
        LennardJones(epsilon=AR_EPSILON, sigma=AR_SIGMA, cutoff=7.0),
        LennardJones(epsilon=AR_EPSILON, sigma=AR_SIGMA, cutoff=7.0, smooth=True),
        Morse(epsilon=0.012, rho0=6.0, r0=3.8, rcut1=1.5, rcut2=2.0),
    ],
    ids=["lj", "lj-smooth", "morse"],
)
def test_forces_are_minus_energy_gradient(model) -> None:
    batch = Batch.from_atoms(mixed_structures(seed=4), dtype=DT)
    forces = model(batch)["forces"]
    h = 1e-5
    rng = np.random.default_rng(0)
    for row in range(batch.num_systems):
        atom = int(batch.ptr[row]) + int(rng.integers(int(batch.n_atoms[row])))
        for axis in range(3):
            plus, minus = batch.clone(), batch.clone()
            plus.positions[atom, axis] += h
            minus.positions[atom, axis] -= h
            fd = -(_energy(model, plus) - _energy(model, minus))[row] / (2 * h)
            assert abs(float(fd) - float(forces[atom, axis])) < 1e-6, (row, atom, axis)


def test_stress_is_strain_derivative() -> None:
    """stress = (1/V) dE/dε for a symmetric strain, positions scaled with the cell."""
    atoms = strained(perturbed_argon(1, 2, 0.1, seed=9)[0], seed=10)
    model = LennardJones(epsilon=AR_EPSILON, sigma=AR_SIGMA, cutoff=7.0, smooth=True)
    batch = Batch.from_atoms([atoms], dtype=DT)
    stress = model(batch)["stress"][0]
    h = 1e-6
    for a, b in [(0, 0), (1, 2), (0, 1)]:
        eps = np.zeros((3, 3))
        eps[a, b] = eps[b, a] = h / (1 if a == b else 2)
        energies = []
        for sign in (1, -1):
            s = atoms.copy()
            s.set_cell(atoms.cell.array @ (np.eye(3) + sign * eps), scale_atoms=True)
            energies.append(float(_energy(model, Batch.from_atoms([s], dtype=DT))[0]))
        fd = (energies[0] - energies[1]) / (2 * h) / atoms.get_volume()
        assert abs(fd - float(stress[a, b])) < 1e-7, (a, b)


def _dimer_energy(model, r: float) -> float:
    atoms = Atoms("Ar2", positions=[[0, 0, 0], [r, 0, 0]])
    model.neighbors.reset()
    return float(model(Batch.from_atoms([atoms], dtype=DT, validate=False))["energy"][0])


def test_shifted_lj_energy_is_continuous_at_cutoff() -> None:
    rc = 6.0
    model = LennardJones(epsilon=AR_EPSILON, sigma=AR_SIGMA, cutoff=rc)
    slope = 24 * AR_EPSILON * (2 * (AR_SIGMA / rc) ** 12 - (AR_SIGMA / rc) ** 6) / rc
    for delta in (1e-3, 1e-6, 1e-9):
        inside = _dimer_energy(model, rc - delta)
        assert inside != 0.0
        assert abs(inside) <= 1.01 * abs(slope) * delta + 1e-15
        assert _dimer_energy(model, rc + delta) == 0.0


def test_smooth_cutoffs_are_continuous_in_energy_and_force() -> None:
    models = [
        LennardJones(epsilon=AR_EPSILON, sigma=AR_SIGMA, cutoff=6.0, smooth=True),
        Morse(epsilon=0.012, rho0=6.0, r0=3.8, rcut1=1.5, rcut2=2.0),
    ]
    for model in models:
        rc = model.cutoff
        for delta in (1e-4, 1e-6):
            assert abs(_dimer_energy(model, rc - delta)) < 1e-6 * delta
            assert _dimer_energy(model, rc + delta) == 0.0


def test_cutoff_pairs_between_cutoff_and_skin_contribute_nothing() -> None:
    atoms = Atoms("Ar2", positions=[[0, 0, 0], [6.3, 0, 0]])
    batch = Batch.from_atoms([atoms], dtype=DT, validate=False)
    for model in (
        LennardJones(epsilon=AR_EPSILON, sigma=AR_SIGMA, cutoff=6.0, skin=1.0),
        LennardJones(epsilon=AR_EPSILON, sigma=AR_SIGMA, cutoff=6.0, smooth=True, skin=1.0),
        Morse(epsilon=0.012, rho0=6.0, r0=3.0, rcut1=1.5, rcut2=2.0, skin=1.0),
    ):
        out = model(batch)
        assert len(model.neighbors(batch).i) == 1  # the pair is in the Verlet list
        assert float(out["energy"][0]) == 0.0
        assert not bool(out["forces"].any())


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(epsilon=0.0),
        dict(epsilon=-1.0),
        dict(sigma=0.0),
        dict(sigma=-3.4),
        dict(cutoff=6.0, onset=6.0, smooth=True),
        dict(cutoff=6.0, onset=7.0, smooth=True),
        dict(cutoff=6.0, onset=0.0, smooth=True),
        dict(cutoff=0.0),
        dict(skin=-0.5),
    ],
)
def test_lennard_jones_bad_parameters(kwargs) -> None:
    with pytest.raises(ValueError):
        LennardJones(**{"epsilon": 1.0, "sigma": 1.0, **kwargs})


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(epsilon=0.0),
        dict(epsilon=-1.0),
        dict(rho0=0.0),
        dict(r0=-1.0),
        dict(rcut1=2.7, rcut2=2.7),
        dict(rcut1=3.0, rcut2=2.7),
        dict(rcut1=0.0),
    ],
)
def test_morse_bad_parameters(kwargs) -> None:
    with pytest.raises(ValueError):
        Morse(**kwargs)


def test_a_pair_exactly_at_the_lj_cutoff_is_counted_as_in_ase() -> None:
    """ASE's LennardJones zeroes a pair only where ``r2 > rc**2``: a pair at exactly
    the cutoff keeps its force ``24 eps (2 (σ/rc)^12 - (σ/rc)^6) / rc`` (the shifted
    energy is zero there, the force is not).  A dimer 6.0 Å apart (r2 = 36.0 exactly)
    with rc = 6.0, inside the list thanks to the skin, against ASE."""
    rc = 6.0
    atoms = Atoms("Ar2", positions=[[0, 0, 0], [rc, 0, 0]])
    ref = atoms.copy()
    ref.calc = AseLJ(epsilon=AR_EPSILON, sigma=AR_SIGMA, rc=rc)
    want = ref.get_forces()
    assert abs(want[0, 0]) > 1e-3  # a real force at the cutoff
    model = LennardJones(epsilon=AR_EPSILON, sigma=AR_SIGMA, cutoff=rc, skin=0.5)
    out = model(Batch.from_atoms([atoms], dtype=DT, validate=False))
    np.testing.assert_allclose(out["forces"].numpy(), want, rtol=1e-12, atol=0)
    assert abs(float(out["energy"][0]) - ref.get_potential_energy()) < 1e-15


@pytest.mark.parametrize("accelerator", [False, True], ids=["cpu", "accelerator-path"])
@pytest.mark.parametrize("skin", [0.0, 0.5])
def test_a_neighbour_shell_exactly_at_the_cutoff_counts_without_a_skin(
    skin: float, accelerator: bool
) -> None:
    """Simple-cubic argon, a = 3 Å, rc = 6 Å: the second shell along the axes sits at
    exactly the cutoff, where the shifted LJ's force does not vanish.  With no skin the
    list (strictly within its radius, as ASE's ``neighbor_list``) would drop it: the
    stress came out -0.0603157 instead of ASE's -0.0600299 eV/Å^3.  The forward and the
    one-off :meth:`Model.stress` (always skinless) both count it, as ASE does, on the
    CPU's list and on the accelerator's batched cell list."""
    atoms = Atoms("Ar", cell=[3.0, 3.0, 3.0], pbc=True)
    ref = atoms.copy()
    ref.calc = AseLJ(epsilon=AR_EPSILON, sigma=AR_SIGMA, rc=6.0)
    want = ref.get_stress(voigt=False)
    model = LennardJones(epsilon=AR_EPSILON, sigma=AR_SIGMA, cutoff=6.0, skin=skin)
    batch = Batch.from_atoms([atoms], dtype=DT, validate=False)
    with accelerator_path() if accelerator else contextlib.nullcontext():
        out, stress = model(batch), model.stress(batch)
    scale = np.abs(want).max()  # a sum of ~100 pair terms of this size: rtol 1e-12
    np.testing.assert_allclose(out["stress"][0].numpy(), want, rtol=0, atol=1e-12 * scale)
    np.testing.assert_allclose(stress[0].numpy(), want, rtol=0, atol=1e-12 * scale)
    assert abs(float(out["energy"][0]) - ref.get_potential_energy()) < 1e-12
