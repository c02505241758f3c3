"""How the workflows run: a batch of materials equals each alone, a killed workflow
resumes without losing or repeating anything, a failing material leaves the others be,
and bad input is refused before anything runs."""

from __future__ import annotations

import importlib.util
import os
import signal

import numpy as np
import pandas as pd
import pytest
from ase import Atoms
from ase.build import bulk
from workflow_materials import (
    NoGold,
    aluminium,
    copper,
    cu3au,
    ten_materials,
    triclinic,
    with_ase_emt,
)

from alchemi_lit import workflows
from alchemi_lit.callbacks import Checkpoint
from alchemi_lit.core.errors import ConfigError, StructureError
from alchemi_lit.engine.hooks import Callback
from alchemi_lit.engine.interrupt import RunInterrupted
from alchemi_lit.integrators import FIRE, CellFilter, Langevin
from alchemi_lit.models import EMT, ASECalculatorModel
from alchemi_lit.sinks import ZarrSink

RELAX = FIRE(fmax=1e-3, max_steps=500)


def test_ten_materials_batched_equal_each_alone():
    """Inflight batches of mixed jobs (the triclinic cell's relax for many steps) give
    every material bit for bit what it gets alone: its jobs' paths depend on nothing else."""
    materials = ten_materials()
    batched = workflows.elastic(materials, EMT(), relax=RELAX, max_atoms=40)
    assert batched.jobs.results.stats["forward_calls"] > 1  # refilled: several batches
    for i, atoms in enumerate(materials):
        alone = workflows.elastic([atoms], EMT(), relax=RELAX)
        np.testing.assert_array_equal(batched.elastic_tensor(i), alone.elastic_tensor(0))
    eos_batched = workflows.eos(materials, EMT(), max_atoms=40).to_pandas()
    for i, atoms in enumerate(materials):
        alone = workflows.eos([atoms], EMT()).to_pandas()
        assert eos_batched["B0"][i] == alone["B0"][0] and eos_batched["V0"][i] == alone["V0"][0]


def test_phonons_batched_equal_each_alone():
    pytest.importorskip("phonopy")
    materials = [copper(), aluminium(), cu3au()]
    kw = dict(supercell=2, min_width=0, mesh=[5, 5, 5], band_path=None)
    batched = workflows.phonons(materials, EMT(), max_atoms=40, **kw).to_pandas()
    for i, atoms in enumerate(materials):
        alone = workflows.phonons([atoms], EMT(), **kw).to_pandas()
        assert batched["min_frequency_THz"][i] == alone["min_frequency_THz"][0]
        assert batched["free_energy_300K"][i] == alone["free_energy_300K"][0]


def test_single_points_of_one_batch_cost_one_forward():
    res = workflows.eos([copper(), aluminium()], EMT())
    assert res.jobs.results.stats["forward_calls"] == 1


class ChunkedEMT(EMT):
    """EMT declaring a CPU batch size, as SevenNet does (128 atoms)."""

    cpu_batch_atoms = 4


def test_a_model_with_a_cpu_batch_size_runs_in_chunks_and_gives_the_same_results():
    """Single points of a model with ``cpu_batch_atoms`` run on a CPU in chunks of that
    many atoms by default (14 one-atom jobs, 4 per forward), raised to the largest job
    (Cu3Au's 4 atoms under a budget of 1), with the one-batch run's numbers bit for bit."""
    one_batch = workflows.eos([copper(), aluminium()], EMT())
    chunked = workflows.eos([copper(), aluminium()], ChunkedEMT())
    assert chunked.jobs.results.stats["forward_calls"] == 4
    pd.testing.assert_frame_equal(chunked.to_pandas(), one_batch.to_pandas())
    tiny = ChunkedEMT()
    tiny.cpu_batch_atoms = 1
    mixed = workflows.eos([copper(), cu3au()], tiny)
    assert mixed.jobs.results.stats["forward_calls"] == 7 + 2  # each Cu3Au alone, Cu 4 + 3
    np.testing.assert_array_equal(
        mixed.to_pandas()["B0"], workflows.eos([copper(), cu3au()], EMT()).to_pandas()["B0"]
    )


