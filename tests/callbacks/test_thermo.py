"""ThermoMonitor against references: resume bit for bit (the same code run twice) and
hand-worked or ASE values of the quantities it records."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from alchemi_lit import Simulator
from alchemi_lit.callbacks import Checkpoint, HookStageEnum, LambdaCallback, ThermoMonitor
from alchemi_lit.integrators import VelocityVerlet
from alchemi_lit.models import LennardJones
from conftest import noisy_argon


class Crash(Exception):
    pass


def test_a_resumed_run_keeps_the_records_taken_before_its_checkpoint(tmp_path: Path) -> None:
    """Crashed after a checkpoint and resumed, the monitor's series equal an uninterrupted
    run's bit for bit (the same code run twice): the records from before the checkpoint
    come back from it, none is lost or doubled.  (The monitor's state held NumPy arrays,
    which ``torch.load(weights_only=True)`` refuses: no run with a ThermoMonitor could
    resume; and the run start then cleared what a checkpoint had restored.)"""

    def run(folder: str, *extra, resume: bool = False) -> ThermoMonitor:
        monitor = ThermoMonitor(every=2)
        sim = Simulator(
            model=LennardJones(0.0104, 3.40, 6.0),
            stages=VelocityVerlet(dt=2.0, steps=10, temperature=50.0),
            callbacks=[monitor, Checkpoint(tmp_path / folder, every=4), *extra],
            sync_every=2, precision="64", accelerator="cpu",
        )  # fmt: skip
        where = str(tmp_path / folder) if resume else None
        sim.run([noisy_argon(0), noisy_argon(1)], resume=where)
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


def test_records_match_ase_with_the_stress_asked_for_and_fixed_atoms() -> None:
    """``Simulator(stress=True)`` with an NVE stage (no stage needs the stress): every
    record has the pressure.  The last record (the state the system finished in) against
    ASE on that state: ``T`` is ``Atoms.get_temperature`` (3N - 3 with one atom fixed by
    FixAtoms), ``E_kin`` ``get_kinetic_energy``, ``V`` ``get_volume`` and ``P`` (GPa)
    ``-tr(stress)/3`` of ASE's LennardJones with the ideal-gas term.  Tolerance: the
    stress is a float64 sum of a few hundred pair virials of either sign, each below
    0.01 eV (relative rounding ~1e-14 of their magnitude); 1e-9 GPa leaves a wide
    margin and a factor or unit slip (GPa ~ 6e-3 eV/Å^3) is off by orders more."""
    from ase.constraints import FixAtoms
    from ase.units import GPa

    from conftest import AseLJ

    atoms = noisy_argon(3, repeat=2)
    atoms.set_constraint(FixAtoms(indices=[0]))
    momenta = np.random.default_rng(4).normal(scale=0.1, size=(32, 3))
    momenta[0] = 0.0
    atoms.set_momenta(momenta)
    monitor = ThermoMonitor(every=2)
    res = Simulator(
        model=LennardJones(0.0104, 3.40, 6.0), stages=VelocityVerlet(dt=2.0, steps=5),
        callbacks=[monitor], stress=True, precision="64", accelerator="cpu",
    ).run([atoms])  # fmt: skip
    series = monitor.series(0)
    assert series["loop_step"].tolist() == [0, 2, 4, 5]
    assert np.isfinite(series["P"]).all()
    final = atoms.copy()  # the finished state, evaluated by ASE
    out = res.to_atoms()[0]
    final.set_positions(out.positions, apply_constraint=False)
    final.set_momenta(out.get_momenta(), apply_constraint=False)
    final.calc = AseLJ(epsilon=0.0104, sigma=3.40, rc=6.0)
    assert final.get_temperature() == pytest.approx(series["T"][-1], rel=1e-12)
    assert final.get_kinetic_energy() == pytest.approx(series["E_kin"][-1], rel=1e-12)
    assert final.get_volume() == pytest.approx(series["V"][-1], rel=1e-12)
    stress = final.get_stress(voigt=False, include_ideal_gas=True)
    assert series["P"][-1] == pytest.approx(-np.trace(stress) / 3 / GPa, rel=0, abs=1e-9)


def test_steps_count_each_systems_steps_through_every_stage() -> None:
    """Two 3-step stages, a record every step: ``steps`` (the system's own count) and
    ``loop_step`` run 0..6 (by hand: 3 + 3 steps, plus the final state's record at 6),
    not back to 0 when the second stage starts (that is the stage's own counter)."""
    monitor = ThermoMonitor(every=1)
    plan = VelocityVerlet(dt=1.0, steps=3, temperature=30.0) + VelocityVerlet(dt=1.0, steps=3)
    Simulator(
        model=LennardJones(0.0104, 3.40, 6.0), stages=plan, callbacks=[monitor],
        precision="64", accelerator="cpu",
    ).run([noisy_argon(0)])  # fmt: skip
    series = monitor.series(0)
    assert series["loop_step"].tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert series["steps"].tolist() == [0, 1, 2, 3, 4, 5, 6]


def test_without_final_only_every_frequency_steps_are_recorded() -> None:
    """``final=False``: 10 steps, a record every 4 -- loop steps 0, 4, 8 (by hand), no
    extra record of the finished state at step 10."""
    monitor = ThermoMonitor(every=4, final=False)
    Simulator(
        model=LennardJones(0.0104, 3.40, 6.0), stages=VelocityVerlet(dt=1.0, steps=10),
        callbacks=[monitor], precision="64", accelerator="cpu",
    ).run([noisy_argon(0), noisy_argon(1)])  # fmt: skip
    for sid in (0, 1):
        assert monitor.series(sid)["loop_step"].tolist() == [0, 4, 8]
