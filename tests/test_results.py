"""Results: one answer from ``sim.run``, ``ZarrSink.read`` and ``read_results``; its
table (checked against ASE's own calculator), its files (round trips through ase.io),
and runs that continue from a results store as one fused run would, noise included."""

from __future__ import annotations

from pathlib import Path

import ase.io
import numpy as np
import pandas as pd
import pytest
import torch
import zarr
from ase import Atoms
from ase.build import bulk
from ase.calculators.emt import EMT as AseEMT
from ase.constraints import FixAtoms
from ase.units import GPa

import alchemi_lit as al
from alchemi_lit import kernels
from alchemi_lit.core.errors import ConfigError, StructureWarning
from alchemi_lit.data import SizeAwareSampler, argon_crystals, read_structures
from alchemi_lit.integrators import FIRE, Langevin
from alchemi_lit.io.results import COLUMNS
from alchemi_lit.io.results_store import ATOM_COLUMNS, SYSTEM_COLUMNS
from alchemi_lit.models import EMT, LennardJones
from alchemi_lit.sinks import HostMemory, ZarrSink, read_results


def lj() -> LennardJones:
    return LennardJones(0.0104, 3.40, 6.0)


def argon(n: int = 3) -> list[Atoms]:
    out = argon_crystals(n_systems=n, repeat=1, seed=1)
    for k, atoms in enumerate(out):
        atoms.info["label"] = f"crystal {k}"
    return out


def relax() -> FIRE:
    return FIRE(fmax=0.05, max_steps=6)


def md() -> Langevin:
    return Langevin(dt=2.0, temperature=60.0, friction=0.05, steps=5)


# ---------------------------------------------------------------------- one answer
def test_run_sink_and_reader_give_the_same_results(tmp_path: Path) -> None:
    store = tmp_path / "r.zarr"

    def run(sink: object) -> al.Results:
        return al.Simulator(
            model=lj(), stages=relax() + md(), sinks=[sink], seed=2, stress=True
        ).run(argon())

    ran = run(HostMemory())
    answers = {
        "sim.run (store)": run(ZarrSink(store)),  # no memory sink: the Results read the store
        "ZarrSink.read": ZarrSink(store).read(),
        "read_results": read_results(store),
        "read_results(run=-1)": read_results(store, run=-1),
    }
    want = ran.to_pandas()
    assert list(want["steps[0:FIRE]"]) == ran.stage_steps[:, 0].tolist()
    for name, res in answers.items():
        assert isinstance(res, al.Results), name
        pd.testing.assert_frame_equal(res.to_pandas(), want, check_exact=True, obj=name)
        for column in SYSTEM_COLUMNS:
            assert torch.equal(res.batch.system[column], ran.batch.system[column]), (name, column)
        for column in ATOM_COLUMNS:
            assert torch.equal(res.batch.atom[column], ran.batch.atom[column]), (name, column)
        got, ref = res.to_atoms(), ran.to_atoms()
        assert [a.info for a in got] == [a.info for a in ref], name
        assert all(a.info["label"] == f"crystal {k}" for k, a in enumerate(got))
    assert read_results(store).stats == ZarrSink(store).read().stats
    assert read_results(store).stats["systems"] == len(ran) == 3


def test_results_are_a_read_only_sequence_of_atoms(tmp_path: Path) -> None:
    res = al.Simulator(model=lj(), stages=relax()).run(argon())
    assert len(res) == 3 and res[0] is res[0]  # made once, as a list's items
    assert [a.info["system_id"] for a in res] == [0, 1, 2]
    assert [a.info["system_id"] for a in res[1:]] == [1, 2] == [res[-2].info["system_id"], 2]
    assert res[2].get_potential_energy() == pytest.approx(float(res.energy[2]), abs=0)
    assert res.to_atoms()[0] is not res[0]  # to_atoms: a new list to change freely
    with pytest.raises(TypeError, match="integers or slices"):
        res["energy"]
    with pytest.raises(IndexError):
        res[3]
    empty = ZarrSink(tmp_path / "e.zarr", flush_every=10)
    empty.open({})
    assert len(read_results(tmp_path / "e.zarr")) == 0 and list(empty.read()) == []
    table = read_results(tmp_path / "e.zarr").to_pandas()
    assert table.empty and list(table.columns) == list(COLUMNS)
    with pytest.raises(ValueError, match="no systems to write"):
        read_results(tmp_path / "e.zarr").write(tmp_path / "e.extxyz")