@pytest.mark.parametrize("bad", [0, -5, 12.5, "128", True])
def test_a_bad_cpu_batch_size_of_a_model_is_named(bad):
    model = ChunkedEMT()
    model.cpu_batch_atoms = bad
    for workflow in (workflows.eos, workflows.phonons):  # before anything runs
        with pytest.raises(TypeError, match=r"ChunkedEMT.cpu_batch_atoms must be None or a"):
            workflow([copper()], model)


def test_a_cpu_batch_far_past_the_models_size_warns_with_the_fix(log_messages):
    """A list run in one batch of many times ``cpu_batch_atoms`` warns, naming the
    sampler that bounds it; within the bound, or with a sampler, nothing is said."""
    from alchemi_lit import Simulator
    from alchemi_lit.data import SizeAwareSampler
    from alchemi_lit.workflows.jobs import SinglePoint

    crystals = [bulk("Cu", "fcc", a=3.6, cubic=True) for _ in range(9)]  # 36 atoms
    Simulator(ChunkedEMT(), SinglePoint()).run(crystals[:8])  # 32 atoms: 8 x 4, no warning
    Simulator(ChunkedEMT(), SinglePoint()).run(SizeAwareSampler(crystals, max_atoms=4))
    assert not [m for level, m in log_messages if level == "WARNING"]
    Simulator(ChunkedEMT(), SinglePoint()).run(crystals)
    (warning,) = [m for level, m in log_messages if level == "WARNING"]
    assert "36 atoms in one batch on the CPU" in warning
    assert "SizeAwareSampler(structures, max_atoms=4)" in warning


class SignalSelf(Callback):
    """SIGTERM to this process once ``after`` jobs have left the plan."""

    def __init__(self, after: int) -> None:
        super().__init__()
        self.after, self.finished, self.sent = after, 0, False

    def on_converge(self, ctx) -> None:
        self.finished += int((ctx.batch.status == ctx.state["exit_code"]).sum())

    def after_step(self, ctx) -> None:
        if self.finished >= self.after and not self.sent:
            self.sent = True
            os.kill(os.getpid(), signal.SIGTERM)


@pytest.mark.parametrize(
    "checkpoints",
    [
        pytest.param(True, marks=pytest.mark.slow, id="checkpoint"),  # (engine, NEB: fast)
        pytest.param(False, id="stores-only"),
    ],
)
def test_a_killed_workflow_resumes_and_loses_nothing(tmp_path, checkpoints):
    materials = [triclinic(), copper(), cu3au(), triclinic(), aluminium()]
    kw = dict(relax=RELAX, max_atoms=36)  # 12 triclinic jobs at once: still refilled
    reference = workflows.elastic(materials, EMT(), **kw).to_pandas()

    def callbacks(extra):
        saved = [Checkpoint(tmp_path / "ckpt", every=5)] if checkpoints else []
        return [*saved, *extra]

    store = tmp_path / "elastic.zarr"
    with pytest.raises(RunInterrupted):
        workflows.elastic(materials, EMT(), sinks=[ZarrSink(store)],
                          callbacks=callbacks([SignalSelf(after=30)]), **kw)  # fmt: skip
    done_before = len(ZarrSink(store).read())
    assert 0 < done_before < 5 * 24
    resumed = workflows.elastic(
        materials, EMT(), sinks=[ZarrSink(store)], callbacks=callbacks([]), resume=True, **kw
    )
    pd.testing.assert_frame_equal(resumed.to_pandas(), reference)
    stored = ZarrSink(store).read()
    assert sorted(stored.system_id.tolist()) == list(range(5 * 24))  # each job once


def test_a_material_whose_jobs_fail_is_reported_and_the_others_finish():
    materials = [copper(), cu3au(), aluminium()]
    res = workflows.elastic(materials, ASECalculatorModel(NoGold))
    table = res.to_pandas()
    assert "the model failed" in table["error"][1] and "no gold here" in table["error"][1]
    assert table[list(workflows.elastic.__globals__["CIJ"])].iloc[1].isna().all()
    assert set(res.failed) == {1}
    clean = workflows.elastic([copper(), aluminium()], EMT())
    for row, i in ((0, 0), (2, 1)):
        assert pd.isna(table["error"][row])
        np.testing.assert_allclose(res.elastic_tensor(row), clean.elastic_tensor(i), atol=1e-6)
    with pytest.raises(ValueError, match="material 1 has no elastic results"):
        res.elastic_tensor(1)


