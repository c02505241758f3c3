"""ASECalculatorModel: any ASE calculator as a model, checked against the calculator itself.

References are ASE's own EMT and LennardJones calculators run on the input
``ase.Atoms`` (energies, raw forces, stress), ASE's FIRE step for step in a fused plan,
and the fused run for a two-rank pipeline.  Float64 throughout: the adapter hands the
calculator float64 numpy arrays, so agreement is to round-off (measured: bitwise).
"""

from __future__ import annotations

import functools
import pickle

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.build import bulk, fcc111
from ase.calculators.emt import EMT as AseEMT
from ase.calculators.lj import LennardJones as AseLJ
from ase.cluster import Icosahedron, Octahedron
from ase.constraints import FixAtoms
from ase.optimize import FIRE as AseFIRE
from ase.stress import voigt_6_to_full_3x3_stress

import alchemi_lit as al
from alchemi_lit.core.errors import ConfigError, ModelError
from alchemi_lit.core.registry import get
from alchemi_lit.core.state import Batch
from alchemi_lit.integrators import FIRE, Langevin
from alchemi_lit.models import ASECalculatorModel
from conftest import AR_EPSILON, AR_SIGMA, perturbed_argon, random_triclinic_cell


def metals() -> list:
    """A triclinic rattled Cu crystal, an Au(111) slab (pbc T,T,F), a Pt cluster without
    a cell, and a Cu crystal with three fixed atoms."""
    rng = np.random.default_rng(5)
    cu = bulk("Cu", "fcc", a=3.61).repeat((2, 2, 2))
    cu.set_cell(cu.cell.array @ (np.eye(3) + 0.03 * rng.normal(size=(3, 3))), scale_atoms=True)
    slab = fcc111("Au", (2, 2, 3), vacuum=4.0)
    cluster = Octahedron("Pt", 3)
    cluster.set_cell(np.zeros((3, 3)))
    cluster.pbc = False
    fixed = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 1, 1))
    fixed.set_constraint(FixAtoms(indices=[0, 1, 2]))
    out = [cu, slab, cluster, fixed]
    for a in out:
        a.positions += rng.normal(scale=0.05, size=a.positions.shape)
    return out


def argon() -> list:
    rng = np.random.default_rng(6)
    out = perturbed_argon(2, 2, 0.1, seed=6)
    out[1].set_cell(random_triclinic_cell(rng, (7.5, 9.0), 0.2), scale_atoms=True)
    return out


def reference(atoms, calc) -> tuple[float, np.ndarray, np.ndarray]:
    """Energy, raw forces (constraints not applied) and 3x3 stress from ``calc``."""
    atoms = atoms.copy()
    atoms.calc = calc
    e = atoms.get_potential_energy()
    f = atoms.get_forces(apply_constraint=False)
    s = atoms.get_stress(voigt=False) if atoms.cell.rank == 3 else np.zeros((3, 3))
    return e, f, s