# ---------------------------------------------------------------------- the table
def emt_systems(tmp_path: Path) -> list[Atoms]:
    """An alloy crystal from a file (source_file), a crystal with a fixed atom bearing the
    largest force, a cluster (no cell) and a slab (not periodic along z)."""
    rng = np.random.default_rng(5)
    alloy = bulk("Cu", cubic=True).repeat((2, 1, 1))
    alloy.numbers[[1, 6]] = 79  # Au
    alloy.positions += rng.normal(scale=0.05, size=alloy.positions.shape)
    ase.io.write(tmp_path / "alloy.cif", alloy)
    (from_file,) = read_structures(tmp_path / "*.cif")
    fixed = bulk("Ni", cubic=True)
    fixed.positions += rng.normal(scale=0.08, size=fixed.positions.shape)
    probe = fixed.copy()
    probe.calc = AseEMT()
    fixed.set_constraint(FixAtoms([int(np.linalg.norm(probe.get_forces(), axis=1).argmax())]))
    cluster = Atoms("Cu3Ni", positions=[[0, 0, 0], [2.5, 0, 0], [0, 2.5, 0], [1.3, 1.3, 2.0]])
    slab = bulk("Cu", cubic=True)
    slab.center(vacuum=4.0, axis=2)
    slab.pbc = (True, True, False)
    slab.positions += rng.normal(scale=0.05, size=slab.positions.shape)
    return [from_file, fixed, cluster, slab]


def test_to_pandas_against_ase(tmp_path: Path) -> None:
    """Every column from ASE's own EMT calculator on the result structures."""
    structures = emt_systems(tmp_path)
    res = al.Simulator(model=EMT(), stages=FIRE(fmax=1e-3, max_steps=3), stress=True).run(
        structures
    )
    table = res.to_pandas()
    assert list(table.columns) == [
        *COLUMNS,
        *("steps[0:FIRE]", "exit_reason[0:FIRE]", "energy[0:FIRE]"),
    ]
    assert table["system_id"].tolist() == [0, 1, 2, 3]
    for row, atoms in zip(table.itertuples(index=False), res):
        ref = atoms.copy()  # (a copy keeps the constraint, drops the stored results)
        ref.calc = AseEMT()
        assert row.formula == ref.get_chemical_formula()
        assert row.n_atoms == len(ref)
        assert row.energy == pytest.approx(ref.get_potential_energy(), rel=1e-10, abs=1e-10)
        assert row.energy_per_atom == pytest.approx(row.energy / len(ref), rel=1e-14)
        fmax = np.linalg.norm(ref.get_forces(), axis=1).max()  # constraint applied
        assert row.fmax == pytest.approx(fmax, rel=1e-8, abs=1e-10)
        assert row.steps == 3 and row.exit_reason == "max_steps" and not row.converged
        if ref.pbc.all():
            assert row.volume == pytest.approx(ref.get_volume(), rel=1e-12)
            pressure = -np.trace(ref.get_stress(voigt=False)) / 3 / GPa
            assert row.pressure == pytest.approx(pressure, rel=1e-8, abs=1e-9)
        else:  # a cluster, a slab: no volume, no pressure
            assert np.isnan(row.volume) and np.isnan(row.pressure)
    unfixed = structures[1].copy()
    del unfixed.constraints
    unfixed.positions = res[1].positions
    unfixed.calc = AseEMT()
    assert np.linalg.norm(unfixed.get_forces(), axis=1).max() > table["fmax"][1] * 1.01
    assert Path(table["source_file"][0]).name == "alloy.cif"
    assert table["source_file"][1:].isna().all()
    assert table["formula"].tolist() == ["Au2Cu6", "Ni4", "Cu3Ni", "Cu4"]


