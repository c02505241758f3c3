"""TrajectoryWriter: what ASE reads back is what was written (cells of any shape, the
systems' own step counts), which frames are written (counted by hand), and when
buffered frames reach the store."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import zarr

from alchemi_lit import Batch, Simulator
from alchemi_lit.callbacks import StepContext, TrajectoryWriter, read_trajectory
from alchemi_lit.integrators import VelocityVerlet
from alchemi_lit.models import LennardJones
from conftest import noisy_argon


def sheared(seed: int):
    """An argon cell with a non-symmetric cell matrix (rows are lattice vectors, as ASE)."""
    atoms = noisy_argon(seed)
    cell = atoms.cell.array @ np.array([[1.0, 0.0, 0.0], [0.21, 1.0, 0.0], [0.07, -0.13, 1.0]])
    atoms.set_cell(cell, scale_atoms=True)
    return atoms


def simulate(stages, writer: TrajectoryWriter, structures) -> None:
    Simulator(
        model=LennardJones(0.0104, 3.40, 6.0), stages=stages, callbacks=[writer],
        precision="64", accelerator="cpu",
    ).run(structures)  # fmt: skip


def test_frames_read_back_by_ase_hold_the_cell_given(tmp_path: Path) -> None:
    """A sheared (non-symmetric) cell comes back from the store as ASE's ``Atoms.cell``
    with lattice vectors as rows, bit for bit: the first frame is the input itself
    (nothing has moved at loop step 0), a transposed cell would differ by the shear."""
    atoms = sheared(0)
    writer = TrajectoryWriter(tmp_path / "t.zarr", every=2, fields=("positions",))
    simulate(VelocityVerlet(dt=1.0, steps=2), writer, [atoms])
    first = read_trajectory(tmp_path / "t.zarr", 0)[0]
    assert first.info["loop_step"] == 0
    np.testing.assert_array_equal(first.cell.array, atoms.cell.array)
    np.testing.assert_array_equal(first.positions, atoms.positions)
    np.testing.assert_array_equal(first.numbers, atoms.numbers)
    assert first.pbc.tolist() == [True, True, True]


def test_frames_count_each_systems_steps_through_every_stage(tmp_path: Path) -> None:
    """Two 3-step stages, a frame every 2 loop steps and the final state: frames at loop
    steps 0, 2, 4 and the final one at 6 (by hand), whose ``step`` -- the steps the
    system had taken -- is the same count, not the stage's own counter (which starts
    again at 0 in the second stage)."""
    writer = TrajectoryWriter(tmp_path / "t.zarr", every=2, fields=("positions",))
    plan = VelocityVerlet(dt=1.0, steps=3, temperature=30.0) + VelocityVerlet(dt=1.0, steps=3)
    simulate(plan, writer, [noisy_argon(0)])
    frames = read_trajectory(tmp_path / "t.zarr", 0)
    assert [f.info["loop_step"] for f in frames] == [0, 2, 4, 6]
    assert [f.info["step"] for f in frames] == [0, 2, 4, 6]
    assert [f.info["final"] for f in frames] == [False, False, False, True]


def test_without_write_final_only_every_steps_are_written(tmp_path: Path) -> None:
    """``write_final=False``: 5 steps, a frame every 2 -- loop steps 0, 2, 4 (by hand),
    no row for the finished state."""
    path = tmp_path / "t.zarr"
    writer = TrajectoryWriter(path, every=2, fields=("positions",), write_final=False)
    simulate(VelocityVerlet(dt=1.0, steps=5), writer, [noisy_argon(0), noisy_argon(1)])
    for sid in (0, 1):
        frames = read_trajectory(path, sid)
        assert [f.info["loop_step"] for f in frames] == [0, 2, 4]
        assert not any(f.info["final"] for f in frames)


def rows_in_store(path: Path) -> int:
    group = zarr.open_group(path, mode="r")
    return 0 if group.get("frames/step") is None else int(group["frames/step"].shape[0])


def test_buffered_frames_reach_the_store_every_flush_every_frames(tmp_path: Path) -> None:
    """``flush_every=2``: frames 1 and 3 stay in the buffer, frames 2 and 4 bring the
    store to 2 and 4 frames (counted by hand)."""
    path = tmp_path / "t.zarr"
    writer = TrajectoryWriter(path, every=1, fields=("positions",), flush_every=2)
    ctx = StepContext(batch=Batch.from_atoms([noisy_argon(0)], dtype=torch.float64))
    writer.on_run_start(ctx)
    stored = []
    for ctx.step in range(4):
        writer.before_step(ctx)
        stored.append(rows_in_store(path))
    assert stored == [0, 2, 2, 4]


def test_a_buffer_of_max_buffer_atoms_is_flushed_at_once(tmp_path: Path) -> None:
    """A buffer holding ``max_buffer_atoms`` atom rows is appended however few frames it
    holds: with the limit at 36 atoms, one frame of 4 + 32 atoms goes to the store at
    once, while frames of 4 atoms wait for flush_every (100)."""
    path = tmp_path / "t.zarr"
    writer = TrajectoryWriter(path, every=1, fields=("positions",), flush_every=100)
    writer.max_buffer_atoms = 36
    batch = Batch.from_atoms([noisy_argon(0), noisy_argon(1, repeat=2)], dtype=torch.float64)
    ctx = StepContext(batch=batch)
    writer.on_run_start(ctx)
    writer.before_step(ctx)
    assert rows_in_store(path) == 1
    small = TrajectoryWriter(tmp_path / "s.zarr", every=1, fields=("positions",), flush_every=100)
    small.max_buffer_atoms = 36
    ctx = StepContext(batch=Batch.from_atoms([noisy_argon(0)], dtype=torch.float64))
    small.on_run_start(ctx)
    for ctx.step in range(8):  # 8 x 4 = 32 atom rows: below the limit
        small.before_step(ctx)
    assert rows_in_store(tmp_path / "s.zarr") == 0
    ctx.step = 8
    small.before_step(ctx)  # 36 rows: at the limit
    assert rows_in_store(tmp_path / "s.zarr") == 9
