"""``alchemi-lit eos | elastic | phonons | vibrations | qha`` run every
``configs/workflows/*.yaml`` end to end (shrunk), give the Python API's numbers, resume,
report and refuse bad configs in one line.  (``test_configs.py`` runs ``configs/*.yaml``
with ``run``; these configs are for the workflow commands, hence their own folder and
test.)"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from ase.io import read

from alchemi_lit import workflows
from alchemi_lit.cli import main
from alchemi_lit.integrators import FIRE
from alchemi_lit.models import EMT

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs" / "workflows").glob("*.yaml"))
#: the configs, order's in the slow tier (its enumeration, pre-screen and relaxation
#: take seconds; tests/workflows/test_order.py checks the workflow itself)
RUNS = [pytest.param(p, marks=pytest.mark.slow) if p.stem == "order" else p for p in CONFIGS]
CRYSTALS = ROOT / "configs" / "data" / "crystals.extxyz"
MOLECULES = ROOT / "configs" / "data" / "molecules.extxyz"
#: a few structures, and phonopy's supercells small (its symmetry set-up of the 216-atom
#: supercells "auto" picks for EMT takes seconds per material)
TINY = {
    "eos": ["--data.index", ":3"],
    "elastic": ["--data.index", ":2"],
    "phonons": ["--data.index", ":2", "--workflow.supercell", "2", "--workflow.min_width", "0",
                "--workflow.mesh", "[5, 5, 5]", "--workflow.npoints", "5"],
    "vibrations": ["--data.index", ":2", "--workflow.symmetry_number", "[2, 3]"],
    "qha": ["--data.index", ":1", "--workflow.supercell", "2", "--workflow.min_width", "0",
            "--workflow.mesh", "[5, 5, 5]", "--workflow.n_volumes", "5",
            "--workflow.temperatures", "[0, 100, 200, 300, 400]"],
    "order": ["--workflow.n_relax", "3"],
}  # fmt: skip
DISORDERED = ROOT / "configs" / "data" / "CuAu_disordered.cif"
#: phonopy's workflows
PHONOPY = ("phonons", "qha")


def run_config(config: Path, out: Path, *extra: str) -> int:
    args = [config.stem, "--config", str(config), "--output.dir", str(out), *TINY[config.stem]]
    if config.stem == "elastic":  # its store and checkpoints into tmp as well
        args += ["--simulator.sinks.0.init_args.store", str(out / "jobs.zarr"),
                 "--simulator.callbacks.0.init_args.dirpath", str(out / "ckpt")]  # fmt: skip
    return main([*args, *extra])


def test_the_workflow_configs_exist():
    assert {p.stem for p in CONFIGS} == {"eos", "elastic", "phonons", "vibrations", "qha", "order"}


@pytest.mark.parametrize("config", RUNS, ids=[p.stem for p in CONFIGS])
def test_workflow_config_runs_and_equals_the_python_api(config, tmp_path, capsys):
    if config.stem in PHONOPY:
        pytest.importorskip("phonopy")
    assert run_config(config, tmp_path) == 0
    name = config.stem
    table = pd.read_csv(tmp_path / f"{name}.csv")
    assert (tmp_path / f"{name}.config.yaml").exists() and (tmp_path / name).is_dir()
    assert table["error"].isna().all()
    if name == "order":  # (the CIF with partial occupancies that `run` refuses)
        ref = workflows.order(str(DISORDERED), EMT(), supercell=(2, 1, 1), precision="64",
                              relax=FIRE(fmax=0.001, max_steps=500), n_relax=3)  # fmt: skip
        np.testing.assert_allclose(table["energy_per_atom"], ref.to_pandas()["energy_per_atom"],
                                   rtol=1e-12)  # fmt: skip
        assert len(table) == 3 and ref.distinct == [7]  # of 70 orderings, 7 distinct
        return
    atoms = read(MOLECULES if name == "vibrations" else CRYSTALS, TINY[name][1])
    if name == "vibrations":
        ref = workflows.vibrations(
            atoms, EMT(), relax=FIRE(fmax=0.001, max_steps=2000), thermo="ideal_gas",
            symmetry_number=[2, 3], temperatures=[298.15, 500.0], pressures=[1e5],
        )  # fmt: skip
        mine = pd.read_csv(tmp_path / "vibrations" / "0_H2O.thermo.csv")
        np.testing.assert_allclose(mine["gibbs_energy_eV"],
                                   ref.thermo()["gibbs_energy_eV"][:2], rtol=1e-12)  # fmt: skip
        np.testing.assert_allclose(table["zpe_eV"], ref.to_pandas()["zpe_eV"], rtol=1e-12)
    elif name == "qha":
        ref = workflows.qha(
            atoms, EMT(), supercell=2, min_width=0, mesh=[5, 5, 5], n_volumes=5,
            temperatures=[0, 100, 200, 300, 400],
        ).to_pandas()
        np.testing.assert_allclose(table["beta_300K"], ref["beta_300K"], rtol=1e-12)
    elif name == "eos":
        ref = workflows.eos(atoms, EMT()).to_pandas()
        np.testing.assert_allclose(table["B0"], ref["B0"], rtol=1e-12)
    elif name == "elastic":
        ref = workflows.elastic(atoms, EMT(), relax=FIRE(fmax=0.001, max_steps=1000)).to_pandas()
        np.testing.assert_allclose(table["C11"], ref["C11"], rtol=1e-12)
        np.testing.assert_allclose(table["C44"], ref["C44"], rtol=1e-12)
    else:
        ref = workflows.phonons(
            atoms, EMT(), supercell=2, min_width=0, mesh=[5, 5, 5], npoints=5
        ).to_pandas()
        np.testing.assert_allclose(table["free_energy_300K"], ref["free_energy_300K"], rtol=1e-12)
    assert "summary" in capsys.readouterr().out


@pytest.mark.parametrize("config", RUNS, ids=[p.stem for p in CONFIGS])
def test_report_plots_a_workflow_output(config, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    if config.stem in PHONOPY:
        pytest.importorskip("phonopy")
    assert run_config(config, tmp_path) == 0
    capsys.readouterr()
    assert main(["report", str(tmp_path), "--plots", str(tmp_path / "plots")]) == 0
    out = capsys.readouterr().out
    pngs = sorted((tmp_path / "plots").glob("*.png"))
    table = pd.read_csv(tmp_path / f"{config.stem}.csv")
    n = table["material"].nunique() if config.stem == "order" else len(table)  # (per material)
    assert len(pngs) == n and all(p.stat().st_size > 1000 for p in pngs)
    assert f"alchemi-lit report: {config.stem}" in out


def test_resume_of_a_finished_elastic_run_computes_nothing_and_gives_the_same_table(tmp_path):
    config = ROOT / "configs" / "workflows" / "elastic.yaml"
    assert run_config(config, tmp_path) == 0
    first = pd.read_csv(tmp_path / "elastic.csv")
    assert run_config(config, tmp_path, "--resume") == 0
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "elastic.csv"), first)


def test_print_config_reruns_to_the_same_table(tmp_path, capsys):
    config = ROOT / "configs" / "workflows" / "eos.yaml"
    assert main(["eos", "--config", str(config), "--data.index", ":2", "--print_config"]) == 0
    resolved = tmp_path / "resolved.yaml"
    resolved.write_text(capsys.readouterr().out)
    assert "SinglePoint" in resolved.read_text()  # no stages: single points, said so
    assert main(["eos", "--config", str(resolved), "--output.dir", str(tmp_path / "a")]) == 0
    assert run_config(config, tmp_path / "b", "--data.index", ":2") == 0
    pd.testing.assert_frame_equal(
        pd.read_csv(tmp_path / "a" / "eos.csv"), pd.read_csv(tmp_path / "b" / "eos.csv")
    )


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        (["--simulator.stages", "[{class_path: FIRE}]"], "simulator.stages"),
        (["--data.first_id", "5"], "data.first_id"),
        (["--workflow.distance", "-1"], "distance must be > 0"),
    ],
)
def test_a_bad_workflow_config_is_one_line_with_exit_2(extra, key, tmp_path, capsys):
    pytest.importorskip("phonopy")
    config = ROOT / "configs" / "workflows" / "phonons.yaml"
    assert run_config(config, tmp_path, *extra) == 2
    err = capsys.readouterr().err
    assert key in err and err.startswith("error:") and len(err.strip().splitlines()) == 1


def test_a_workflow_config_passes_its_budgets_and_options_on(monkeypatch, tmp_path, capsys):
    """What ``alchemi-lit eos`` hands ``workflows.eos``: data.sampler's max_atoms and
    max_systems, the workflow section and Simulator arguments, as the Python call
    would write them.  A budget dropped on the way (max_systems) changed no number
    the tests compared (the budgets batch the work, they do not change the results)."""
    from alchemi_lit.models import EMT as Model

    calls = []

    class Stop(Exception):
        pass

    @functools.wraps(workflows.eos)  # its signature: the parser's workflow section
    def recorder(structures, model, **kwargs):
        calls.append((structures, model, kwargs))
        raise Stop

    monkeypatch.setattr(workflows, "eos", recorder)
    config = ROOT / "configs" / "workflows" / "eos.yaml"
    code = run_config(config, tmp_path, "--data.sampler", "{max_atoms: 500, max_systems: 3}",
                      "--workflow.n_points", "5", "--simulator.seed", "4")  # fmt: skip
    assert code == 1 and "unexpected Stop" in capsys.readouterr().err  # stopped at the call
    ((structures, model, kwargs),) = calls
    assert len(structures) == 3 and isinstance(model, Model)
    assert {k: kwargs[k] for k in ("max_atoms", "max_systems", "n_points", "seed")} == {
        "max_atoms": 500, "max_systems": 3, "n_points": 5, "seed": 4,
    }  # fmt: skip
