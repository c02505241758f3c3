"""workflows.phonons against phonopy driven by ASE's EMT calculator, the way phonopy's
own ASE examples run it: same supercells and displacements, forces from ASE."""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd
import pytest
from ase import Atoms
from ase.calculators.emt import EMT as AseEMT
from workflow_materials import NoGold, aluminium, copper, cu3au

from alchemi_lit import workflows
from alchemi_lit.models import EMT, ASECalculatorModel

pytest.importorskip("phonopy")
pytest.importorskip("seekpath")

from phonopy import Phonopy
from phonopy.structure.atoms import PhonopyAtoms

# small supercells keep phonopy's own set-up (symmetry of the supercell) quick; both
# sides use the same ones, so the comparison is exact whatever their size
SUPERCELLS = [[3, 3, 3], [3, 3, 3], [2, 2, 2]]
KW = dict(min_width=0, mesh=[9, 9, 9], npoints=11)


def ase_force_constants(atoms, supercell, distance=0.01):
    """phonopy's force constants from ASE's EMT forces on its displaced supercells."""
    unit = PhonopyAtoms(
        symbols=atoms.get_chemical_symbols(), cell=atoms.cell[:],
        scaled_positions=atoms.get_scaled_positions(), masses=atoms.get_masses(),
    )  # fmt: skip
    ph = Phonopy(unit, supercell_matrix=np.diag(supercell), primitive_matrix="auto")
    ph.generate_displacements(distance=distance)
    forces = []
    for sc in ph.supercells_with_displacements:
        s = Atoms(sc.symbols, cell=sc.cell, scaled_positions=sc.scaled_positions, pbc=True)
        s.calc = AseEMT()
        forces.append(s.get_forces())
    ph.forces = forces
    ph.produce_force_constants()
    return ph


def ase_thermal(atoms, supercell, mesh, temperatures):
    """phonopy's thermal properties (kJ/mol, J/K/mol) on ``mesh`` from ASE EMT forces."""
    ph = ase_force_constants(atoms, supercell)
    ph.run_mesh(mesh)
    ph.run_thermal_properties(temperatures=temperatures, exclude_gamma_acoustic=True)
    return ph.thermal_properties


def ase_phonopy(atoms, supercell):
    """phonopy with forces from ASE's EMT, and the same band path, mesh and thermal
    properties as the workflow's settings above."""
    ph = ase_force_constants(atoms, supercell)
    ph.auto_band_structure(npoints=KW["npoints"])
    ph.run_mesh(KW["mesh"])
    ph.run_thermal_properties(temperatures=[300.0], exclude_gamma_acoustic=True)
    return ph


def bcc_copper():
    """Cu squeezed to bcc with the fcc lattice constant: imaginary shear modes."""
    return Atoms(
        "Cu", cell=[[-1.55, 1.55, 1.55], [1.55, -1.55, 1.55], [1.55, 1.55, -1.55]], pbc=True
    )


def gamma(ph):
    ph.run_qpoints([[0.0, 0.0, 0.0]])
    return ph.qpoints.frequencies[0]


@pytest.fixture(scope="module")
def computed():
    materials = [copper(), aluminium(), cu3au()]
    return materials, workflows.phonons(
        materials, EMT(), supercell=dict(enumerate(SUPERCELLS)), **KW
    )


def test_frequencies_and_free_energy_match_phonopy_with_ase_emt(computed):
    materials, res = computed
    table = res.to_pandas()
    for i, atoms in enumerate(materials):
        ref = ase_phonopy(atoms, SUPERCELLS[i])
        ph = res.phonopy(i)
        assert isinstance(ph, Phonopy)
        # forces agree with ASE's to ~1e-14 eV/Å: frequencies to far below 1e-4 THz
        np.testing.assert_allclose(gamma(ph), gamma(ref), rtol=0, atol=1e-4)
        for mine, theirs in zip(
            res.band_structure(i)["frequencies"], ref.band_structure.frequencies
        ):
            np.testing.assert_allclose(mine, theirs, rtol=0, atol=1e-4)
        f300 = ref.thermal_properties.free_energy[0] / 96.485332123  # kJ/mol -> eV
        assert table["free_energy_300K"][i] == pytest.approx(f300, abs=1e-4)
        assert table["free_energy_300K"][i] == pytest.approx(
            res.thermal(i).set_index("temperature_K")["free_energy_eV"][300.0], abs=1e-12
        )
        assert table["n_displacements"][i] == len(ref.supercells_with_displacements)
    assert table["stable"].all()
    assert (table["min_frequency_THz"] > -0.05).all()


