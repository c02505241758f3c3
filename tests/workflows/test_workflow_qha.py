"""workflows.qha against phonopy's PhonopyQHA fed by ASE's EMT calculator (phonopy driven
directly here: same volumes, supercells, displacements and mesh)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from ase import Atoms
from ase.build import bulk
from ase.calculators.emt import EMT as AseEMT
from ase.units import GPa, kJ, mol

from alchemi_lit import workflows
from alchemi_lit.core.errors import ConfigError
from alchemi_lit.models import EMT

pytest.importorskip("phonopy")
from phonopy import Phonopy, PhonopyQHA
from phonopy.structure.atoms import PhonopyAtoms

MESH = [9, 9, 9]
TEMPS = np.arange(0.0, 411.0, 10.0)
#: the fast test's: both sides use the same, so the comparison holds on any mesh
SMALL_MESH, FEW_TEMPS = [5, 5, 5], np.arange(0.0, 401.0, 20.0)


def phonopy_qha(atoms, strains, supercell, mesh=MESH, temps=TEMPS):
    """PhonopyQHA of ASE EMT phonons at ``1 + strains`` times the lattice vectors."""
    vols, energies, free, entropy, cv = [], [], [], [], []
    for s in strains:
        a = atoms.copy()
        a.set_cell(a.cell * (1 + s), scale_atoms=True)
        a.calc = AseEMT()
        unit = PhonopyAtoms(symbols=a.get_chemical_symbols(), cell=a.cell[:],
                            scaled_positions=a.get_scaled_positions(), masses=a.get_masses())
        ph = Phonopy(unit, supercell_matrix=np.eye(3) * supercell, primitive_matrix="auto")
        ph.generate_displacements(distance=0.01)
        forces = []
        for sc in ph.supercells_with_displacements:
            x = Atoms(sc.symbols, cell=sc.cell, scaled_positions=sc.scaled_positions, pbc=True)
            x.calc = AseEMT()
            forces.append(x.get_forces())
        ph.forces = forces
        ph.produce_force_constants()
        ph.run_mesh(mesh)
        ph.run_thermal_properties(temperatures=temps, exclude_gamma_acoustic=True)
        t = ph.thermal_properties
        per_prim = len(ph.primitive) / len(ph.unitcell)
        vols.append(ph.primitive.volume)
        energies.append(a.get_potential_energy() * per_prim)
        free.append(t.free_energy), entropy.append(t.entropy), cv.append(t.heat_capacity)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return PhonopyQHA(vols, energies, temperatures=temps, free_energy=np.array(free).T,
                          cv=np.array(cv).T, entropy=np.array(entropy).T, eos="vinet")  # fmt: skip


def bcc_copper():
    """Cu squeezed to bcc with the fcc lattice constant: imaginary shear modes."""
    return Atoms("Cu", cell=[[-1.55, 1.55, 1.55], [1.55, -1.55, 1.55], [1.55, 1.55, -1.55]],
                 pbc=True)  # fmt: skip


def compare(res, i, ref, temps=TEMPS):
    """beta(T), Cp(T), V(T), B(T) and G(T) of material ``i`` equal PhonopyQHA's to 1 %."""
    th = res.thermal(i).set_index("temperature_K")
    at = list(temps).index(300.0)
    per_j_mol = kJ / mol / 1000.0  # J/K/mol -> eV/K
    assert th["beta_per_K"][300.0] == pytest.approx(ref.thermal_expansion[at], rel=1e-2)
    assert th["heat_capacity_eV_per_K"][300.0] == pytest.approx(
        ref.heat_capacity_P_polyfit[at] * per_j_mol, rel=1e-2
    )
    assert th["volume_A3"][300.0] == pytest.approx(ref.volume_temperature[at], rel=1e-4)
    assert th["bulk_modulus_GPa"][300.0] == pytest.approx(
        ref.bulk_modulus_temperature[at], rel=1e-2
    )
    assert th["gibbs_energy_eV"][300.0] == pytest.approx(ref.gibbs_temperature[at], abs=1e-4)
    table = res.to_pandas()
    assert table["alpha_300K"][i] == pytest.approx(th["beta_per_K"][300.0] / 3, rel=1e-12)


def test_aluminium_matches_phonopy_qha_and_an_unstable_material_is_named():
    strains = np.linspace(-0.02, 0.02, 5)
    res = workflows.qha([bulk("Al", "fcc", a=4.05), bcc_copper()], EMT(), n_volumes=5,
                        supercell=2, min_width=0, mesh=SMALL_MESH, temperatures=FEW_TEMPS,
                        precision="64", workers=1)  # fmt: skip
    ref = phonopy_qha(bulk("Al", "fcc", a=4.05), strains, 2, SMALL_MESH, FEW_TEMPS)
    compare(res, 0, ref, FEW_TEMPS)
    assert res.errors[1] is not None and "imaginary modes at volume" in res.errors[1]
    assert np.isnan(res.to_pandas()["beta_300K"][1])
    assert len(res.jobs.jobs) == 2 * 5 * 2  # per volume: the cell and 1 displacement


@pytest.mark.slow
def test_aluminium_and_copper_match_phonopy_qha():
    strains = np.linspace(-0.02, 0.02, 7)
    mats = [bulk("Al", "fcc", a=4.05), bulk("Cu", "fcc", a=3.59)]
    res = workflows.qha(mats, EMT(), supercell=3, min_width=0, mesh=MESH,
                        temperatures=TEMPS, precision="64", workers=1)  # fmt: skip
    for i, atoms in enumerate(mats):
        compare(res, i, phonopy_qha(atoms, strains, 3))
    assert res.qha(0).thermal_expansion.shape == res.thermal(0)["beta_per_K"].shape
    assert np.isfinite(res.to_pandas()["B_300K"] * GPa).all()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n_volumes": 4}, "n_volumes must be >= 5"),
        ({"max_strain": 0.0005}, "max_strain is a linear strain"),
        ({"temperatures": [-10, 0, 10, 20]}, "temperatures must be >= 0 K"),
        ({"eos": "sj"}, "eos must be one of phonopy's"),
    ],
)
def test_bad_input_is_refused(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        workflows.qha([bulk("Al", "fcc", a=4.05)], EMT(), **kwargs)
