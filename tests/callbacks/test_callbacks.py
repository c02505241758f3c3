"""Built-in callbacks: Logger, ProgressBar, TrajectoryWriter (zarr round trip), ThermoMonitor."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from ase.build import bulk
from rich.console import Console

from alchemi_lit import Fused, Simulator
from alchemi_lit.callbacks import (
    HookStageEnum,
    LambdaCallback,
    Logger,
    ProgressBar,
    StepContext,
    ThermoMonitor,
    TrajectoryWriter,
    read_trajectory,
    trajectory_system_ids,
)
from alchemi_lit.core import units
from alchemi_lit.integrators import FIRE, VelocityVerlet
from alchemi_lit.models import LennardJones
from conftest import PoisonedLJ

H = HookStageEnum


def lj() -> LennardJones:
    return LennardJones(epsilon=0.0104, sigma=3.40, cutoff=8.5)


def argon(noise: float, seed: int, repeat=1):
    atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(repeat)
    atoms.positions += np.random.default_rng(seed).normal(scale=noise, size=atoms.positions.shape)
    return atoms


def simulator(stages, callbacks, sync_every: int = 1) -> Simulator:
    return Simulator(
        model=lj(),
        stages=stages,
        callbacks=callbacks,
        sync_every=sync_every,
        accelerator="cpu",
        precision="64",
    )


def relax() -> FIRE:
    return FIRE(fmax=5e-3, max_steps=60)  # relax_structures() converge at steps 15, 29, 28


def relax_structures():
    """Three small systems converging at different steps (the batch shrinks as they leave)."""
    return [argon(0.02, 0), argon(0.1, 1, (2, 1, 1)), argon(0.06, 2)]


class Snapshots:
    """LambdaCallback target: host copies of per-system values at BEFORE_STEP."""

    def __init__(self) -> None:
        self.data: dict[int, dict[int, dict[str, np.ndarray]]] = {}

    def __call__(self, ctx: StepContext) -> None:
        b = ctx.batch
        active = (b.status >= 0) & (b.status != ctx.state["exit_code"])
        ptr = b.ptr.tolist()
        temperature, kinetic = b.temperature(), b.kinetic_energy()
        for row in active.nonzero().flatten().tolist():
            sid = int(b.system_id[row])
            self.data.setdefault(sid, {})[ctx.step] = {
                "positions": b.positions[ptr[row] : ptr[row + 1]].numpy().copy(),
                "energy": float(b.energy[row]),
                "temperature": float(temperature[row]),
                "kinetic": float(kinetic[row]),
                "steps": int(b.total_steps[row]),
            }


# ---------------------------------------------------------------------- Logger
def test_logger_reports_stage_counts_and_summary(log_messages) -> None:
    plan = relax() + VelocityVerlet(dt=1.0, steps=5)
    res = simulator(plan, [Logger(every=4)], sync_every=2).run(relax_structures())
    messages = [m for level, m in log_messages if level == "INFO"]
    reports = [m for m in messages if m.startswith("step")]
    steps = res.stats["steps"]
    assert len(reports) == len(range(0, steps, 4))
    first = reports[0]
    assert "0:FIRE=3" in first and "1:VelocityVerlet=0" in first and "exit=0" in first
    assert "finished 0/3" in first and "steps/s" in first and "fmax" in first
    assert "E/atom mean" in first
    assert any("1:VelocityVerlet=" in m and "0:FIRE=0" not in m for m in reports)
    summary = messages[-1]
    assert summary.startswith("run end: 3 systems")
    n_conv = int(res.converged.sum())
    assert f"{n_conv} converged" in summary and "0 quarantined" in summary
    assert "completed=3" in summary and "atom-steps/s" in summary
    assert messages[0].startswith("run start: 3 systems")


def test_logger_level_and_validation(log_messages) -> None:
    plan = Fused([VelocityVerlet(dt=1.0, steps=3)], codes=[4])  # custom status codes
    simulator(plan, [Logger(every=1, level="DEBUG")]).run(argon(0.05, 0))
    reports = [m for level, m in log_messages if level == "DEBUG" and m.startswith("step")]
    assert len(reports) == 3 and "4:VelocityVerlet=1 exit=0" in reports[0]
    with pytest.raises(ValueError, match="every"):
        Logger(every=0)
    with pytest.raises(ValueError, match="unknown loguru level"):
        Logger(level="LOUD")
    with pytest.raises(TypeError):
        Logger(level=None)  # type: ignore[arg-type]


def test_logger_and_trajectory_see_quarantined_systems(log_messages, tmp_path: Path) -> None:
    exited: list[int] = []
    on_exit = LambdaCallback(
        H.ON_CONVERGE, lambda ctx: exited.extend(ctx.batch.system_id[ctx.exited].tolist())
    )
    writer = TrajectoryWriter(tmp_path / "t.zarr", every=100)
    sim = Simulator(
        model=PoisonedLJ(),
        stages=VelocityVerlet(dt=1.0, steps=12),
        callbacks=[Logger(every=100), writer, on_exit],
        sync_every=5,
        accelerator="cpu",
    )
    res = sim.run([argon(0.05, 0), argon(0.05, 1), argon(0.05, 2)])
    assert res.exit_reasons == ["completed", "non_finite", "completed"]
    assert sorted(exited) == [0, 1, 2]  # the quarantined system left its stage too
    summary = [m for _, m in log_messages if m.startswith("run end")][-1]
    assert "3 systems" in summary and "1 quarantined" in summary
    assert "completed=2" in summary and "non_finite=1" in summary
    # MD only: how many completed, not "0 converged"
    assert "3 systems, 2 completed" in summary and "converged" not in summary
    frames = read_trajectory(tmp_path / "t.zarr", 1)
    assert [f.info["final"] for f in frames] == [False, True]
    assert np.isfinite(frames[-1].get_potential_energy())  # the last finite state


# ---------------------------------------------------------------------- ProgressBar
def test_progress_bar_silent_without_tty(capsys) -> None:
    bar = ProgressBar(every=1)  # pytest captures stdout: not a terminal
    simulator(VelocityVerlet(dt=1.0, steps=3), [bar]).run(argon(0.05, 0))
    assert not bar.active
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""

    out = io.StringIO()
    off = ProgressBar(enable=False, console=Console(force_terminal=True, file=out))
    simulator(VelocityVerlet(dt=1.0, steps=3), [off]).run(argon(0.05, 0))
    assert out.getvalue() == ""


def test_progress_bar_on_a_terminal() -> None:
    out = io.StringIO()
    bar = ProgressBar(every=2, console=Console(force_terminal=True, file=out, width=120))
    started: list[bool] = []
    cb = LambdaCallback(H.AFTER_STEP, lambda ctx: started.append(bar.active))
    simulator(relax(), [bar, cb], sync_every=2).run(relax_structures())
    assert started and all(started)
    assert not bar.active  # stopped at run end
    text = out.getvalue()
    assert "3/3" in text and "steps/s" in text and "atom-steps/s" in text
    with pytest.raises(ValueError, match="every"):
        ProgressBar(every=0)
    with pytest.raises(TypeError, match="Console"):
        ProgressBar(console=io.StringIO())  # type: ignore[arg-type]


def test_progress_bar_stopped_when_the_run_fails() -> None:
    bar = ProgressBar(every=1, console=Console(force_terminal=True, file=io.StringIO()))

    def explode(ctx: StepContext) -> None:
        if ctx.step == 2:
            raise RuntimeError("boom")

    sim = simulator(VelocityVerlet(dt=1.0, steps=10), [bar, LambdaCallback(H.AFTER_STEP, explode)])
    with pytest.raises(RuntimeError, match="boom"):
        sim.run(argon(0.05, 0))
    assert not bar.active


# ---------------------------------------------------------------------- TrajectoryWriter
def test_trajectory_round_trip_with_changing_batch(tmp_path: Path) -> None:
    path = tmp_path / "traj.zarr"
    snaps = Snapshots()
    every = 3
    writer = TrajectoryWriter(path, every=every, fields=("positions", "energy", "forces"))
    record = LambdaCallback(H.BEFORE_STEP, snaps, every=every)
    res = simulator(relax(), [writer, record], sync_every=2).run(relax_structures())
    assert sorted(set(res.steps.tolist())) == sorted(res.steps.tolist())  # leave at different steps
    assert trajectory_system_ids(path).tolist() == [0, 1, 2]
    import zarr

    store = zarr.open_group(path, mode="r")
    n_systems = store["frames/n_systems"][:]
    assert n_systems[0] == 3 and n_systems.min() == 1  # frames of changing composition
    assert store["frames/step"].shape == n_systems.shape
    assert store["systems/system_id"].shape[0] == n_systems.sum()
    final_atoms = {a.info["system_id"]: a for a in res.to_atoms()}
    for sid, expected in snaps.data.items():
        frames = read_trajectory(path, sid)
        regular = [f for f in frames if not f.info["final"]]
        assert [f.info["loop_step"] for f in regular] == sorted(expected)
        assert [f.info["loop_step"] % every for f in regular] == [0] * len(regular)
        for frame in regular:
            snap = expected[frame.info["loop_step"]]
            np.testing.assert_array_equal(frame.positions, snap["positions"])
            assert frame.get_potential_energy() == snap["energy"]
            assert frame.info["step"] == snap["steps"]
            assert len(frame) == len(snap["positions"])
        # the state the system finished in comes last, once
        assert [f.info["final"] for f in frames].count(True) == 1 and frames[-1].info["final"]
        last, ref = frames[-1], final_atoms[sid]
        assert last.info["step"] == int(res.steps[res.system_id == sid])
        np.testing.assert_allclose(last.positions, ref.positions, rtol=0, atol=1e-12)
        np.testing.assert_allclose(last.get_forces(), ref.get_forces(), rtol=0, atol=1e-12)
        np.testing.assert_array_equal(last.numbers, ref.numbers)
        np.testing.assert_allclose(last.cell.array, ref.cell.array)
    with pytest.raises(KeyError, match="system 99"):
        read_trajectory(path, 99)


def test_trajectory_refuses_to_overwrite_and_appends(tmp_path: Path) -> None:
    path = tmp_path / "md.zarr"
    plan = VelocityVerlet(dt=1.0, steps=4, temperature=40.0)
    fields = ("positions", "velocities", "temperature")
    simulator(plan, [TrajectoryWriter(str(path), every=2, fields=fields)]).run(argon(0.05, 0))
    first = read_trajectory(path, 0)
    assert [f.info["loop_step"] for f in first] == [0, 2, 4]
    assert [f.info["run"] for f in first] == [0, 0, 0]
    assert first[1].info["temperature"] > 0
    np.testing.assert_allclose(first[1].get_temperature(), first[1].info["temperature"])

    with pytest.raises(FileExistsError) as err:
        TrajectoryWriter(path, every=2, fields=fields)
    assert str(path) in str(err.value)
    assert "mode='a'" in str(err.value) and "overwrite=True" in str(err.value)

    with pytest.raises(ValueError, match="same fields"):
        TrajectoryWriter(path, mode="a", fields=("positions",))

    simulator(plan, [TrajectoryWriter(path, every=2, fields=fields, mode="a")]).run(argon(0.05, 0))
    both = read_trajectory(path, 0)
    assert [f.info["run"] for f in both] == [0, 0, 0, 1, 1, 1]
    for a, b in zip(both[:3], both[3:]):  # same seed, same input: the same trajectory
        np.testing.assert_array_equal(a.positions, b.positions)

    simulator(plan, [TrajectoryWriter(path, every=4, fields=fields, overwrite=True)]).run(
        argon(0.05, 0)
    )
    assert [f.info["loop_step"] for f in read_trajectory(path, 0)] == [0, 4]


def test_trajectory_flushed_when_the_run_fails(tmp_path: Path) -> None:
    def explode(ctx: StepContext) -> None:
        if ctx.step == 5:
            raise RuntimeError("boom")

    writer = TrajectoryWriter(tmp_path / "t.zarr", every=2, flush_every=100)
    sim = simulator(
        VelocityVerlet(dt=1.0, steps=10), [writer, LambdaCallback(H.AFTER_STEP, explode)]
    )
    with pytest.raises(RuntimeError, match="boom"):
        sim.run(argon(0.05, 0))
    assert [f.info["loop_step"] for f in read_trajectory(tmp_path / "t.zarr", 0)] == [0, 2, 4]


def test_trajectory_append_after_an_interrupted_flush(tmp_path: Path) -> None:
    import zarr

    path = tmp_path / "t.zarr"
    plan = VelocityVerlet(dt=1.0, steps=4)
    simulator(plan, [TrajectoryWriter(path, every=2)]).run(argon(0.05, 0))
    store = zarr.open_group(path, mode="r+")  # a flush killed half-way through systems/*
    store["atoms/positions"].append(np.zeros((4, 3)), axis=0)
    store["systems/energy"].append(np.zeros(1), axis=0)
    simulator(plan, [TrajectoryWriter(path, every=2, mode="a")]).run(argon(0.05, 0))
    frames = read_trajectory(path, 0)
    assert [f.info["run"] for f in frames] == [0, 0, 0, 1, 1, 1]
    for a, b in zip(frames[:3], frames[3:]):
        np.testing.assert_array_equal(a.positions, b.positions)
        assert a.get_potential_energy() == b.get_potential_energy()
    # a flush killed after atoms/* and systems/* but before frames/* (written last):
    # the rows of the frame not listed yet are left out by readers
    n = int(store["systems/n_atoms"][-1])
    for part, rows in (("atoms", n), ("systems", 1)):
        for _, arr in store[part].arrays():  # the last frame's rows once more
            arr.append(arr[arr.shape[0] - rows :], axis=0)
    store["systems/frame"][-1] = store["frames/step"].shape[0]  # the unlisted frame
    assert [f.info["loop_step"] for f in read_trajectory(path, 0)] == [
        f.info["loop_step"] for f in frames
    ]


def test_trajectory_state_counts_only_rows_in_the_store(tmp_path: Path) -> None:
    """A checkpoint records the trajectory rows a resume rolls back to: they are in the
    store when it is taken (a run killed right after it, with frames still buffered,
    must not leave a resume counting rows that were never written)."""
    import zarr

    from alchemi_lit import Batch

    path = tmp_path / "t.zarr"
    writer = TrajectoryWriter(path, every=1, fields=("positions",), flush_every=100)
    ctx = StepContext(batch=Batch.from_atoms([argon(0.05, 0), argon(0.05, 1, repeat=2)]))
    writer.on_run_start(ctx)
    for ctx.step in (0, 1):
        writer.before_step(ctx)
    counts = writer.state_dict()["counts"]
    assert counts == {"frames": 2, "systems": 4, "atoms": 2 * (4 + 32)}
    store = zarr.open_group(path, mode="r")  # (read before the writer closes)
    for part, n in counts.items():
        for name, arr in store[part].arrays():
            assert arr.shape[0] == n, f"{part}/{name}"


def test_trajectory_argument_validation(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="every"):
        TrajectoryWriter(tmp_path / "a.zarr", every=0)
    with pytest.raises(TypeError, match="path"):
        TrajectoryWriter(123)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="positions"):
        TrajectoryWriter(tmp_path / "a.zarr", fields=("energy",))
    with pytest.raises(ValueError, match="always written"):
        TrajectoryWriter(tmp_path / "a.zarr", fields=("positions", "cell"))
    with pytest.raises(ValueError, match="mode"):
        TrajectoryWriter(tmp_path / "a.zarr", mode="x")  # type: ignore[arg-type]
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(FileExistsError, match="not a directory"):
        TrajectoryWriter(tmp_path / "file.txt")
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("x")
    with pytest.raises(FileExistsError, match="not a zarr store"):
        TrajectoryWriter(other, overwrite=True)
    writer = TrajectoryWriter(tmp_path / "b.zarr", fields=("positions", "no_such_field"))
    with pytest.raises(ValueError, match="unknown field 'no_such_field'"):
        simulator(VelocityVerlet(dt=1.0, steps=2), [writer]).run(argon(0.05, 0))


# ---------------------------------------------------------------------- ThermoMonitor
def test_thermo_monitor_series_match_batch() -> None:
    snaps = Snapshots()
    monitor = ThermoMonitor(every=4)
    record = LambdaCallback(H.BEFORE_STEP, snaps, every=4)
    plan = VelocityVerlet(dt=2.0, steps=14, temperature=60.0)
    structures = [argon(0.02, 0), argon(0.02, 1, (2, 1, 1))]
    simulator(plan, [monitor, record], sync_every=7).run(structures)
    assert monitor.system_ids.tolist() == [0, 1]
    for sid, expected in snaps.data.items():
        series = monitor.series(sid)
        keys = {"steps", "loop_step", "T", "T_internal", "E_kin", "E_pot", "E_tot", "P", "V"}
        assert set(series) == keys
        assert np.isnan(series["P"]).all()  # no stage computes the stress (test_npt: one does)
        assert np.all(series["V"] == series["V"][0]) and series["V"][0] > 0
        assert series["loop_step"].tolist() == [0, 4, 8, 12, 14]  # 14: the final state
        assert series["steps"].tolist() == [0, 4, 8, 12, 14]
        steps = sorted(expected)
        np.testing.assert_array_equal(series["T"][:-1], [expected[s]["temperature"] for s in steps])
        np.testing.assert_array_equal(series["E_kin"][:-1], [expected[s]["kinetic"] for s in steps])
        np.testing.assert_array_equal(series["E_pot"][:-1], [expected[s]["energy"] for s in steps])
        np.testing.assert_allclose(series["E_tot"], series["E_kin"] + series["E_pot"])
        assert series["T"][1] > 0
        # NVE: total energy conserved to well below the kinetic energy
        assert np.ptp(series["E_tot"]) < 0.02 * series["E_kin"][1:].mean()
    with pytest.raises(KeyError, match="no record of system 7"):
        monitor.series(7)
    with pytest.raises(ValueError, match="every"):
        ThermoMonitor(every=0)
    flat = monitor.records()
    assert len(flat["T"]) == 10 and torch.is_tensor(flat["T"]) is False


def test_thermo_monitor_labels_both_temperatures() -> None:
    """``T`` counts 3N degrees of freedom (what thermostats hold at the target, ASE's
    get_temperature), ``T_internal`` 3N - 3 about the centre of mass: a user comparing
    "59.9 K at 60 K" with the README's "3 % hot at 32 atoms" sees both, labelled."""
    from ase.constraints import FixAtoms, FixCom

    from alchemi_lit import Batch
    from alchemi_lit.callbacks.thermo import internal_temperature

    still, drifting, anchored = (argon(0.02, k, (2, 2, 2)) for k in range(3))
    anchored.set_constraint(FixAtoms(indices=[0]))
    for k, atoms in enumerate((still, drifting, anchored)):
        kt = np.sqrt(atoms.get_masses() * units.kB * 60.0)[:, None]
        atoms.set_momenta(np.random.default_rng(k).normal(size=(32, 3)) * kt)
    still.set_momenta(still.get_momenta() - still.get_momenta().mean(0))  # at rest as a whole
    drifting.set_momenta(drifting.get_momenta() + np.array([0.3, -0.2, 0.1]))  # it all moves
    t = internal_temperature(Batch.from_atoms([still, drifting, anchored], dtype=torch.float64))
    reference = still.copy()
    reference.set_constraint(FixCom())  # ASE: 3N - 3 degrees of freedom
    np.testing.assert_allclose(t[0], reference.get_temperature(), rtol=1e-12)
    np.testing.assert_allclose(t[0], still.get_temperature() * 32 / 31, rtol=1e-12)
    p, m = drifting.get_momenta(), drifting.get_masses()
    inner = 0.5 * ((p - m[:, None] * p.sum(0) / m.sum()) ** 2 / m[:, None]).sum()
    np.testing.assert_allclose(t[1], 2 * inner / (93 * units.kB), rtol=1e-12)
    assert t[1] < drifting.get_temperature()  # the drift is not heat
    np.testing.assert_allclose(t[2], anchored.get_temperature(), rtol=1e-12)  # T itself

    monitor = ThermoMonitor(every=3)  # NVE conserves the momentum: N/(N - 1) all along
    simulator(VelocityVerlet(dt=2.0, steps=9, temperature=60.0), [monitor]).run([still])
    series = monitor.series(0)
    np.testing.assert_allclose(series["T_internal"], series["T"] * 32 / 31, rtol=1e-9)