def test_unstable_structure_is_flagged(computed):
    """Cu squeezed to bcc with the fcc lattice constant: imaginary shear modes, which
    the flag must report (phonopy gives them as negative frequencies)."""
    res = workflows.phonons([bcc_copper()], EMT(), supercell=3, **KW)
    row = res.to_pandas().iloc[0]
    assert row["min_frequency_THz"] < -0.05 and not row["stable"]


def test_dos_and_thermal_tables(computed):
    _, res = computed
    dos = res.dos(0)
    assert dos["frequency_points"].shape == dos["total_dos"].shape
    # 3 modes per atom: the DOS integrates to 3 per primitive cell (1 atom)
    integral = np.trapezoid(dos["total_dos"], dos["frequency_points"])
    assert integral == pytest.approx(3.0, rel=0.02)
    thermal = res.thermal(2)
    assert list(thermal.columns) == [
        "temperature_K", "free_energy_eV", "entropy_eV_per_K", "heat_capacity_eV_per_K"
    ]  # fmt: skip
    assert 300.0 in thermal["temperature_K"].tolist()


def test_phonopy_work_in_worker_processes_equals_it_in_this_one(computed):
    """workers=2 (phonopy's set-up and analysis in two other processes, one thread each,
    as this test process) gives material for material what workers=1 gives here."""
    materials, _ = computed
    pair = materials[:2]
    kw = dict(supercell=dict(enumerate(SUPERCELLS[:2])), **KW)
    here = workflows.phonons(pair, EMT(), workers=1, **kw)
    there = workflows.phonons(pair, EMT(), workers=2, **kw)
    assert (here.settings["workers"], there.settings["workers"]) == (1, 2)
    for i in range(2):
        a, b = here.phonopy(i), there.phonopy(i)
        np.testing.assert_array_equal(a.force_constants, b.force_constants)
        np.testing.assert_array_equal(a.mesh.frequencies, b.mesh.frequencies)
        assert here.to_pandas().iloc[i].equals(there.to_pandas().iloc[i])


def test_auto_workers_only_where_phonopy_work_pays_for_them():
    from alchemi_lit.core.workers import resolve_workers
    from alchemi_lit.workflows.phonopy_setup import setup_costs

    small = sum(setup_costs([copper()] * 3, [np.diag([3, 3, 3])] * 3))  # 27-atom supercells
    big = sum(setup_costs([copper()] * 20, [np.diag([6, 6, 6])] * 20))  # 216 atoms: ~4.6 s each
    assert resolve_workers("auto", 3, "phonons", small) == 1
    assert big > 60 and resolve_workers("auto", 20, "phonons", big) == min(
        resolve_workers("auto", 20, "phonons"), 20
    )


#: Gamma to (0, 0, 1/2) of bcc Cu's reciprocal basis: its shear branch is imaginary there
BCC_PATH = [[[0.0, 0.0, 0.0], [0.0, 0.0, 0.5]]]
#: the band path alone finds the imaginary modes: the mesh is Gamma only
BCC_KW = dict(supercell=2, min_width=0, mesh=[1, 1, 1], band_path=BCC_PATH, npoints=11)


@functools.cache
def ase_lowest_on_bcc_path():
    """The lowest frequency (THz) of phonopy with ASE EMT forces along BCC_PATH."""
    from phonopy.phonon.band_structure import get_band_qpoints_and_path_connections

    ph = ase_force_constants(bcc_copper(), [2, 2, 2])
    qpoints, connections = get_band_qpoints_and_path_connections(BCC_PATH, 11)
    ph.run_band_structure(qpoints, path_connections=connections)
    return min(float(np.min(f)) for f in ph.band_structure.frequencies)


def test_the_lowest_frequency_is_read_on_the_band_path_as_well_as_the_mesh():
    """With a Gamma-only mesh the imaginary shear modes of bcc Cu are on the band path
    alone: min_frequency_THz is the path's minimum and the structure unstable.  The
    other tests' meshes held imaginary modes too, so a minimum over the mesh alone
    gave the same flags."""
    row = workflows.phonons([bcc_copper()], EMT(), **BCC_KW).to_pandas().iloc[0]
    lowest = ase_lowest_on_bcc_path()
    assert lowest < -1.0
    assert row["min_frequency_THz"] == pytest.approx(lowest, abs=1e-4)
    assert not row["stable"]


