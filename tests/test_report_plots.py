"""What the report's plots draw, against the stored arrays and ASE.

The figures are caught as they are saved; the drawn data are read back from them (bar
heights and edges of histograms, line data) and compared with the values the plot's
axis label promises: energy per atom, volume per atom, pressure in GPa (ASE's unit),
energy along a band relative to its first image, and for a trajectory the energy per
atom (ASE's EMT at the frame's positions) and the temperature ASE gives the velocities.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from ase.build import bulk
from ase.calculators.emt import EMT as AseEMT
from ase.units import GPa
from test_report_numbers import HISTORY, NAMES

import alchemi_lit as al
from alchemi_lit.callbacks import TrajectoryWriter, read_trajectory
from alchemi_lit.integrators import Langevin
from alchemi_lit.models import EMT
from alchemi_lit.report import plots

pytest.importorskip("matplotlib")


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> dict:
    """The figures the report saves, by file name (kept after they are closed)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    saved: dict = {}
    save = Figure.savefig

    def keep(self, fname, *args, **kwargs):
        saved[Path(fname).name] = self
        return save(self, fname, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return saved


def histogram(ax) -> tuple[float, float, float]:
    """(count, left edge, right edge) of the bars drawn on ``ax``."""
    bars = ax.patches
    return (sum(b.get_height() for b in bars), min(b.get_x() for b in bars),
            max(b.get_x() + b.get_width() for b in bars))  # fmt: skip


def test_histograms_are_per_atom_and_in_gpa(tmp_path: Path, figures: dict) -> None:
    """The final energy per atom of the finite systems, and at FIRE's exit the volume
    per atom (40/4 and 90/8 Å^3) and the pressure in GPa (1e-3 and -2e-3 eV/Å^3): bars
    spanning exactly those values (NumPy's histogram range is the data's)."""
    plots.make_plots(HISTORY, tmp_path, NAMES)
    assert set(figures) == {"steps_per_stage.png", "energy_per_atom.png", "cell_per_stage.png"}
    finite = np.isfinite(HISTORY["energy"])
    epa = HISTORY["energy"][finite] / HISTORY["n_atoms"][finite]
    (ax,) = figures["energy_per_atom.png"].axes
    assert histogram(ax) == pytest.approx((len(epa), epa.min(), epa.max()), rel=1e-12)
    volume, _, pressure, _ = figures["cell_per_stage.png"].axes  # rows: volume, pressure
    assert histogram(volume) == pytest.approx((2, 10.0, 11.25), rel=1e-12)
    assert histogram(pressure) == pytest.approx((2, -2e-3 / GPa, 1e-3 / GPa), rel=1e-12)
    assert pressure.get_xlabel() == "pressure at exit (GPa)"
    steps = figures["steps_per_stage.png"].axes[0]
    assert histogram(steps) == pytest.approx((5, 4.5, 40.5))  # integer bins: 5 ... 40 steps


def test_band_paths_are_energies_above_the_first_image(tmp_path: Path, figures: dict) -> None:
    """Each path's line is E - E(first image) against image / (images - 1); the triangle
    marks the highest image's."""
    band = {"path_id": 3, "energies": [-2.0, -1.5, -1.2, -1.9, -2.4], "highest_image": 2}
    plots.plot_band_paths([band], tmp_path / "neb.png")
    line, marker = figures["neb.png"].axes[0].get_lines()[:2]
    np.testing.assert_allclose(line.get_xdata(), [0.0, 0.25, 0.5, 0.75, 1.0])
    np.testing.assert_allclose(line.get_ydata(), [0.0, 0.5, 0.8, 0.1, -0.4], atol=1e-15)
    assert (marker.get_xdata()[0], marker.get_ydata()[0]) == pytest.approx((0.5, 0.8))


def test_trajectory_panels_against_ase(tmp_path: Path, figures: dict) -> None:
    """An alloy (Cu and Au: masses differ) under Langevin: the energy panel is the
    energy per atom ASE's EMT gives at each frame's positions, the temperature panel the
    run's temperature, which ASE gives the frames read back (momenta = mass * velocity,
    atom by atom)."""
    alloy = bulk("Cu", cubic=True)
    alloy.numbers[[1, 2]] = 79
    path = tmp_path / "traj.zarr"
    md = Langevin(dt=2.0, temperature=300.0, friction=0.05, steps=6)
    writer = TrajectoryWriter(path, every=2)
    al.Simulator(model=EMT(), stages=md, callbacks=[writer], seed=1).run([alloy])
    frames = read_trajectory(path, 0)
    plots.plot_trajectory(path, tmp_path / "t.png")
    ax_t, ax_e = figures["t.png"].axes
    energies = []
    for frame in frames:
        ref = frame.copy()
        ref.calc = AseEMT()
        energies.append(ref.get_potential_energy() / len(ref))
    np.testing.assert_allclose(ax_e.get_lines()[0].get_ydata(), energies, rtol=1e-10)
    temperature = ax_t.get_lines()[0].get_ydata()
    assert temperature[1:].min() > 10.0
    # the writer's temperature (from the run's masses and velocities) is the one ASE
    # computes from the momenta read back
    np.testing.assert_allclose(temperature, [f.info["temperature"] for f in frames])
    np.testing.assert_allclose(temperature, [f.get_temperature() for f in frames], rtol=1e-10)


def test_a_frame_whose_write_was_cut_short_is_not_read(tmp_path: Path, figures: dict) -> None:
    """frames/* is appended last: system rows of a frame it does not list yet (a flush
    interrupted in between) are not a frame.  The reader and the plot leave them out."""
    import zarr

    path = tmp_path / "traj.zarr"
    md = Langevin(dt=2.0, temperature=50.0, friction=0.05, steps=6)
    sim = al.Simulator(model=EMT(), stages=md, callbacks=[TrajectoryWriter(path, every=2)])
    sim.run([bulk("Cu", cubic=True)])
    steps = [f.info["loop_step"] for f in read_trajectory(path, 0)]
    group = zarr.open_group(str(path), mode="r+")
    for _, frames in group["frames"].arrays():  # the last frame's rows stay in systems/*
        frames.resize((frames.shape[0] - 1,))
    assert [f.info["loop_step"] for f in read_trajectory(path, 0)] == steps[:-1]
    plots.plot_trajectory(path, tmp_path / "t.png")
    assert list(figures["t.png"].axes[1].get_lines()[0].get_xdata()) == steps[:-1]


def test_trajectory_steps_are_each_systems_own(tmp_path: Path, figures: dict) -> None:
    """Room for one system at a time: the second enters when the first has left, so
    its frames come at later loop steps, but the plot's x axis (step of each system)
    counts its own steps: never past the plan's 4, the last frame (the state it left
    the plan in) at 4, for both systems.  ``max_systems=1`` plots the first only."""
    from alchemi_lit.data import SizeAwareSampler

    path = tmp_path / "traj.zarr"
    md = Langevin(dt=2.0, temperature=50.0, friction=0.05, steps=4)
    sim = al.Simulator(model=EMT(), stages=md, callbacks=[TrajectoryWriter(path, every=2)])
    sim.run(SizeAwareSampler([bulk("Cu", cubic=True), bulk("Ni", cubic=True)], max_atoms=4))
    first, second = read_trajectory(path, 0), read_trajectory(path, 1)
    assert second[0].info["loop_step"] > first[-1].info["loop_step"]  # one after the other
    steps = [[f.info["step"] for f in frames] for frames in (first, second)]
    for own, frames in zip(steps, (first, second)):
        assert own == sorted(own) and own[0] >= 0 and own[-1] == 4 and frames[-1].info["final"]
        gaps = {f.info["loop_step"] - f.info["step"] for f in frames}
        assert len(gaps) == 1  # own steps advance with the loop's
    plots.plot_trajectory(path, tmp_path / "t.png")
    lines = figures["t.png"].axes[1].get_lines()
    assert [list(line.get_xdata()) for line in lines] == steps
    plots.plot_trajectory(path, tmp_path / "one.png", max_systems=1)  # the first system only
    (line,) = figures["one.png"].axes[0].get_lines()
    assert line.get_label() == "system 0" and list(line.get_xdata()) == steps[0]


def test_the_cli_report_plots_the_trajectory_it_is_given(tmp_path: Path) -> None:
    """``alchemi-lit report STORE --plots DIR --trajectory TRAJ`` draws trajectory.png
    (a store with no systems committed yet: no other plot)."""
    from test_report_numbers import write_store

    from alchemi_lit.cli import main

    empty = {"system_id": np.zeros(0, int), "energy": np.zeros(0), "n_atoms": np.zeros(0, int)}
    store = write_store(tmp_path / "s.zarr", empty, [])
    traj = tmp_path / "traj.zarr"
    md = Langevin(dt=2.0, temperature=50.0, friction=0.05, steps=2)
    al.Simulator(model=EMT(), stages=md, callbacks=[TrajectoryWriter(traj)]).run([bulk("Cu")])
    argv = ["report", str(store), "--plots", str(tmp_path / "p"), "--trajectory", str(traj)]
    assert main(argv) == 0
    assert [p.name for p in (tmp_path / "p").iterdir()] == ["trajectory.png"]
