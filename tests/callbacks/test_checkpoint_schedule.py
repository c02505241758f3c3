"""Checkpoint: when files are written (steps and seconds counted by hand), and what a
fresh run sets aside."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from ase.build import bulk

from alchemi_lit import Simulator
from alchemi_lit.callbacks import Checkpoint, HookStageEnum, LambdaCallback
from alchemi_lit.integrators import VelocityVerlet
from alchemi_lit.models import LennardJones


class Crash(Exception):
    pass


def saved_steps(callback: Checkpoint) -> list[int]:
    return [int(p.stem.split("-")[1]) for p in callback.saved]


def test_a_resumed_run_counts_every_n_steps_from_its_checkpoint(tmp_path: Path) -> None:
    """every=4, bookkeeping every 2 steps, a crash at step 9: the first run
    writes at 4 and 8; the resumed run starts at loop step 8, so its next checkpoints
    are due at 12 and 16 (by hand: 8 + 4, 8 + 8) -- not at its first bookkeeping (10),
    as counting from step 0 would make them."""
    atoms = bulk("Ar", "fcc", a=5.26, cubic=True)
    atoms.positions += np.random.default_rng(0).normal(scale=0.05, size=(4, 3))

    def simulator(*extra) -> tuple[Simulator, Checkpoint]:
        every = Checkpoint(tmp_path / "ckpt", every=4, keep=10)
        return Simulator(
            model=LennardJones(0.0104, 3.40, 6.0), stages=VelocityVerlet(dt=1.0, steps=18),
            callbacks=[every, *extra], sync_every=2, accelerator="cpu",
        ), every  # fmt: skip

    def crash(ctx) -> None:
        if ctx.step == 9:
            raise Crash

    sim, first = simulator(LambdaCallback(HookStageEnum.AFTER_STEP, crash))
    with pytest.raises(Crash):
        sim.run([atoms])
    assert saved_steps(first) == [4, 8]
    sim, resumed = simulator()
    sim.run([atoms], resume=str(tmp_path / "ckpt"))
    assert saved_steps(resumed) == [12, 16]


def test_every_seconds_counts_from_the_last_checkpoint(tmp_path: Path, monkeypatch) -> None:
    """every_seconds=60 on a fake clock: created at t=100, a checkpoint written at
    t=150; the next is due 60 s after that one (t=210), not 60 s after the start."""
    from alchemi_lit.callbacks import checkpoint

    now = [100.0]
    monkeypatch.setattr(checkpoint.time, "monotonic", lambda: now[0])
    timed = Checkpoint(tmp_path, every=None, every_seconds=60.0)
    now[0] = 150.0
    timed.mark_saved(5, tmp_path / "x.ckpt")
    now[0] = 200.0  # 100 s after the start, 50 s after the checkpoint
    assert not timed.due(50)
    now[0] = 210.0
    assert timed.due(51)


def test_a_fresh_run_sets_aside_single_device_and_pipeline_checkpoints(tmp_path: Path) -> None:
    """Both kinds of checkpoint an earlier run leaves (``step-*.ckpt`` of one device,
    ``rank<r>/`` folders of a pipeline) move into one ``earlier-*`` folder; other files
    stay where they are."""
    d = tmp_path / "ckpt"
    (d / "rank0").mkdir(parents=True)
    (d / "rank0" / "round-000003.ckpt").write_bytes(b"r")
    (d / "step-000000000004.ckpt").write_bytes(b"s")
    (d / "notes.txt").write_text("mine")
    target = Checkpoint(d).set_aside_earlier()
    assert target is not None and target.parent == d and target.name.startswith("earlier-")
    assert sorted(p.name for p in target.iterdir()) == ["rank0", "step-000000000004.ckpt"]
    assert (target / "rank0" / "round-000003.ckpt").read_bytes() == b"r"
    assert sorted(p.name for p in d.iterdir()) == sorted(["notes.txt", target.name])
    assert Checkpoint(d).set_aside_earlier() is None  # nothing left to set aside


def test_latest_checkpoint_is_the_highest_step(tmp_path: Path) -> None:
    """``latest_checkpoint`` of a folder is the file of the highest step (zero-padded
    names sort by step: 12 after 8 and 4, whatever order they were made in), a file
    is itself, and a folder without checkpoints is a ConfigError."""
    from alchemi_lit.callbacks import latest_checkpoint
    from alchemi_lit.core.errors import ConfigError

    for step in (8, 12, 4):
        (tmp_path / f"step-{step:012d}.ckpt").write_bytes(b"x")
    (tmp_path / "step-notes.txt").write_text("not a checkpoint")
    assert latest_checkpoint(tmp_path).name == "step-000000000012.ckpt"
    older = tmp_path / "step-000000000004.ckpt"
    assert latest_checkpoint(older) == older
    with pytest.raises(ConfigError, match="no checkpoint found"):
        latest_checkpoint(tmp_path / "empty")
