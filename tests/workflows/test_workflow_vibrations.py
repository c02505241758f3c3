"""workflows.vibrations against ASE's own Vibrations and thermochemistry driven by ASE's
EMT calculator on the same geometries (the workflow's relaxed ones)."""

from __future__ import annotations

import numpy as np
import pytest
from ase.build import add_adsorbate, fcc100, molecule
from ase.calculators.emt import EMT as AseEMT
from ase.thermochemistry import HarmonicThermo, IdealGasThermo
from ase.units import Pascal
from ase.vibrations import Vibrations, VibrationsData

from alchemi_lit import workflows
from alchemi_lit.core.errors import ConfigError, StructureError
from alchemi_lit.models import EMT, LennardJones

#: H2O, NH3, CH4 and O in the hollow of Cu(100) (EMT has H, C, N, O parameters)
NAMES = ("H2O", "NH3", "CH4")
TEMPS, PRESSURES = (298.15, 500.0), (1e5, 2e5)


def systems():
    slab = fcc100("Cu", (2, 2, 2), vacuum=6.0)
    add_adsorbate(slab, "O", 1.6, "hollow")
    return [molecule(n) for n in NAMES] + [slab]


def ase_vibrations(atoms, tmp_path, name, nfree, indices=None):
    atoms = atoms.copy()
    atoms.calc = AseEMT()
    vib = Vibrations(atoms, name=str(tmp_path / name), indices=indices, nfree=nfree)
    vib.run()
    return atoms, vib


@pytest.fixture(scope="module")
def computed():
    ads = {3: [len(systems()[3]) - 1]}
    res = workflows.vibrations(
        systems(), EMT(), indices=ads, nfree=4, relax=True, temperatures=TEMPS,
        pressures=PRESSURES, precision="64",
    )  # fmt: skip
    return res, ads


def test_frequencies_match_ase_vibrations(computed, tmp_path):
    res, ads = computed
    table = res.to_pandas()
    for i, atoms in enumerate(res.structures):
        _, vib = ase_vibrations(atoms, tmp_path, f"v{i}", 4, ads.get(i))
        # forces agree with ASE's to ~1e-14 eV/Å; frequencies of the true vibrations to
        # far below the 0.1 cm^-1 asked (near-zero rotations amplify differences as 1/f)
        theirs, mine = vib.get_frequencies(), res.frequencies(i)
        real = np.abs(theirs) > 50.0
        np.testing.assert_allclose(mine[real], theirs[real], rtol=0, atol=0.1)
        assert isinstance(res.vibrations_data(i), VibrationsData)
        assert table["zpe_eV"][i] == pytest.approx(vib.get_zero_point_energy(), abs=1e-6)
        assert table["max_force_eV_A"][i] < 0.0105  # relaxed first (FIRE to 0.01 eV/Å)
    assert table["n_modes"].tolist() == [9, 12, 15, 3]
    modes = res.frequency_table()
    assert len(modes) == table["n_modes"].sum()
    from ase.units import invcm

    real = modes[~modes["imaginary"]]
    np.testing.assert_allclose(real["energy_meV"], real["frequency_cm1"] * invcm * 1000, rtol=1e-12)
    assert (modes[modes["imaginary"]]["frequency_cm1"] < 0).all()  # imaginary: negative
    np.testing.assert_allclose(res.energies_meV(0), res.frequencies(0) * invcm * 1000, rtol=1e-12)
    w, m = np.linalg.eigvalsh(res.mass_weighted_hessian(0)), res.normal_modes(0)
    assert m.shape == (9, 3, 3) and np.all(np.diff(w) >= 0)


def test_thermochemistry_matches_ase(computed, tmp_path):
    res, ads = computed
    thermo = res.thermo()
    for i in (0, 1):  # H2O (sigma 2), NH3 (sigma 3), nonlinear singlets
        atoms, vib = ase_vibrations(res.structures[i], tmp_path, f"t{i}", 4)
        ref = IdealGasThermo(vib.get_energies(), "nonlinear", atoms.get_potential_energy(),
                             atoms, symmetrynumber=(2, 3)[i], spin=0)  # fmt: skip
        for t in TEMPS:
            for p in PRESSURES:
                row = thermo.query(f"material == {i} and temperature_K == {t} and "
                                   f"pressure_Pa == {p}").iloc[0]  # fmt: skip
                g = ref.get_gibbs_energy(t, p * Pascal, verbose=False)
                assert row["gibbs_energy_eV"] == pytest.approx(g, abs=1e-4)
                assert row["enthalpy_eV"] == pytest.approx(ref.get_enthalpy(t, False), abs=1e-4)
    # EMT's CH4 relaxed from the symmetric start is a saddle: ASE refuses, named, kept
    ch4 = thermo[thermo["material"] == 2]
    assert ch4["gibbs_energy_eV"].isna().all() and ch4["error"].str.contains("Imaginary").all()
    assert res.to_pandas()["n_imaginary"][2] > 0 and res.errors[2] is None
    atoms, vib = ase_vibrations(res.structures[3], tmp_path, "ads", 4, ads[3])
    ref = HarmonicThermo(vib.get_energies(), atoms.get_potential_energy())
    row = thermo.query("material == 3 and temperature_K == 298.15").iloc[0]
    assert row["thermo"] == "harmonic"
    f = ref.get_helmholtz_energy(298.15, verbose=False)
    assert row["gibbs_energy_eV"] == pytest.approx(f, abs=1e-4)