def test_a_material_whose_relaxations_do_not_converge_is_reported():
    """Two FIRE steps cannot bring the triclinic cell's forces (~1 eV/Å) under 1e-4
    eV/Å: its rows are NaN with the reason, while copper (no force on its one atom)
    converges at once and is fitted.  Every relaxing test converged, so a workflow
    that fitted unconverged relaxations as if they were minima went unseen."""
    res = workflows.eos([copper(), triclinic()], EMT(), relax=FIRE(fmax=1e-4, max_steps=2))
    table = res.to_pandas()
    assert "did not converge within max_steps" in table["error"][1]
    assert np.isnan(table["B0"][1]) and set(res.failed) == {1}
    assert pd.isna(table["error"][0]) and np.isfinite(table["B0"][0])
    forces = with_ase_emt(triclinic()).get_forces()
    assert np.linalg.norm(forces, axis=1).min() > 0.5  # (the premise: far from converged)


# ------------------------------------------------------------- refused before running
class Untouchable(EMT):
    """EMT that fails the test if it is ever evaluated."""

    def forward(self, batch):
        raise AssertionError("the model was evaluated although the input was refused")


MOLECULE = Atoms("Cu2", positions=[[0, 0, 0], [0, 0, 2.4]], cell=[10, 10, 10], pbc=False)


@pytest.mark.parametrize("name", ["eos", "elastic", "phonons"])
def test_a_non_periodic_structure_is_refused_before_anything_runs(name):
    with pytest.raises(StructureError, match=r"structure 1 \(Cu2\) is not periodic in x, y and z"):
        getattr(workflows, name)([copper(), MOLECULE], Untouchable())


def test_missing_phonopy_names_the_package_and_the_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "phonopy" else real(n, *a)
    )
    with pytest.raises(
        ConfigError, match=r"phonons need phonopy.*pip install 'alchemi_lit\[phonons\]'"
    ):
        workflows.phonons([copper()], Untouchable())


def test_a_supercell_too_small_for_the_cutoff_is_refused_with_one_that_would_do():
    model = Untouchable()  # cutoff ~5.9 Å: supercells must be ~11.8 Å thick
    with pytest.raises(
        StructureError,
        match=r"structure 0 \(Cu\): the supercell .* is 6.22 Å thick.*supercell=\[6, 6, 6\]",
    ):
        workflows.phonons([copper()], model, supercell=3)


def test_the_thickness_check_measures_the_supercell_phonopy_builds():
    """A non-diagonal supercell matrix, whose supercell is not the same as that of its
    transpose: the check measures phonopy's supercell (lattice vectors as columns:
    unit @ m), 3.41 Å thick, where the transpose's is 3.59 Å.  Every other supercell
    was diagonal, where the two conventions agree, so a check on the transposed
    supercell went unseen and let this one through at min_width 3.45 Å."""
    pytest.importorskip("phonopy")
    from phonopy.structure.atoms import PhonopyAtoms
    from phonopy.structure.cells import get_supercell

    atoms, m = bulk("Cu", "fcc", a=3.59, cubic=True), [[3, 0, 0], [1, 1, 0], [0, 0, 1]]
    unit = PhonopyAtoms(
        symbols=atoms.get_chemical_symbols(), cell=atoms.cell[:],
        scaled_positions=atoms.get_scaled_positions(),
    )  # fmt: skip
    cell = np.asarray(get_supercell(unit, m).cell)  # what Phonopy(supercell_matrix=m) holds
    volume = abs(np.linalg.det(cell))
    thick = min(volume / np.linalg.norm(np.cross(cell[i - 2], cell[i - 1])) for i in range(3))
    assert thick == pytest.approx(3.4058, abs=1e-4)
    with pytest.raises(StructureError, match=rf"the supercell .* is {thick:.2f} Å thick"):
        workflows.phonons([atoms], Untouchable(), supercell=m, min_width=thick + 0.05)


def test_auto_supercells_reach_twice_the_cutoff():
    pytest.importorskip("phonopy")
    from alchemi_lit.core.geometry import periodic_heights

    # a cell without symmetry: phonopy's symmetry search on a cubic 4x4x4 supercell (256
    # atoms, 48 rotations) took seconds; this one needs 4x4x4 as well
    atoms = triclinic()
    res = workflows.phonons([atoms], EMT(), mesh=[5, 5, 5], band_path=None)
    m = np.asarray(res.settings["supercell"][0])
    thick = periodic_heights(m.T @ atoms.cell[:], np.ones(3, bool))
    one = periodic_heights(atoms.cell[:], np.ones(3, bool))  # one repeat's (m is diagonal)
    assert np.all(thick >= 2 * EMT().cutoff) and np.all(thick - one < 2 * EMT().cutoff)