CASES = {
    "emt": (metals, lambda: ASECalculatorModel("ase.calculators.emt.EMT"), AseEMT),
    "lj": (
        argon,
        lambda: ASECalculatorModel(
            AseLJ, {"sigma": AR_SIGMA, "epsilon": AR_EPSILON, "rc": 6.0}, cutoff=6.0
        ),
        lambda: AseLJ(sigma=AR_SIGMA, epsilon=AR_EPSILON, rc=6.0),
    ),
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("case", list(CASES))
def test_equals_the_wrapped_calculator(case: str, dtype: torch.dtype) -> None:
    make_atoms, make_model, make_calc = CASES[case]
    atoms = make_atoms()
    batch = Batch.from_atoms(atoms, dtype=dtype)
    out = ASECalculatorModel.forward(make_model(), batch)
    assert {k: v.dtype for k, v in out.items()} == dict.fromkeys(out, dtype)
    # float32: positions are rounded to float32 on the way in (1e-7 relative)
    tol_e, tol_f, tol_s = (1e-6, 1e-5, 1e-7) if dtype == torch.float64 else (1e-4, 1e-3, 1e-5)
    ptr = batch.ptr.tolist()
    for b, a in enumerate(atoms):
        if dtype == torch.float32:  # the calculator sees what the batch holds
            a = a.copy()
            a.positions = a.positions.astype(np.float32)
        e, f, s = reference(a, make_calc())
        assert abs(float(out["energy"][b]) - e) / len(a) < tol_e, (b, float(out["energy"][b]), e)
        np.testing.assert_allclose(out["forces"][ptr[b] : ptr[b + 1]].double(), f, 0, tol_f)
        np.testing.assert_allclose(out["stress"][b].double(), s, 0, tol_s)
        if case == "emt" and b == 3:  # raw forces on fixed atoms: the loop zeroes them
            assert out["forces"][ptr[b] : ptr[b] + 3].abs().max() > 1e-3


def test_fire_in_a_fused_plan_matches_ase_step_for_step() -> None:
    from test_optimizers import compare_with_ase, run

    rng = np.random.default_rng(7)
    systems = [Icosahedron("Cu", 2), Octahedron("Au", 3)]
    for a in systems:
        a.set_cell(np.zeros((3, 3)))
        a.pbc = False
        a.positions += rng.normal(scale=0.08, size=a.positions.shape)
    res, rec = run(systems, FIRE(fmax=0.05, max_steps=40), ASECalculatorModel(AseEMT))
    assert int(res.steps.min()) >= 20
    compare_with_ase(systems, res, rec, lambda a: AseFIRE(a, logfile=None), AseEMT, 0.05, 40)


def test_fixed_atoms_stay_and_get_zero_forces() -> None:
    atoms = metals()[3]
    sim = al.Simulator(ASECalculatorModel(AseEMT), FIRE(fmax=0.05, max_steps=5), precision="64")
    res = sim.run([atoms])
    b = res.batch
    assert torch.equal(b.positions[:3], torch.as_tensor(atoms.positions[:3]))
    assert float(b.forces[:3].abs().max()) == 0.0
    assert float(b.forces[3:].abs().max()) > 1e-3


def test_two_rank_pipeline_equals_fused_run() -> None:
    from test_pipeline import assert_same

    rng = np.random.default_rng(8)
    systems = metals()[:2] + [bulk("Ag", "fcc", a=4.09).repeat((2, 2, 1)) for _ in range(2)]
    for a in systems[2:]:
        a.positions += rng.normal(scale=0.05, size=a.positions.shape)

    def stages():
        return FIRE(fmax=0.05, max_steps=8), Langevin(
            dt=2.0, temperature=300.0, friction=0.02, steps=4
        )

    relax, md = stages()
    fused = al.Simulator(ASECalculatorModel(AseEMT), relax + md, sync_every=2, precision="64").run(
        systems
    )
    relax, md = stages()
    piped = al.Simulator(
        ASECalculatorModel(AseEMT),
        relax | md,
        devices=2,
        strategy="pipeline",
        start_method="fork",
        sync_every=2,
        timeout=60.0,
        precision="64",
    ).run(systems)
    assert_same(piped.batch, fused.batch)


def test_per_system_calculators_are_kept_while_in_flight() -> None:
    atoms = metals()
    shared = ASECalculatorModel(AseEMT)
    own = ASECalculatorModel(AseEMT, per_system=True)
    batch = Batch.from_atoms(atoms)
    a, b = shared(batch), own(batch)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)
    assert len(shared._calcs) == 1 and len(own._calcs) == len(atoms)
    first = own._calcs[0][0]
    own(batch)
    assert own._calcs[0][0] is first  # the same calculator, its state kept
    for _ in range(10):  # only system 1 stays: the others' calculators are released
        own(batch.select([1]))
    assert set(own._calcs) == {1}


def test_pickles_without_its_calculators() -> None:
    model = ASECalculatorModel(functools.partial(AseLJ, sigma=AR_SIGMA, epsilon=AR_EPSILON))
    batch = Batch.from_atoms(argon())
    before = model(batch)
    copy = pickle.loads(pickle.dumps(model))  # what a spawned pipeline rank receives
    assert copy._calcs == {} and len(model._calcs) == 1
    after = copy(batch)
    torch.testing.assert_close(after["forces"], before["forces"], rtol=0, atol=0)