@pytest.mark.parametrize("tolerance", [0.5, 2.0])
def test_stable_compares_the_lowest_frequency_with_the_given_tolerance(tolerance):
    """bcc Cu's lowest frequency is about -1.1 THz: unstable under a 0.5 THz tolerance,
    stable under 2 THz.  Every other test left imaginary_tolerance at its default, so
    a tolerance not passed on to the analysis went unseen."""
    res = workflows.phonons([bcc_copper()], EMT(), imaginary_tolerance=tolerance, **BCC_KW)
    assert res.to_pandas()["stable"][0] == (ase_lowest_on_bcc_path() >= -tolerance)
    assert res.settings["imaginary_tolerance"] == tolerance


def test_thermal_table_is_phonopys_converted_to_ev(computed):
    """thermal(): free energy, entropy and heat capacity at 300 K of Cu against phonopy's
    with ASE EMT forces, kJ/mol and J/K/mol converted with the Faraday constant
    (96485.332123 J/mol per eV).  The other tests read the free energy only."""
    _, res = computed
    ref = ase_thermal(copper(), SUPERCELLS[0], KW["mesh"], [300.0])
    row = res.thermal(0).set_index("temperature_K").loc[300.0]
    assert row["free_energy_eV"] == pytest.approx(ref.free_energy[0] / 96.485332123, abs=1e-6)
    assert row["entropy_eV_per_K"] == pytest.approx(ref.entropy[0] / 96485.332123, rel=1e-6)
    assert row["heat_capacity_eV_per_K"] == pytest.approx(
        ref.heat_capacity[0] / 96485.332123, rel=1e-6
    )


def test_300_k_is_added_to_the_temperatures_asked_for():
    """temperatures=(100,): the thermal table has 100 and 300 K (free_energy_300K needs
    the latter), both phonopy's with ASE EMT forces.  The default temperatures hold
    300 K already, and no test asked for others."""
    kw = dict(supercell=2, min_width=0, mesh=[5, 5, 5], band_path=None)
    res = workflows.phonons([copper()], EMT(), temperatures=(100.0,), **kw)
    ref = ase_thermal(copper(), [2, 2, 2], [5, 5, 5], [100.0, 300.0])
    table = res.thermal(0)
    assert table["temperature_K"].tolist() == [100.0, 300.0]
    np.testing.assert_allclose(table["free_energy_eV"], ref.free_energy / 96.485332123, atol=1e-6)
    assert res.to_pandas()["free_energy_300K"][0] == pytest.approx(
        ref.free_energy[1] / 96.485332123, abs=1e-6
    )


def test_distance_is_the_length_of_each_displacement():
    """distance=0.03: each job is phonopy's perfect supercell with one atom moved by
    0.03 Å.  Every other test used phonopy's own default (0.01 Å), so a distance not
    passed to generate_displacements went unseen."""
    kw = dict(supercell=2, min_width=0, mesh=[3, 3, 3], band_path=None)
    res = workflows.phonons([copper()], EMT(), distance=0.03, **kw)
    perfect = res.phonopy(0).supercell.positions
    jobs = [job.atoms for job in res.jobs.jobs]
    assert len(jobs) == res.to_pandas()["n_displacements"][0] > 0
    for atoms in jobs:
        moved = np.linalg.norm(atoms.positions - perfect, axis=1)
        assert np.count_nonzero(moved > 1e-9) == 1
        assert moved.max() == pytest.approx(0.03, abs=1e-9)


def test_a_material_whose_jobs_fail_leaves_the_others_rows_and_files(tmp_path):
    """Cu3Au's jobs fail in the model (no gold): its row has NaN and the reason, Cu and
    Al after it have their own values (phonopy's with ASE EMT), and write() saves files
    for those two only.  No phonon test had a failing material, so results shifted onto
    the wrong rows (or a file written for the failed one) went unseen."""
    materials = [copper(), cu3au(), aluminium()]
    kw = dict(min_width=0, mesh=[5, 5, 5], band_path=None, temperatures=[300.0])
    res = workflows.phonons(  # (Cu3Au in its own cell: "auto" with min_width=0)
        materials, ASECalculatorModel(NoGold), supercell={0: 2, 2: 2}, **kw
    )
    table = res.to_pandas()
    assert "no gold here" in table["error"][1] and np.isnan(table["free_energy_300K"][1])
    assert set(res.failed) == {1}
    for i in (0, 2):
        ref = ase_thermal(materials[i], [2, 2, 2], [5, 5, 5], [300.0])
        assert pd.isna(table["error"][i])
        assert table["free_energy_300K"][i] == pytest.approx(
            ref.free_energy[0] / 96.485332123, abs=1e-6
        )
    res.write(tmp_path)
    files = sorted(p.name.split(".")[0] for p in (tmp_path / "phonons").iterdir())
    assert set(files) == {"0_Cu", "2_Al"}