def test_relax_must_be_optimizers_that_keep_the_imposed_cell():
    with pytest.raises(ConfigError, match="MD stages do not end at a minimum"):
        workflows.elastic(
            [copper()], Untouchable(), relax=Langevin(dt=1.0, temperature=10.0, steps=5)
        )
    with pytest.raises(ConfigError, match="relaxes the cell, which would undo"):
        workflows.elastic([copper()], Untouchable(), relax=FIRE(cell="frechet"))
    with pytest.raises(ConfigError, match="relaxes the cell"):
        workflows.eos([copper()], Untouchable(), relax=FIRE(cell=CellFilter()))
    # the shape may relax at each volume: the volume is what the EOS imposes
    res = workflows.eos(
        [triclinic()], EMT(), relax=FIRE(fmax=0.01, cell=CellFilter(constant_volume=True))
    )
    assert pd.isna(res.to_pandas()["error"][0])


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda m: workflows.elastic([copper()], m, strains=(0.01,)), "at least two distinct"),
        (lambda m: workflows.elastic([copper()], m, strains=(0.0, 0.01)), "non-zero"),
        (lambda m: workflows.elastic([copper()], m, strains=(-1.0, 1.0)), "at most 0.1"),
        (lambda m: workflows.eos([copper()], m, n_points=3), "n_points must be >= 5"),
        (lambda m: workflows.eos([copper()], m, eos="bm"), "one of ASE's"),
        (lambda m: workflows.eos([copper()], m, max_strain=4), "fraction"),
        (lambda m: workflows.eos([copper()], m, stages=FIRE()), "set by the workflow"),
        (lambda m: workflows.eos([], m), "no structures"),
        (lambda m: workflows.phonons([copper()], m, supercell=[2, 2]), "3 x 3 integer"),
        (lambda m: workflows.phonons([copper()], m, supercell={3: 2}), "structure indices"),
    ],
)
def test_bad_parameters_are_refused_in_one_line(call, match):
    with pytest.raises(ConfigError, match=match) as caught:
        call(Untouchable())
    assert "\n" not in str(caught.value)


def test_a_job_larger_than_max_atoms_names_its_structure():
    with pytest.raises(
        ConfigError, match=r"job 1:.* of structure 1 has 4 atoms, more than max_atoms=2"
    ):
        workflows.elastic([copper(), cu3au()], Untouchable(), max_atoms=2)


def test_write_saves_the_table_and_one_file_per_material(tmp_path):
    res = workflows.eos([copper(), aluminium()], EMT())
    written = res.write(tmp_path)
    table = pd.read_csv(tmp_path / "eos.csv")
    np.testing.assert_allclose(table["B0"], res.to_pandas()["B0"], rtol=1e-15)
    assert (tmp_path / "eos" / "0_Cu.json").exists() and (tmp_path / "eos" / "1_Al.json").exists()
    assert tmp_path / "eos.settings.json" in written
    if importlib.util.find_spec("pyarrow") is None:
        with pytest.raises(
            ConfigError,
            match="parquet tables need pyarrow, which is not installed: pip install pyarrow",
        ):
            res.write(tmp_path, format="parquet")
    else:
        res.write(tmp_path, format="parquet")
        pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "eos.parquet"), res.to_pandas())


def test_a_structure_phonopy_cannot_set_up_is_named_before_the_run():
    pytest.importorskip("phonopy")
    # an F-centring primitive matrix: right for cubic fcc Cu, wrong for L1_2 Cu3Au
    cubic_cu = bulk("Cu", "fcc", a=3.59, cubic=True)
    with pytest.raises(StructureError, match=r"structure 1 \(AuCu3\): phonopy cannot set it up"):
        workflows.phonons(
            [cubic_cu, cu3au()], Untouchable(), supercell=2, min_width=0, primitive_matrix="F"
        )


def test_an_invalid_structure_is_named_by_its_input_index_not_a_job():
    broken = copper()
    broken.positions[0, 0] = np.nan
    with pytest.raises(StructureError, match=r"^elastic: system 1: .*non-finite"):
        workflows.elastic([aluminium(), broken], Untouchable())
