"""``alchemi-lit report`` and what it reads: energies at stage exit, stage labels, run stats.

Covers: the per-system ``stage_energy`` history (recorded at each stage exit, carried
through HostMemory, ZarrSink and ``atoms.info``), the global stage labels runs record
(pipelines number their per-rank codes from 0), wall time and throughput recorded by
API runs (not only CLI ones), stores several runs appended to, stores of older runs,
quarantined systems and a missing matplotlib.
"""

from __future__ import annotations

import io
import json
import re
import sys
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
import zarr
from rich.console import Console

import alchemi_lit as al
from alchemi_lit.callbacks import TrajectoryWriter, read_trajectory
from alchemi_lit.cli import main
from alchemi_lit.core.errors import ConfigError
from alchemi_lit.core.state import EXIT_RUNNING
from alchemi_lit.data import SizeAwareSampler, mixed_argon
from alchemi_lit.integrators import FIRE, Langevin, VelocityVerlet
from alchemi_lit.models import LennardJones
from alchemi_lit.report import plots as report_plots
from alchemi_lit.report import read_store_runs, report, stage_names_from_plan
from alchemi_lit.sinks import HostMemory, ZarrSink, read_results
from conftest import PoisonedLJ

ROOT = Path(__file__).resolve().parents[1]
DATA = mixed_argon(10, 8, 30, seed=5)


def lj() -> LennardJones:
    return LennardJones(0.0104, 3.40, 6.0)


def relax() -> FIRE:
    return FIRE(fmax=0.05, max_steps=40)


def md() -> Langevin:
    return Langevin(dt=2.0, temperature=50.0, friction=0.02, steps=8)


def run_report(store: Path, **kwargs) -> tuple[dict, str]:
    out = io.StringIO()
    summary = report(store, console=Console(file=out, width=200), **kwargs)
    return summary, out.getvalue()


@pytest.fixture(scope="module")
def fused_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, al.Results]:
    """FIRE + Langevin from the Python API into a store (no CLI)."""
    store = tmp_path_factory.mktemp("fused") / "r.zarr"
    sim = al.Simulator(model=lj(), stages=relax() + md(), sinks=[ZarrSink(store)], sync_every=4)
    return store, sim.run(SizeAwareSampler(DATA, max_atoms=120))  # results: read from store


# ---------------------------------------------------------------------- stage_energy
def test_energy_is_recorded_when_each_stage_is_left(fused_run) -> None:
    store, res = fused_run
    e = res.stage_energy
    assert e.shape == (len(DATA), 2) and e.dtype == res.energy.dtype
    assert (res.batch.stage_exit != EXIT_RUNNING).all()
    # leaving the last stage is leaving the plan: the final energy
    assert torch.equal(e[:, 1], res.energy)
    # leaving FIRE: the relaxed energy, as a relax-only run gives it
    alone = al.Simulator(model=lj(), stages=relax(), sync_every=4).run(DATA)
    torch.testing.assert_close(e[:, 0], alone.energy, rtol=0, atol=1e-10)
    assert not torch.equal(e[:, 0], e[:, 1])  # MD moved them on
    # carried into the store and back (res reads it), and into atoms.info
    assert torch.equal(read_results(store).stage_energy, e)
    atoms = ZarrSink(store).read()
    assert [a.info["stage_energy"] for a in atoms] == e.tolist()


def test_stage_energy_survives_a_checkpoint(tmp_path: Path) -> None:
    from alchemi_lit.io.serialize import batch_from_state, batch_state

    memory = HostMemory()
    memory.write(al.Simulator(model=lj(), stages=relax() + md(), sync_every=4).run(DATA[:3]).batch)
    again = HostMemory()
    again.load_state_dict(memory.state_dict())
    assert torch.equal(again.read_batch().stage_energy, memory.read_batch().stage_energy)
    back = batch_from_state(batch_state(memory.read_batch()))
    assert torch.isfinite(back.stage_energy).all()