def test_fmax_leaves_out_fixed_atoms_whatever_their_force(tmp_path: Path) -> None:
    """A batch evaluated outside a run holds the model's force on a fixed atom too."""
    fixed = emt_systems(tmp_path)[1]
    batch = al.Batch.from_atoms([fixed])
    out = EMT()(batch)
    batch.energy, batch.forces = out["energy"], out["forces"]
    assert float(batch.forces[fixed.constraints[0].index].norm()) > 0
    ref = fixed.copy()
    ref.calc = AseEMT()
    fmax = np.linalg.norm(ref.get_forces(), axis=1).max()  # constraint applied
    assert al.Results(batch).to_pandas()["fmax"][0] == pytest.approx(fmax, rel=1e-8)


def test_formulas_and_unevaluated_systems() -> None:
    """Hill order (C, H first when there is carbon), one formula per composition; a
    system no model evaluated has NaN energy, fmax and pressure."""
    atoms = [
        Atoms("OCH4", positions=np.arange(18.0).reshape(6, 3) * 1.1),
        Atoms("NaClNa", positions=np.arange(9.0).reshape(3, 3) * 1.5),
        Atoms("HHe", positions=[[0, 0, 0], [1.2, 0, 0]], cell=[5, 5, 5], pbc=True),
    ]
    table = al.Results(al.Batch.from_atoms(atoms)).to_pandas()
    assert table["formula"].tolist() == [a.get_chemical_formula() for a in atoms]
    assert table["formula"].tolist() == ["CH4O", "ClNa2", "HHe"]
    assert table[["energy", "fmax", "pressure"]].isna().all().all()
    assert table["volume"].tolist()[2] == pytest.approx(125.0)


def test_rows_follow_system_id_whatever_the_batch_order() -> None:
    """A batch whose rows are not in id order: the table, the tensors and the atoms all
    give each system_id its own formula, size, energy and source file."""
    atoms = [
        Atoms("NaCl", positions=[[0, 0, 0], [2.4, 0, 0]]),
        bulk("Cu", cubic=True),
        Atoms("H2O", positions=[[0, 0, 0], [0.96, 0, 0], [-0.24, 0.93, 0]]),
    ]
    for k, a in enumerate(atoms):
        a.info["source_file"] = f"file{k}.xyz"
    batch = al.Batch.from_atoms(atoms, system_ids=[12, 10, 11])  # ids are not rows
    batch.energy = torch.tensor([-2.0, -4.0, -1.0], dtype=torch.float64)
    res = al.Results(batch)
    table = res.to_pandas()
    by_id = [1, 2, 0]  # input position of system_id 10, 11, 12
    assert table["system_id"].tolist() == res.system_id.tolist() == [10, 11, 12]
    assert table["formula"].tolist() == [atoms[k].get_chemical_formula() for k in by_id]
    assert table["n_atoms"].tolist() == res.n_atoms.tolist() == [len(atoms[k]) for k in by_id]
    assert table["energy"].tolist() == res.energy.tolist() == [-4.0, -1.0, -2.0]
    assert table["source_file"].tolist() == [f"file{k}.xyz" for k in by_id]
    for a, k in zip(res, by_id):
        assert a.get_chemical_formula() == atoms[k].get_chemical_formula()
        assert a.info["source_file"] == f"file{k}.xyz"


