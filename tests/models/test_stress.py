"""Every built-in model's stress, checked before it drives a cell (float64).

Against ASE's calculators (LJ, Morse, EMT) on strained and sheared triclinic crystals,
to round-off (measured: ~1e-17 eV/Å^3 for the pair potentials, ~1e-15 for EMT, with
stresses of 1e-3..1e-1); and against the sign convention the cell filters rely on,
ASE's: ``stress = (1/V) dE/d(strain)``, positive under tension (a stretched crystal
pulls its cell back in), by central differences of the energy under strain.
(The SevenNet and MACE plugins check theirs against their own ASE calculators in
``plugins/*/tests``.)
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.build import bulk
from ase.calculators.emt import EMT as AseEMT
from ase.calculators.lj import LennardJones as AseLJ
from ase.calculators.morse import MorsePotential as AseMorse

from alchemi_lit import Batch
from alchemi_lit.models import EMT, LennardJones, Model, Morse
from conftest import AR_EPSILON, AR_SIGMA, perturbed_argon, strained, triclinic_argon

DT = torch.float64
MORSE = dict(epsilon=0.012, rho0=6.0, r0=3.8, rcut1=1.9, rcut2=2.7)


def argon() -> list:
    return [
        strained(perturbed_argon(1, 2, 0.1, seed=1)[0], seed=2, amount=0.08),
        triclinic_argon(3, 0.1, 0.08, seed=3),
    ]


def metals() -> list:
    out = []
    for k, (symbol, cubic, repeat) in enumerate(
        [("Cu", True, 2), ("Au", False, 3), ("Pt", False, (2, 2, 3)), ("Ni", True, (1, 1, 2))]
    ):
        atoms = strained(bulk(symbol, cubic=cubic) * repeat, seed=10 + k, amount=0.08)
        atoms.rattle(0.05, seed=k)
        out.append(atoms)
    return out


CASES = {
    "lj": (
        lambda: LennardJones(AR_EPSILON, AR_SIGMA, 8.5),
        lambda: AseLJ(epsilon=AR_EPSILON, sigma=AR_SIGMA, rc=8.5),
        argon,
    ),
    "lj-smooth": (
        lambda: LennardJones(AR_EPSILON, AR_SIGMA, 8.5, smooth=True),
        lambda: AseLJ(epsilon=AR_EPSILON, sigma=AR_SIGMA, rc=8.5, smooth=True),
        argon,
    ),
    "morse": (lambda: Morse(**MORSE), lambda: AseMorse(**MORSE), argon),
    "emt": (EMT, AseEMT, metals),
}


@pytest.mark.parametrize("name", list(CASES))
def test_stress_matches_ase_on_strained_triclinic_cells(name: str) -> None:
    make_model, make_calc, make_systems = CASES[name]
    systems = make_systems()
    out = make_model()(Batch.from_atoms(systems, dtype=DT))
    for k, atoms in enumerate(systems):
        assert not np.allclose(atoms.cell.array, np.diag(np.diag(atoms.cell.array)))  # sheared
        atoms = atoms.copy()
        atoms.calc = make_calc()
        ref = atoms.get_stress(voigt=False)
        assert np.abs(ref).max() > 1e-3
        tol = 1e-12 * np.abs(ref).max()
        np.testing.assert_allclose(out["stress"][k].numpy(), ref, rtol=0, atol=tol)


@pytest.mark.parametrize("name", ["lj", "morse", "emt"])
def test_stress_is_the_strain_derivative_positive_under_tension(name: str) -> None:
    make_model, _, make_systems = CASES[name]
    model = make_model()
    atoms = make_systems()[1]

    def energy(eps: np.ndarray) -> float:
        a = atoms.copy()
        a.set_cell(atoms.cell.array @ (np.eye(3) + eps), scale_atoms=True)
        return float(model(Batch.from_atoms([a], dtype=DT), compute_stress=False)["energy"][0])

    stress = model(Batch.from_atoms([atoms], dtype=DT))["stress"][0].numpy()
    h, volume = 1e-5, atoms.get_volume()
    for a, b in [(0, 0), (2, 2), (0, 1), (1, 2)]:
        eps = np.zeros((3, 3))
        eps[a, b] = eps[b, a] = h if a == b else h / 2
        derivative = (energy(eps) - energy(-eps)) / (2 * h) / volume
        assert abs(derivative - stress[a, b]) < 1e-6 * max(1.0, abs(stress[a, b])) + 1e-9

    # stretched 10 %, a crystal is under tension (positive); squeezed 10 %, compressed
    def trace_scaled(factor: float) -> float:
        a = atoms.copy()
        a.set_cell(atoms.cell.array * factor, scale_atoms=True)
        return float(torch.trace(model(Batch.from_atoms([a], dtype=DT))["stress"][0]))

    assert trace_scaled(1.1) > 0 > trace_scaled(0.9)


class _Anisotropic(Model):
    """A toy energy of edge vectors that is *not* rotation invariant,
    ``E = sum_edges (x y + 0.3 x z^2 - 0.2 y^3)``: its stress is not symmetric, so the
    virial's index order shows (every built-in model's stress is symmetric)."""

    def energy(self, batch: Batch, edges) -> torch.Tensor:
        x, y, z = edges.vec.unbind(-1)
        per_edge = x * y + 0.3 * x * z * z - 0.2 * y**3
        return edges.system_sum(per_edge, batch.num_systems)


def test_stress_index_order_is_the_strains_for_a_non_symmetric_stress() -> None:
    """``stress[a, b] = (1/V) dE/dε_ab`` under ASE's deformation ``cell @ (I + ε)`` (rows
    are vectors: r_b -> r_b + r_a ε_ab) for a *general*, non-symmetric ε, so the virial is
    ``sum vec_a dE/dvec_b`` and not its transpose.  Three atoms in the middle of a 10 Å
    cell, cutoff 4 Å: the three pair vectors (2-3 Å long) are the only edges under any
    strain here.  The energy is a cubic polynomial in the strain, so central differences
    have a truncation error ``h^2/6 |E'''| ~ 1e-11`` and a rounding error
    ``~eps |E| / h ~ 1e-11``; the tolerance 1e-8 is far above both and far below the
    asymmetry (|stress - stress^T| ~ 1e-3 eV/Å^3)."""
    atoms = Atoms(
        "Ar3",
        positions=[[4.0, 4.2, 4.1], [6.1, 4.9, 4.6], [4.6, 6.3, 5.8]],
        cell=[[10.0, 0, 0], [0.7, 10.2, 0], [0.4, -0.3, 9.8]],
        pbc=True,
    )
    model = _Anisotropic(cutoff=4.0, skin=0.0)
    stress = model(Batch.from_atoms([atoms], dtype=DT))["stress"][0].numpy()
    assert np.abs(stress - stress.T).max() > 1e-4  # not symmetric: the order shows
    h, volume = 1e-5, atoms.get_volume()
    for a in range(3):
        for b in range(3):
            energies = []
            for sign in (1, -1):
                eps = np.zeros((3, 3))
                eps[a, b] = sign * h
                moved = atoms.copy()
                moved.set_cell(atoms.cell.array @ (np.eye(3) + eps), scale_atoms=True)
                energies.append(float(model(Batch.from_atoms([moved], dtype=DT))["energy"][0]))
            derivative = (energies[0] - energies[1]) / (2 * h) / volume
            assert abs(derivative - stress[a, b]) < 1e-8, (a, b, derivative, stress[a, b])


@pytest.mark.parametrize("built_with", [True, False])
def test_stress_is_returned_exactly_when_asked(built_with: bool) -> None:
    """``model(batch, compute_stress=...)`` overrides the model's default both ways: the
    step loop asks for no stress when no stage needs it (a [P, 3, 3] reduction saved per
    step), and for it when one does, whatever the model was built with."""
    batch = Batch.from_atoms(argon()[:1], dtype=DT)
    model = LennardJones(AR_EPSILON, AR_SIGMA, 8.5, compute_stress=built_with)
    assert ("stress" in model(batch)) is built_with
    assert "stress" not in model(batch, compute_stress=False)
    assert "stress" in model(batch, compute_stress=True)


def test_a_cell_without_volume_gets_zero_stress_whatever_its_determinant_rounds_to() -> None:
    """Stress is zero for a system without a 3-D cell.  A cell whose third vector is a
    combination of the other two has no volume, but its determinant (LAPACK's and the
    cofactors' alike, for this one) rounds to ~2e-15 Å^3, not 0:
    dividing the (nonzero) virial of this Ar3 molecule by it would report a stress of
    ~1e13 eV/Å^3.  Volumes up to 1e-12 Å^3 count as none."""
    a, b = np.array([4.1, 0.3, 0.7]), np.array([0.2, 4.3, 0.9])
    atoms = Atoms(
        "Ar3", positions=[[0, 0, 0], [3.7, 0, 0], [0.4, 3.6, 0]], cell=[a, b, 0.7 * a + 1.3 * b],
        pbc=False,
    )
    batch = Batch.from_atoms([atoms], dtype=DT, validate=False)
    assert 0 < float(batch.volume[0]) < 1e-12  # rounding: not exactly zero
    out = LennardJones(AR_EPSILON, AR_SIGMA, 8.5)(batch)
    assert float(out["forces"].abs().max()) > 1e-3  # a real virial
    assert torch.equal(out["stress"], torch.zeros(1, 3, 3, dtype=DT))


def test_a_one_off_stress_leaves_the_models_list_alone() -> None:
    """``Model.stress`` evaluates with a list of its own: the model's cached list (the
    step loop's, built for the whole batch) is neither rebuilt for the sub-batch nor
    rebuilt again at the next step; and its value is ASE's."""
    systems = argon()
    batch = Batch.from_atoms(systems, dtype=DT)
    model = LennardJones(AR_EPSILON, AR_SIGMA, 8.5)
    model(batch, compute_stress=False)
    builds = model.neighbors.num_builds
    stress = model.stress(batch.select(torch.tensor([1])))
    model(batch, compute_stress=False)
    assert model.neighbors.num_builds == builds
    ref = systems[1].copy()
    ref.calc = AseLJ(epsilon=AR_EPSILON, sigma=AR_SIGMA, rc=8.5)
    np.testing.assert_allclose(stress[0].numpy(), ref.get_stress(voigt=False), rtol=0, atol=1e-12)