def test_a_batch_equals_each_system_alone():
    mols = [molecule(n) for n in ("H2O", "NH3", "CO2")]
    together = workflows.vibrations(mols, EMT(), thermo=None, precision="64")
    for i, m in enumerate(mols):
        alone = workflows.vibrations([m], EMT(), thermo=None, precision="64")
        assert np.array_equal(alone.hessian(0), together.hessian(i))
    assert together.jobs.results.stats["forward_calls"] == 1


@pytest.mark.slow
def test_fifty_molecules_in_one_batch_equal_each_alone():
    from ase.collections import g2

    names = [n for n in g2.names if set(g2[n].get_chemical_symbols()) <= set("HCNO")
             and len(g2[n]) >= 2][:50]  # fmt: skip
    mols = [g2[n] for n in names]
    together = workflows.vibrations(mols, EMT(), thermo=None, precision="64")
    for i, m in enumerate(mols):
        alone = workflows.vibrations([m], EMT(), thermo=None, precision="64")
        assert np.array_equal(alone.hessian(0), together.hessian(i)), names[i]


def test_analytic_hessian_matches_finite_differences(computed):
    res, ads = computed
    an = workflows.vibrations(res.structures, EMT(), indices=ads, hessian="analytic",
                              thermo=None, precision="64")  # fmt: skip
    assert an.jobs.results.stats["forward_calls"] == 1  # the reference geometries only
    for i in range(len(res)):
        # nfree=4 at delta=0.01 Å: truncation ~delta^4 |d^6 E| / 30, far below 1e-3 eV/Å^2
        np.testing.assert_allclose(an.hessian(i), res.hessian(i), rtol=0, atol=1e-3)
    with pytest.raises(ConfigError, match="LennardJones computes its forces itself"):
        workflows.vibrations([molecule("H2O")], LennardJones(), hessian="analytic")


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"delta": 0.0}, ConfigError, "delta is a displacement"),
        ({"nfree": 3}, ConfigError, "nfree must be 2 or 4"),
        ({"temperatures": [-1.0]}, ConfigError, "must be >= 0"),
        ({"geometry": "planar"}, ConfigError, r"structure 0 \(H2O\): geometry must be"),
        ({"indices": {0: [5]}}, ConfigError, r"structure 0 \(H2O\): indices"),
        ({"symmetry_number": 0}, ConfigError, "symmetry_number must be"),
    ],
)
def test_bad_input_is_refused_before_the_run(kwargs, error, match):
    with pytest.raises(error, match=match):
        workflows.vibrations([molecule("H2O")], EMT(), **kwargs)


def test_a_single_atom_is_refused_naming_it():
    from ase import Atoms

    with pytest.raises(StructureError, match=r"structure 1 \(O\) has 1 atom"):
        workflows.vibrations([molecule("H2O"), Atoms("O")], EMT())


def test_unrelaxed_reference_warns():
    from loguru import logger

    seen = []
    sink = logger.add(lambda m: seen.append(str(m)), level="WARNING")
    try:
        workflows.vibrations([molecule("H2O")], EMT(), thermo=None)
    finally:
        logger.remove(sink)
    assert any("exceed 0.05 eV/Å" in s and "H2O" in s for s in seen)


def test_auto_thermo_options_and_an_unconverged_relaxation_named():
    from ase import Atoms

    from alchemi_lit.integrators import FIRE

    ch3o = molecule("CH3O")  # a radical, without the magnetic moments g2 gives it
    mols = [molecule("CO2"), molecule("CH4"), Atoms(ch3o.numbers, ch3o.positions)]
    res = workflows.vibrations(mols, EMT(), relax=FIRE(fmax=1e-6, max_steps=2), spin={2: 0.5},
                               temperatures=[300])  # fmt: skip
    # pymatgen's point groups: D_inf_h CO2 (sigma 2, linear), T_d CH4 (12), C_3v CH3O (3)
    assert res.settings["thermo"] == [["ideal_gas", "linear", 2, 0.0],
                                      ["ideal_gas", "nonlinear", 12, 0.0],
                                      ["ideal_gas", "nonlinear", 3, 0.5]]  # fmt: skip
    assert all("did not converge" in e for e in res.errors)  # named, nothing run for them
    assert [j.label for j in res.jobs.jobs] == ["0:relax", "1:relax", "2:relax"]  # no more