# ---------------------------------------------------------------------- run stats
def test_api_runs_record_wall_time_and_throughput(fused_run) -> None:
    store, res = fused_run
    run = read_store_runs(store)[-1]
    stats = run["stats"]
    assert stats["wall_time_s"] == pytest.approx(res.stats["wall_time_s"])
    assert stats["systems"] == len(DATA) and stats["strategy"] == "single"
    assert stats["steps"] == res.stats["steps"] > 0
    assert stats["forward_calls"] == res.stats["forward_calls"] > 0
    assert datetime.fromisoformat(stats["started"]) <= datetime.fromisoformat(stats["ended"])
    assert run["stage_names"] == ["0:FIRE", "1:Langevin"] and run["first_row"] == 0

    summary, text = run_report(store)
    assert "wall time" in text and "atom-steps/s" in text and "systems/s" in text
    assert summary["wall_time_s"] == pytest.approx(stats["wall_time_s"])
    n_atoms = res.batch.n_atoms.numpy()
    atom_steps = int((n_atoms * res.steps.numpy()).sum())
    assert summary["atom_steps_per_s"] == pytest.approx(atom_steps / stats["wall_time_s"])
    # energies per atom at each stage exit: mean and spread
    for j, stage in enumerate(summary["stages"]):
        epa = res.stage_energy[:, j].numpy() / n_atoms
        got = stage["energy_per_atom"]
        assert got["n"] == len(DATA)
        assert got["mean"] == pytest.approx(epa.mean()) and got["std"] == pytest.approx(epa.std())
        assert got["min"] == pytest.approx(epa.min()) and got["max"] == pytest.approx(epa.max())
    assert "E/atom at exit 0:FIRE" in text and "E/atom at exit 1:Langevin" in text
    json.dumps(summary)  # JSON-ready


def test_a_store_several_runs_wrote_reports_each_run_and_totals(tmp_path: Path) -> None:
    store = tmp_path / "r.zarr"
    walls = []
    for part, mode in ((DATA[:4], "w-"), (DATA[4:], "a")):
        sim = al.Simulator(model=lj(), stages=relax(), sinks=[ZarrSink(store, mode=mode)])
        ids = list(range(len(walls) * 4, len(walls) * 4 + len(part)))
        walls.append(
            sim.run(SizeAwareSampler(part, max_atoms=120, system_ids=ids)).stats["wall_time_s"]
        )
    runs = read_store_runs(store)
    assert [r["first_row"] for r in runs] == [0, 4]
    assert all(r["stats"]["wall_time_s"] > 0 for r in runs)

    summary, text = run_report(store)
    assert [r["rows"] for r in summary["runs"]] == [[0, 4], [4, len(DATA)]]
    assert [r["systems"] for r in summary["runs"]] == [4, len(DATA) - 4]
    assert summary["wall_time_s"] == pytest.approx(sum(walls))
    systems = read_results(store).batch
    atom_steps = int((systems.n_atoms * systems.total_steps).sum())
    assert summary["atom_steps_per_s"] == pytest.approx(atom_steps / sum(walls))
    assert summary["systems_per_s"] == pytest.approx(len(DATA) / sum(walls))
    assert "run 0" in text and "run 1" in text and "in total" in text


def test_stores_of_older_runs_still_report(fused_run, tmp_path: Path) -> None:
    """No stage_names / stats / first_row: labels from the plan, time from the CLI's
    summary; a run without either has no wall time rather than a wrong one."""
    import shutil

    store = tmp_path / "old.zarr"
    shutil.copytree(fused_run[0], store)
    group = zarr.open_group(str(store), mode="r+")
    (run,) = group.attrs["runs"]
    old = {k: v for k, v in run.items() if k not in ("stats", "stage_names", "first_row")}
    group.attrs["runs"] = [{**old, "summary": {"wall_time_s": 2.0}}]
    summary, text = run_report(store)
    assert [s["name"] for s in summary["stages"]] == ["0:FIRE", "1:Langevin"]
    assert summary["wall_time_s"] == 2.0 and summary["atom_steps_per_s"] > 0

    group.attrs["runs"] = [old, old]  # two runs, neither timed
    summary, text = run_report(store)
    assert "wall_time_s" not in summary and "atom_steps_per_s" not in summary
    assert "run 1" in text and "wall time not recorded" in text


