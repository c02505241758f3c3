"""EMT against ASE's reference implementation, system by system inside one mixed batch.

One batch holds every kind of structure at once (bulk of each metal, triclinic and
tiny cells, mixed periodicity, a slab, a cluster, alloys with H/C/N/O), so the
comparison also checks that per-system cutoff parameters (``asap_cutoff``) do not
leak between systems.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.build import bulk, fcc111
from ase.calculators.emt import EMT as AseEMT
from ase.data import atomic_numbers

from alchemi_lit import Batch
from alchemi_lit.core.errors import ModelError
from alchemi_lit.models import EMT

METALS = ("Al", "Cu", "Ag", "Au", "Ni", "Pd", "Pt")
ALL_ELEMENTS = (*METALS, "H", "C", "N", "O")


def _structures() -> list[Atoms]:
    rng = np.random.default_rng(42)
    out = []
    for k, el in enumerate(METALS):  # perturbed cubic fcc, 32 atoms
        a = bulk(el, cubic=True) * (2, 2, 2)
        a.rattle(0.08, seed=k)
        a.set_cell(a.cell * 1.02, scale_atoms=True)
        out.append(a)
    # Triclinic: primitive fcc cells, repeated and sheared.
    a = bulk("Cu", cubic=False) * (2, 2, 2)
    a.set_cell(a.cell.array + 0.1 * rng.standard_normal((3, 3)), scale_atoms=True)
    a.rattle(0.05, seed=10)
    out.append(a)
    a = bulk("Pd", cubic=False) * (3, 2, 2)
    a.rattle(0.05, seed=11)
    out.append(a)
    # A single atom that sees only its own periodic images, and a 2-atom triclinic cell.
    out.append(bulk("Au", cubic=False))
    a = bulk("Ni", cubic=False) * (2, 1, 1)
    a.set_cell(a.cell.array + 0.05 * rng.standard_normal((3, 3)), scale_atoms=True)
    a.rattle(0.05, seed=12)
    out.append(a)
    # Mixed periodicity.
    a = bulk("Al", cubic=True) * (2, 2, 2)
    a.pbc = [True, False, True]
    a.rattle(0.05, seed=13)
    out.append(a)
    # Slab with vacuum.
    a = fcc111("Pt", size=(2, 2, 3), vacuum=5.0)
    a.rattle(0.05, seed=14)
    out.append(a)
    # Cluster without a cell (no stress in ASE).
    a = bulk("Ag", cubic=True) * (2, 2, 1)
    a.rattle(0.05, seed=15)
    out.append(Atoms(a.numbers, positions=a.positions))
    # Random alloys using every element; one without Ag changes the asap cutoff.
    for k, elements in enumerate((ALL_ELEMENTS, ("Ni", "Cu", "H", "O"), ("Al", "C", "N"))):
        a = bulk("Cu", cubic=True, a=3.7) * (2, 2, 2)
        symbols = list(elements) + list(rng.choice(elements, len(a) - len(elements)))
        a.set_chemical_symbols(symbols)
        a.rattle(0.08, seed=20 + k)
        out.append(a)
    # Two H atoms farther apart than H's asap rc_list but inside the list radius + skin.
    out.append(Atoms("H2", positions=[[0, 0, 0], [0, 0, 3.0]]))
    return out


@pytest.fixture(scope="module")
def structures() -> list[Atoms]:
    return _structures()


def _ase_results(atoms: Atoms, asap_cutoff: bool) -> tuple[float, np.ndarray, np.ndarray | None]:
    atoms = atoms.copy()
    atoms.calc = AseEMT(asap_cutoff=asap_cutoff)
    stress = atoms.get_stress(voigt=False) if atoms.cell.rank == 3 else None
    return atoms.get_potential_energy(), atoms.get_forces(), stress


@pytest.mark.parametrize("asap_cutoff", [False, True])
def test_matches_ase_in_mixed_batch(structures: list[Atoms], asap_cutoff: bool) -> None:
    batch = Batch.from_atoms(structures, min_distance=0.0)
    model = EMT(asap_cutoff=asap_cutoff)
    model.check_batch(batch)
    out = model(batch)
    ptr = batch.ptr.tolist()
    worst = np.zeros(3)
    for k, atoms in enumerate(structures):
        energy, forces, stress = _ase_results(atoms, asap_cutoff)
        errs = [
            abs(energy - float(out["energy"][k])),
            np.abs(forces - out["forces"][ptr[k] : ptr[k + 1]].numpy()).max(),
            0.0 if stress is None else np.abs(stress - out["stress"][k].numpy()).max(),
        ]
        if stress is None:  # no cell volume: the model reports zero stress
            assert torch.all(out["stress"][k] == 0)
        assert errs[0] < 1e-8, f"system {k}: energy error {errs[0]}"
        assert errs[1] < 1e-6, f"system {k}: force error {errs[1]}"
        assert errs[2] < 1e-6, f"system {k}: stress error {errs[2]}"
        worst = np.maximum(worst, errs)
    print(f"asap_cutoff={asap_cutoff}: worst |dE|, |dF|, |dS| = {worst}")


@pytest.mark.parametrize("asap_cutoff", [False, True])
def test_cutoff_covers_ase_neighbour_radius(asap_cutoff: bool) -> None:
    """The list radius must reach the largest rc_list ASE uses for any element set."""
    model = EMT(asap_cutoff=asap_cutoff)
    calc = AseEMT(asap_cutoff=asap_cutoff)
    for el in ALL_ELEMENTS:
        _, rc_list, _ = calc._calc_cutoff(Atoms(el))
        assert model.cutoff >= rc_list - 1e-12
    assert model.cutoff == pytest.approx(calc._calc_cutoff(Atoms("Ag"))[1], abs=1e-12)


def test_isolated_atoms_and_masked_edges_are_exact_zero() -> None:
    """Pairs beyond rc_list (but in the list) give exactly zero energy change and force."""
    atoms = Atoms("H2", positions=[[0, 0, 0], [0, 0, 3.0]])
    model = EMT(asap_cutoff=True)
    batch = Batch.from_atoms([atoms])
    assert len(model.neighbors(batch).i) == 1  # the pair is in the list ...
    out = model(batch)
    e0_h = -3.21
    assert float(out["energy"][0]) == pytest.approx(-2 * e0_h, abs=1e-14)
    assert torch.all(out["forces"] == 0)  # ... and contributes nothing, not NaN


def test_rejects_unsupported_element() -> None:
    atoms = bulk("Cu", cubic=True)
    atoms.numbers[1] = atomic_numbers["Fe"]
    batch = Batch.from_atoms([bulk("Al"), atoms])
    with pytest.raises(ModelError, match="Fe"):
        EMT().check_batch(batch)
    assert EMT.supported_elements == frozenset(atomic_numbers[s] for s in ALL_ELEMENTS)


def test_forces_are_minus_energy_gradient() -> None:
    atoms = bulk("Cu", cubic=True, a=3.7)
    atoms.set_chemical_symbols(["Cu", "Ni", "H", "Au"])
    atoms.rattle(0.1, seed=3)
    batch = Batch.from_atoms([atoms])
    model = EMT()
    forces = model(batch)["forces"]
    h = 1e-5
    pos = batch.positions.clone()
    for atom, axis in [(0, 0), (1, 2), (2, 1), (3, 0)]:
        energies = []
        for sign in (1.0, -1.0):
            moved = pos.clone()
            moved[atom, axis] += sign * h
            batch.positions = moved
            energies.append(float(model(batch)["energy"][0]))
        fd = -(energies[0] - energies[1]) / (2 * h)
        assert fd == pytest.approx(float(forces[atom, axis]), abs=1e-6)


def test_float32_runs_close_to_float64(structures: list[Atoms]) -> None:
    batch = Batch.from_atoms(structures[:3])
    model = EMT()
    e64 = model(batch)["energy"]
    out32 = EMT()(batch.to(dtype=torch.float32))
    assert torch.isfinite(out32["forces"]).all()
    assert torch.allclose(out32["energy"].double(), e64, atol=1e-3)


def test_a_forward_names_every_system_with_an_unsupported_element() -> None:
    """A model's first call checks the batch (an MLIP fed an element it was not trained
    on would return numbers, silently wrong): EMT has no Fe or Zn parameters, so
    ``model(batch)`` raises before evaluating, naming every offending system by its id
    and element at once (#42; systems 1 and 2 hold Fe and Zn, system 0 is fine)."""
    ok = bulk("Al")
    iron, zinc = bulk("Cu", cubic=True), bulk("Cu", cubic=True)
    iron.numbers[1] = atomic_numbers["Fe"]
    zinc.numbers[3] = atomic_numbers["Zn"]
    batch = Batch.from_atoms([ok, iron, zinc])
    both = r"elements Fe \(Z=26\) in system 1; Zn \(Z=30\) in system 2 "
    with pytest.raises(ModelError, match=both):
        EMT()(batch)


def test_float32_with_a_wide_skin_gives_ases_forces() -> None:
    """Edges in a wide skin (4 Å) lie far beyond the Fermi cutoff: ``acut (r - rc)``
    reaches ~107 there, past float32's ``exp`` overflow (88.7).  Their weight is masked
    to zero, but an infinite ``exp`` would still turn the backward pass into NaN forces;
    the clamp keeps them finite.  Float32 forces of a rattled Cu crystal against ASE's
    EMT: float32 rounds each of ~50 pair terms of ~1 eV/Å by ~6e-8 relative, and the
    positions by ~6e-7 Å (forces change ~10 eV/Å^2 per Å): ~1e-5 eV/Å; tolerance 1e-4."""
    atoms = bulk("Cu", cubic=True) * (2, 2, 2)
    atoms.rattle(0.05, seed=1)
    out = EMT(skin=4.0)(Batch.from_atoms([atoms], dtype=torch.float32))
    ref = atoms.copy()
    ref.calc = AseEMT()
    np.testing.assert_allclose(out["forces"].double().numpy(), ref.get_forces(), rtol=0, atol=1e-4)
