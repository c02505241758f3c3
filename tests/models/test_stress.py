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
from ase.build import bulk
from ase.calculators.emt import EMT as AseEMT
from ase.calculators.lj import LennardJones as AseLJ
from ase.calculators.morse import MorsePotential as AseMorse

from alchemi_lit import Batch
from alchemi_lit.models import EMT, LennardJones, Morse
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