def test_stage_labels_from_older_pipeline_plans() -> None:
    three = (
        "Pipeline({0: Fused([0:FIRE], entry=0, exit=1), 1: Fused([0:Langevin], entry=0, "
        "exit=1), 2: Fused([0:FIRE], entry=0, exit=1)}, edges=[(0, 1), (1, 2)])"
    )
    assert stage_names_from_plan(three, 3) == ["0:FIRE", "1:Langevin", "2:FIRE"]
    replicas = (
        "Pipeline({0: Fused([0:FIRE, 1:Langevin], entry=0, exit=2), 1: Fused([0:FIRE, "
        "1:Langevin], entry=0, exit=2)}, edges=[])"
    )
    assert stage_names_from_plan(replicas, 2) == ["0:FIRE", "1:Langevin"]
    assert stage_names_from_plan("Fused([5:FIRE, 9:Langevin], entry=5, exit=11)", 2) == [
        "5:FIRE",
        "9:Langevin",
    ]


def test_simulators_name_stage_history_columns() -> None:
    def names(**kw) -> list[str]:
        return al.Simulator(model=lj(), **kw).stage_names()

    assert names(stages=relax() + md() + relax()) == ["0:FIRE", "1:Langevin", "2:FIRE"]
    piped = names(stages=relax() | md() | relax(), devices=3)
    assert piped == ["0:FIRE", "1:Langevin", "2:FIRE"]
    assert names(stages=(relax() + md()) | relax(), devices=2) == ["0:FIRE", "1:Langevin", "2:FIRE"]
    # replicas share the base plan's columns
    assert names(stages=relax() + md(), strategy="replicas", devices=2) == ["0:FIRE", "1:Langevin"]


@pytest.mark.multirank
@pytest.mark.timeout(180)
def test_pipeline_store_has_global_stage_labels_energies_and_stats(tmp_path: Path) -> None:
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(1)  # forked ranks hang with more threads
    try:
        store = tmp_path / "p.zarr"
        sim = al.Simulator(
            model=lj(),
            stages=relax() | md() | FIRE(fmax=0.05, max_steps=20),
            sinks=[ZarrSink(store)],
            devices=3,
            start_method="fork",
            sync_every=4,
            timeout=60.0,
        )
        sim.run(SizeAwareSampler(DATA, max_atoms=120))
    finally:
        torch.set_num_threads(torch_threads)
    run = read_store_runs(store)[-1]
    assert run["stage_names"] == ["0:FIRE", "1:Langevin", "2:FIRE"]
    assert run["stats"]["strategy"] == "pipeline" and run["stats"]["systems"] == len(DATA)
    assert run["stats"]["wall_time_s"] > 0 and run["stats"]["forward_calls"] > 0
    stored = read_results(store)
    assert torch.isfinite(stored.stage_energy).all()  # every system left every stage
    summary, text = run_report(store)
    assert [s["name"] for s in summary["stages"]] == ["0:FIRE", "1:Langevin", "2:FIRE"]
    assert "steps 1:Langevin" in text and "steps 2:FIRE" in text and "0:Langevin" not in text
    assert summary["atom_steps_per_s"] > 0


# ---------------------------------------------------------------------- quarantine
def test_quarantined_systems_have_no_stage_exit_energy(tmp_path: Path) -> None:
    store = tmp_path / "q.zarr"
    sim = al.Simulator(
        model=PoisonedLJ(cutoff=6.0),
        stages=VelocityVerlet(dt=1.0, steps=12),
        sinks=[ZarrSink(store)],
    )
    res = sim.run(DATA[:3])
    assert res.exit_reasons == ["completed", "non_finite", "completed"]
    stored = read_results(store)
    assert (
        torch.isnan(stored.stage_energy[1]).all()
        and torch.isfinite(stored.stage_energy[0::2]).all()
    )
    summary, text = run_report(store)
    assert summary["quarantined"] == 1
    stage = summary["stages"][0]
    assert stage["energy_per_atom"]["n"] == 2  # the quarantined system never left the stage
    epa = stored.stage_energy[0::2, 0] / stored.n_atoms[0::2]
    assert stage["energy_per_atom"]["mean"] == pytest.approx(float(epa.mean()))
    assert "quarantined" in text and "2 systems" in text