# ---------------------------------------------------------------------- files
@pytest.mark.parametrize("name", ["r.extxyz", "r.traj"])
def test_write_round_trips_through_ase(tmp_path: Path, name: str) -> None:
    structures = emt_systems(tmp_path)
    res = al.Simulator(model=EMT(), stages=FIRE(fmax=1e-3, max_steps=3) + md(), stress=True).run(
        structures
    )
    res.write(tmp_path / name)
    back = ase.io.read(tmp_path / name, ":")
    tol = 1e-8 if name.endswith("extxyz") else 0.0  # extxyz: 8 decimals
    assert len(back) == len(res)
    for got, want in zip(back, res):
        np.testing.assert_allclose(got.positions, want.positions, rtol=0, atol=tol)
        np.testing.assert_allclose(got.get_momenta(), want.get_momenta(), rtol=tol, atol=tol)
        np.testing.assert_array_equal(got.cell.array, want.cell.array)
        np.testing.assert_array_equal(got.pbc, want.pbc)
        np.testing.assert_array_equal(got.numbers, want.numbers)
        assert got.get_potential_energy() == pytest.approx(want.get_potential_energy(), rel=1e-12)
        np.testing.assert_allclose(got.get_forces(), want.get_forces(), rtol=0, atol=tol)
        if want.pbc.all():
            np.testing.assert_allclose(got.get_stress(), want.get_stress(), rtol=0, atol=tol)
        for key in ("system_id", "steps", "converged", "exit_reason", "status"):
            assert got.info[key] == want.info[key], key
        np.testing.assert_array_equal(got.info["stage_energy"], want.info["stage_energy"])
        assert got.info.get("source_file") == want.info.get("source_file")
    with pytest.raises(ValueError, match="one structure per file, and these Results hold 4"):
        res.write(tmp_path / "POSCAR", format="vasp")
    al.Results(res.batch.select(torch.tensor([0]))).write(tmp_path / "POSCAR", format="vasp")
    assert ase.io.read(tmp_path / "POSCAR").get_chemical_formula() == "Au2Cu6"
    # a file of results is a structure source that goes on counting steps
    assert al.Batch.from_atoms(back).total_steps.tolist() == res.steps.tolist() == [8] * 4


# ---------------------------------------------------------------------- continuing
@pytest.mark.parametrize("source", ["path", "sampler", "structures", "torch path"])
def test_relax_then_md_from_its_store_is_the_fused_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str
) -> None:
    """Relax into a store, then run Langevin from it: bit for bit the fused relax + MD
    run, noise included -- the noise is keyed on each system's step count, which the
    store keeps (info["steps"]) and the second run continues from."""
    if source == "torch path":
        monkeypatch.setattr(kernels, "ENABLED", False)
    data = argon(4)
    data[3] = argon_crystals(n_systems=1, repeat=2, seed=9)[0]  # 32 atoms: converges later
    fused = al.Simulator(model=lj(), stages=relax() + md(), seed=3).run(data)
    store = tmp_path / "relaxed.zarr"
    al.Simulator(model=lj(), stages=relax(), seed=3, sinks=[ZarrSink(store)]).run(data)
    inputs = {
        "path": store,
        "sampler": SizeAwareSampler(store, max_atoms=40),
        "structures": read_structures(store),
        "torch path": store,
    }
    split = al.Simulator(model=lj(), stages=md(), seed=3).run(inputs[source])
    assert len(set(fused.stage_steps[:, 0].tolist())) > 1  # systems left FIRE at different steps
    assert torch.equal(split.steps, fused.steps)
    assert torch.equal(split.batch.positions, fused.batch.positions)
    assert torch.equal(split.batch.velocities, fused.batch.velocities)
    assert torch.equal(split.energy, fused.energy)


def test_only_an_earlier_result_carries_its_step_count() -> None:
    """A new structure starts at step 0, also with a ``steps`` key of its own (kept as
    ``input_steps`` in the results); a result fed back in goes on from its steps."""
    plain, labelled = argon(2)
    labelled.info["steps"] = 7  # the user's own meaning
    assert al.Batch.from_atoms([plain, labelled]).total_steps.tolist() == [0, 0]
    sim = al.Simulator(model=lj(), stages=md(), seed=1)
    first = sim.run([plain, labelled])
    with pytest.warns(StructureWarning, match="input_steps"):
        assert first[1].info["input_steps"] == 7 and first[1].info["steps"] == 5
    again = sim.run(list(first))  # (the atoms already made: no second warning)
    assert again.steps.tolist() == [10, 10]
    assert again[1].info["input_steps"] == 7
    restart = first[0].copy()
    del restart.info["steps"]  # to start the count anew
    assert al.Batch.from_atoms([restart]).total_steps.tolist() == [0]


