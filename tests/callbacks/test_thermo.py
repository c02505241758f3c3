"""ThermoMonitor against references: resume bit for bit (the same code run twice) and
hand-worked or ASE values of the quantities it records."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from ase.build import bulk

from alchemi_lit import Simulator
from alchemi_lit.callbacks import Checkpoint, HookStageEnum, LambdaCallback, ThermoMonitor
from alchemi_lit.integrators import VelocityVerlet
from alchemi_lit.models import LennardJones


def argon(seed: int, repeat: int = 1):
    atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(repeat)
    atoms.positions += np.random.default_rng(seed).normal(scale=0.05, size=atoms.positions.shape)
    return atoms


class Crash(Exception):
    pass


def test_a_resumed_run_keeps_the_records_taken_before_its_checkpoint(tmp_path: Path) -> None:
    """Crashed after a checkpoint and resumed, the monitor's series equal an uninterrupted
    run's bit for bit (the same code run twice): the records from before the checkpoint
    come back from it, none is lost or doubled.  (The monitor's state held NumPy arrays,
    which ``torch.load(weights_only=True)`` refuses: no run with a ThermoMonitor could
    resume; and the run start then cleared what a checkpoint had restored.)"""

    def run(folder: str, *extra, resume: bool = False) -> ThermoMonitor:
        monitor = ThermoMonitor(frequency=2)
        sim = Simulator(
            model=LennardJones(0.0104, 3.40, 6.0),
            stages=VelocityVerlet(dt=2.0, steps=10, temperature=50.0),
            callbacks=[monitor, Checkpoint(tmp_path / folder, every_n_steps=4), *extra],
            sync_every=2, precision="64", accelerator="cpu",
        )  # fmt: skip
        where = str(tmp_path / folder) if resume else None
        sim.run([argon(0), argon(1)], resume=where)
        return monitor

    def crash(ctx) -> None:
        if ctx.step == 6:  # after the checkpoint at step 4
            raise Crash

    whole = run("whole")
    with pytest.raises(Crash):
        run("crashed", LambdaCallback(HookStageEnum.AFTER_STEP, crash))
    resumed = run("crashed", resume=True)
    assert resumed.system_ids.tolist() == whole.system_ids.tolist() == [0, 1]
    for sid in (0, 1):
        a, b = whole.series(sid), resumed.series(sid)
        assert a["loop_step"].tolist() == [0, 2, 4, 6, 8, 10]
        for key in a:
            np.testing.assert_array_equal(b[key], a[key], err_msg=key)