def test_registered_and_configurable_by_dotted_path() -> None:
    assert get("model", "ASECalculatorModel").cls is ASECalculatorModel
    model = ASECalculatorModel("ase.calculators.lj.LennardJones", {"sigma": 2.0, "rc": 5.0})
    calc = model.factory()
    assert isinstance(calc, AseLJ) and calc.parameters.sigma == 2.0
    assert "slow path" in model.summary_note and "LennardJones" in model.summary_note


class _NoStress(AseLJ):
    implemented_properties = ("energy", "forces")


@pytest.mark.parametrize(
    ("calculator", "error", "words"),
    [
        (AseEMT(), ConfigError, "instance"),
        ("ase.calculators.emt.NoSuchThing", ConfigError, "cannot import"),
        ("EMT", ConfigError, "dotted import path"),
        (42, ConfigError, "class, a factory"),
    ],
)
def test_bad_calculator_is_named(calculator, error, words) -> None:
    with pytest.raises(error, match=words):
        ASECalculatorModel(calculator)


def test_missing_property_is_named_with_the_fix() -> None:
    batch = Batch.from_atoms(argon())
    model = ASECalculatorModel(_NoStress)
    with pytest.raises(ModelError, match=r"does not implement stress.*compute_stress=False"):
        model(batch)
    out = ASECalculatorModel(_NoStress, compute_stress=False)(batch)  # no stress asked
    assert "stress" not in out and torch.isfinite(out["forces"]).all()


def test_a_failing_system_is_named_and_quarantined() -> None:
    """EMT has no parameters for Fe: that system fails, the others run (the loop
    isolates it and records the calculator's error)."""
    good = metals()[0]
    bad = bulk("Fe", "bcc", a=2.87).repeat((2, 2, 2))
    with pytest.raises(ModelError, match="failed on system 1"):
        ASECalculatorModel(AseEMT)(Batch.from_atoms([good, bad]))
    sim = al.Simulator(ASECalculatorModel(AseEMT), FIRE(fmax=0.05, max_steps=3), precision="64")
    res = sim.run([good, bad])
    assert res.batch.exit_code.tolist() == [2, 5]  # max_steps, model_error
    # one calculator shared by the systems: the one that failed on Fe is not reused
    shared = ASECalculatorModel(AseEMT, per_system=False)
    res = al.Simulator(shared, FIRE(fmax=0.05, max_steps=3), precision="64").run(
        [good, bad, good.copy()]
    )
    assert res.batch.exit_code.tolist() == [2, 5, 2]


def test_run_summary_says_slow_path(tmp_path, monkeypatch, capsys) -> None:
    """The CLI summary (table and JSON) and the Logger's run-end line name the slow path."""
    import json
    from pathlib import Path

    from loguru import logger

    from alchemi_lit.cli import main

    config = Path(__file__).resolve().parents[2] / "configs" / "ase_calculator_relax.yaml"
    monkeypatch.chdir(tmp_path)
    lines: list[str] = []
    sink = logger.add(lines.append, format="{message}")
    try:
        args = ["--data.index", ":1", "--simulator.stages.0.init_args.max_steps", "2"]
        args += ["--simulator.sinks.0.init_args.store", str(tmp_path / "r.zarr")]
        assert main(["run", "--config", str(config), *args, "--output.dir", "out"]) == 0
    finally:
        logger.remove(sink)
    out = capsys.readouterr().out
    assert "slow path: ASE calculator EMT" in out
    summary = json.loads((tmp_path / "out" / "r.summary.json").read_text())
    assert summary["model_note"].startswith("slow path")
    assert any("run end" in line and "slow path" in line for line in lines)


def test_ase_stress_convention_is_ours() -> None:
    """ASE's Voigt stress, through the adapter, equals the edge-virial stress of the
    built-in EMT (itself checked against ASE's EMT) on a strained triclinic crystal:
    same sign convention, same component order."""
    from alchemi_lit.models import EMT

    batch = Batch.from_atoms(metals()[:2])
    ours = EMT()(batch)["stress"]
    theirs = ASECalculatorModel(AseEMT)(batch)["stress"]
    assert float(ours[0].abs().max()) > 1e-3  # strained: a real stress to compare
    torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-9)