# ---------------------------------------------------------------------- stores of several runs
def test_stats_of_a_store_several_runs_wrote_are_each_runs_own(tmp_path: Path) -> None:
    """Read whole, a store two runs wrote has no single run's stats (``{}``: the numbers
    of one run would pass for all the systems); read run by run, each has its own; a
    run index past either end is refused by name."""
    store = tmp_path / "r.zarr"
    for k, mode in enumerate(("w-", "a")):
        sampler = SizeAwareSampler(argon(1), max_atoms=40, system_ids=[k])
        al.Simulator(model=lj(), stages=relax(), sinks=[ZarrSink(store, mode=mode)]).run(sampler)
    runs = zarr.open_group(str(store), mode="r").attrs["runs"]
    assert read_results(store).stats == {} and len(read_results(store)) == 2
    for k in (0, 1):
        assert read_results(store, run=k).stats == runs[k]["stats"]
        assert read_results(store, run=k).system_id.tolist() == [k]
    assert read_results(store, run=-2).system_id.tolist() == [0]
    for run in (2, -3):  # no such run: said so, not an IndexError
        with pytest.raises(ConfigError, match=rf"written by 2 run\(s\); run={run} does not exist"):
            read_results(store, run=run)


def test_results_holding_every_system_say_nothing_went_elsewhere(tmp_path: Path) -> None:
    """The repr names the sinks the other systems went to only when there are others."""
    res = al.Simulator(model=lj(), stages=relax()).run(argon(2))
    sinks = [HostMemory(), ZarrSink(tmp_path / "r.zarr")]
    assert "later sinks" not in repr(al.Results(res.batch, {"systems": 2}, sinks))
    fewer = repr(al.Results(res.batch, {"systems": 3}, sinks))
    assert "of 3; the other 1 went to later sinks in" in fewer and "r.zarr" in fewer


def test_per_stage_columns_are_each_stages_own(tmp_path: Path) -> None:
    """Relax then MD: the FIRE columns of the table give what a relax-only run of the
    same structures gives (steps, exit reason), the Langevin ones its 5 steps and
    'completed'; the stage steps add up to the system's steps."""
    data = argon(3)
    data[2] = argon_crystals(n_systems=1, repeat=2, seed=9)[0]  # 32 atoms: converges later
    fire = FIRE(fmax=0.05, max_steps=8)
    table = al.Simulator(model=lj(), stages=fire + md(), seed=2).run(data).to_pandas()
    alone = al.Simulator(model=lj(), stages=FIRE(fmax=0.05, max_steps=8)).run(data).to_pandas()
    assert table["exit_reason[0:FIRE]"].tolist() == alone["exit_reason"].tolist()
    assert set(alone["exit_reason"]) == {"converged", "max_steps"}
    assert table["steps[0:FIRE]"].tolist() == alone["steps"].tolist()
    assert table["exit_reason[1:Langevin]"].tolist() == ["completed"] * 3
    assert table["steps[1:Langevin]"].tolist() == [5] * 3
    assert (table["steps[0:FIRE]"] + table["steps[1:Langevin]"]).tolist() == table["steps"].tolist()


class RaisesOnSystem1(LennardJones):
    """Argon LJ that cannot evaluate any batch holding system 1."""

    def __init__(self) -> None:
        super().__init__(0.0104, 3.40, 6.0)

    def forward(self, batch, *args, **kwargs):  # type: ignore[override]
        if bool((batch.system_id == 1).any()):
            raise RuntimeError("descriptor undefined")
        return super().forward(batch, *args, **kwargs)


def test_a_quarantined_systems_info_keeps_its_own_keys_and_the_error(tmp_path: Path) -> None:
    """Read back from a store, a system the model failed on has the error text and
    still its input's info (its label)."""
    store = tmp_path / "r.zarr"
    al.Simulator(model=RaisesOnSystem1(), stages=relax(), sinks=[ZarrSink(store)]).run(argon())
    failed = read_results(store)[1]
    assert failed.info["exit_reason"] == "model_error"
    assert "descriptor undefined" in failed.info["model_error"]
    assert failed.info["label"] == "crystal 1"