# ---------------------------------------------------------------------- plots / CLI
def test_without_matplotlib_the_table_is_printed_and_plots_fail_clearly(
    fused_run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    out = io.StringIO()
    with pytest.raises(ConfigError, match="matplotlib"):
        report(fused_run[0], plots=tmp_path / "p", console=Console(file=out, width=200))
    text = out.getvalue()
    assert "converged" in text and "E/atom at exit 1:Langevin" in text and "wall time" in text


def test_cli_summary_json_and_report_have_stage_energies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "out" / "q.zarr"
    argv = [
        "run",
        "--config",
        str(ROOT / "configs" / "quickstart.yaml"),
        "--data.builtin_args.n_systems",
        "2",
        "--data.builtin_args.repeat",
        "2",
        "--simulator.stages.0.init_args.max_steps",
        "30",
        "--simulator.stages.1.init_args.steps",
        "6",
        "--simulator.sinks.0.init_args.store",
        str(store),
    ]
    assert main(argv) == 0
    summary = json.loads((tmp_path / "out" / "q.summary.json").read_text())
    energies = [s["energy_per_atom"] for s in summary["stages"]]
    assert len(energies) == 2 and all(e["n"] == 2 and np.isfinite(e["mean"]) for e in energies)
    assert read_store_runs(store)[-1]["stats"]["wall_time_s"] > 0
    capsys.readouterr()
    assert main(["report", str(store)]) == 0
    out = capsys.readouterr().out
    assert "E/atom at exit 0:FIRE" in out and "atom-steps/s" in out


# ---------------------------------------------------------------------- MD-only summaries
def test_md_only_summary_says_completed_not_converged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ "converged" (every optimizer met its criterion) is 0 for any MD run: the run's
    table, the report and the JSON say how many completed instead."""
    store = tmp_path / "md.zarr"
    sim = al.Simulator(model=lj(), stages=md(), sinks=[ZarrSink(store)])
    sim.run(DATA[:4])
    summary, text = run_report(store)
    assert summary["completed"] == 4 and not summary["has_optimizer"]
    assert re.search(r"completed\W+4 / 4", text) and not re.search(r"converged\W+\d+ /", text)
    config = tmp_path / "md.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "simulator": {
                    "model": {"class_path": "lj-argon"},
                    "stages": [{"class_path": "VelocityVerlet", "init_args": {"steps": 4}}],
                    "sinks": [{"class_path": "ZarrSink", "init_args": {"store": "cli.zarr"}}],
                },
                "data": {"structures": "builtin:argon", "builtin_args": {"n_systems": 3}},
            }
        )
    )
    capsys.readouterr()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)
        assert main(["run", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"completed\W+3 / 3", out) and not re.search(r"converged\W+\d+ /", out)
    saved = json.loads((tmp_path / "cli.summary.json").read_text())
    assert saved["completed"] == 3 and saved["has_optimizer"] is False


def test_fused_summary_keeps_converged(fused_run) -> None:
    summary, text = run_report(fused_run[0])
    assert summary["has_optimizer"] and re.search(rf"converged\W+{summary['converged']} / 10", text)


# ---------------------------------------------------------------------- plots
@pytest.fixture
def drawn_figures(monkeypatch: pytest.MonkeyPatch) -> list:
    """The matplotlib figures the report saves (kept after they are closed)."""
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    figures: list = []
    save = Figure.savefig

    def keep(self, *args, **kwargs):
        figures.append(self)
        return save(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return figures


def colliding_texts(fig) -> list[tuple[str, str]]:
    """Pairs of texts drawn on ``fig`` whose boxes overlap: tick labels drawn on one
    axis, axis labels, offset texts (``1e-6``) and titles of each panel."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)  # pyplot detached the figure's canvas when it closed it
    canvas.draw()
    renderer = canvas.get_renderer()
    found = []
    for ax in fig.axes:
        texts = [ax.title, ax.xaxis.label, ax.yaxis.label]
        texts += [ax.xaxis.get_offset_text(), ax.yaxis.get_offset_text()]
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            span = hi - lo
            texts += [
                t.label1
                for t, loc in zip(axis.get_major_ticks(), axis.get_majorticklocs())
                if lo - 1e-9 * span <= loc <= hi + 1e-9 * span
            ]
        texts = [t for t in texts if t.get_visible() and t.get_text()]
        boxes = [t.get_window_extent(renderer) for t in texts]
        for i in range(len(texts)):
            for j in range(i):
                if boxes[i].overlaps(boxes[j]):
                    found.append((texts[i].get_text(), texts[j].get_text()))
    return found


def test_plot_labels_do_not_overlap(tmp_path: Path, drawn_figures: list) -> None:
    """Step counts up to 10^5 in three narrow panels and energies per atom that differ
    in the seventh decimal: the labels a user reads stay apart."""
    rng = np.random.default_rng(0)
    n = 300
    n_atoms = rng.integers(8, 400, n)
    systems = {
        "energy": (-0.08012345 + rng.normal(0, 3e-7, n)) * n_atoms,
        "n_atoms": n_atoms,
        "stage_steps": np.stack(
            [rng.integers(5, 100_000, n), rng.integers(0, 4, n), np.full(n, 1000)], 1
        ),
    }
    report_plots.make_plots(systems, tmp_path, ["0:FIRE", "1:Langevin", "2:VelocityVerlet"])
    assert len(drawn_figures) == 2
    for fig in drawn_figures:
        assert colliding_texts(fig) == []
    # every panel still has ticks to read values from
    assert all(len(ax.get_xticklabels()) >= 2 for fig in drawn_figures for ax in fig.axes)


def md_trajectory(tmp_path: Path, **writer_args) -> Path:
    path = tmp_path / "traj.zarr"
    sim = al.Simulator(
        model=lj(), stages=md(), callbacks=[TrajectoryWriter(path, every=2, **writer_args)]
    )
    sim.run(DATA[:3])
    return path


def test_trajectory_writer_defaults_fill_the_temperature_panel(
    tmp_path: Path, drawn_figures: list
) -> None:
    import warnings

    path = md_trajectory(tmp_path)
    frames = read_trajectory(path, 1)
    # the stored temperature is the one ASE computes from the stored velocities
    temps = [f.info["temperature"] for f in frames]
    assert temps == pytest.approx([f.get_temperature() for f in frames], rel=1e-10)
    assert min(temps[1:]) > 5.0  # a 50 K thermostat heats the crystal
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "not recorded" warning
        report_plots.plot_trajectory(path, tmp_path / "t.png")
    (fig,) = drawn_figures
    ax_t, ax_e = fig.axes
    assert ax_t.get_ylabel() == "temperature (K)"
    traces = [line.get_ydata() for line in ax_t.get_lines()]
    assert len(traces) == 3 and all(np.isfinite(t).all() and t.max() > 5.0 for t in traces)
    assert np.isfinite(ax_e.get_lines()[0].get_ydata()).all()
    assert colliding_texts(fig) == []


def test_trajectory_without_velocities_says_what_is_missing(
    tmp_path: Path, drawn_figures: list, capsys: pytest.CaptureFixture[str]
) -> None:
    path = md_trajectory(tmp_path, fields=("positions", "energy"))
    with pytest.warns(UserWarning, match=r"no temperature .* add 'temperature' or 'velocities'"):
        report_plots.plot_trajectory(path, tmp_path / "t.png")
    (fig,) = drawn_figures
    notes = [t.get_text() for t in fig.axes[0].texts]
    assert any("not recorded" in n and "'velocities'" in n for n in notes)
    assert not fig.axes[1].texts  # the energy panel has its data