def test_a_system_skipping_a_few_calls_keeps_its_calculator() -> None:
    """A system still in flight may sit out some evaluations (the step loop evaluates
    only the systems that need it); its calculator -- a DFT code's wavefunctions --
    is kept for up to 8 calls without it, and released after more."""
    own = ASECalculatorModel(AseEMT, per_system=True)
    batch = Batch.from_atoms(metals()[:2])
    own(batch)
    first = own._calcs[0][0]
    for _ in range(8):
        own(batch.select([1]))
    own(batch)
    assert own._calcs[0][0] is first
    for _ in range(9):
        own(batch.select([1]))
    assert 0 not in own._calcs


def test_molecules_get_zero_stress_from_a_calculator_without_stress() -> None:
    """Systems without a 3-D cell get zero stress without asking the calculator, so one
    that implements no stress serves a run of molecules that asks for it; its forces
    are ASE's LennardJones's."""
    molecule = Atoms("Ar3", positions=[[0, 0, 0], [3.7, 0, 0], [0.4, 3.6, 0]])
    out = ASECalculatorModel(_NoStress)(Batch.from_atoms([molecule], dtype=torch.float64))
    assert torch.equal(out["stress"], torch.zeros(1, 3, 3, dtype=torch.float64))
    ref = molecule.copy()
    ref.calc = AseLJ()
    np.testing.assert_allclose(out["forces"].numpy(), ref.get_forces(), rtol=0, atol=1e-12)


#: (info, initial magnetic moments, masses) of each Atoms a _Recording calculator saw
_SEEN: list = []


class _Recording(AseLJ):
    """ASE's LJ that records what the Atoms it is handed carries."""

    def calculate(self, atoms=None, properties=None, system_changes=None):
        _SEEN.append((dict(atoms.info), atoms.get_initial_magnetic_moments(), atoms.get_masses()))
        super().calculate(atoms, properties or ["energy"], system_changes or ["positions"])


def test_the_calculator_sees_the_structures_own_info_arrays_and_masses() -> None:
    """The Atoms handed to the calculator carries the structure's ``info``, extra
    arrays (charge, spin, initial magnetic moments: what a DFT calculator reads) and
    masses (an isotope: what a calculator with nuclear quantum or vibrational terms
    reads), and none of alchemi_lit's bookkeeping entries."""
    atoms = Atoms("Ar2", positions=[[0, 0, 0], [3.8, 0, 0]])
    atoms.info.update(charge=1, note="dimer")
    atoms.set_initial_magnetic_moments([0.5, -0.5])
    atoms.set_masses([39.948, 36.0])
    _SEEN.clear()
    ASECalculatorModel(_Recording)(Batch.from_atoms([atoms], dtype=torch.float64))
    info, magmoms, masses = _SEEN[-1]
    assert info == {"charge": 1, "note": "dimer"}
    np.testing.assert_array_equal(magmoms, [0.5, -0.5])
    np.testing.assert_allclose(masses, [39.948, 36.0], rtol=1e-15)


class _FullStress(AseLJ):
    """ASE's LJ reporting its stress as a 3x3 matrix (as some MLIP calculators do),
    made non-symmetric by a fixed term so that a transposition shows."""

    def calculate(self, atoms=None, properties=None, system_changes=None):
        super().calculate(atoms, properties, system_changes)
        self.results["stress"] = voigt_6_to_full_3x3_stress(self.results["stress"]) + _SKEW


_SKEW = np.array([[0.0, 1e-3, 0.0], [0.0, 0.0, -2e-3], [0.0, 0.0, 0.0]])


def test_a_3x3_stress_from_the_calculator_is_taken_as_it_is() -> None:
    """Calculators may give the stress as a 3x3 matrix rather than in Voigt order: it is
    taken in the same index order (ASE's ``voigt_6_to_full_3x3_stress`` of the Voigt
    stress, plus the calculator's own non-symmetric term)."""
    atoms = argon()[1]
    out = ASECalculatorModel(_FullStress)(Batch.from_atoms([atoms], dtype=torch.float64))
    ref = atoms.copy()
    ref.calc = AseLJ()
    want = ref.get_stress(voigt=False) + _SKEW
    np.testing.assert_allclose(out["stress"][0].numpy(), want, rtol=0, atol=1e-15)
