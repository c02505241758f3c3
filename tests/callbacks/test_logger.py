"""Logger: the numbers in its reports against ASE on the same states, and its rates
against a fake clock counted by hand."""

from __future__ import annotations

import re
from functools import partial

import numpy as np
import pytest
from ase import Atoms

from alchemi_lit import Simulator
from alchemi_lit.callbacks import HookStageEnum, LambdaCallback, Logger, StepContext
from alchemi_lit.integrators import FIRE, VelocityVerlet
from alchemi_lit.models import LennardJones
from conftest import AseLJ, noisy_argon

REPORT = re.compile(
    r"step +(\d+) \| 0:FIRE=(\d+) (?:1:\w+=(\d+) )?exit=(\d+) \| finished (\d+)/3 \| "
    r"E/atom mean (\S+) min (\S+) max (\S+) eV \| fmax (\S+) eV/Å"
    r"(?: \| NPT P (\S+) GPa, V (\S+) Å\^3 \(mean\))?"
)


#: argon moved by 0.1 Å: forces large enough to read in the reports
argon = partial(noisy_argon, noise=0.1)


def ase_states(ctx: StepContext, rows: list[int]) -> list[Atoms]:
    """The systems of batch ``rows`` as ASE Atoms with ASE's LennardJones attached."""
    b = ctx.batch
    out = []
    for r in rows:
        span = slice(int(b.ptr[r]), int(b.ptr[r + 1]))
        atoms = Atoms(
            numbers=b.atomic_numbers[span].numpy(), positions=b.positions[span].numpy(),
            cell=b.cell[r].numpy(), pbc=b.pbc[r].numpy(),
        )  # fmt: skip
        atoms.set_masses(b.masses[span].numpy())
        atoms.set_velocities(b.velocities[span].numpy())
        atoms.calc = AseLJ(epsilon=0.0104, sigma=3.40, rc=6.0)
        out.append(atoms)
    return out


def test_reports_give_the_energies_forces_and_counts_of_the_active_systems(log_messages):
    """A perfect crystal (no force: done after step 0, the lowest energy per atom) stays in
    the batch at the exit code next to two rattled crystals (bookkeeping only every 8
    steps).  Each report's mean/min/max energy per atom and largest force are ASE's
    LennardJones on the two active systems' states after that step -- the finished one
    counts as finished, not in the statistics.  Printed with 6 decimals (energies) and 4
    digits (fmax): agreement to the printed digits."""
    expected: dict[int, tuple[float, ...]] = {}

    def reference(ctx: StepContext) -> None:
        b = ctx.batch
        active = ((b.status >= 0) & (b.status != ctx.state["exit_code"])).nonzero()
        states = ase_states(ctx, active.flatten().tolist())
        if not states:  # (the last step: every system out)
            return
        epa = [a.get_potential_energy() / len(a) for a in states]
        fmax = max(np.linalg.norm(a.get_forces(), axis=1).max() for a in states)
        expected[ctx.step] = (len(states), np.mean(epa), min(epa), max(epa), fmax)

    Simulator(
        model=LennardJones(0.0104, 3.40, 6.0), stages=FIRE(fmax=1e-4, max_steps=6),
        callbacks=[Logger(every=1), LambdaCallback(HookStageEnum.AFTER_STEP, reference)],
        sync_every=8, precision="64", accelerator="cpu",
    ).run([argon(None), argon(1), argon(2, repeat=(2, 1, 1))])  # fmt: skip
    reports = [REPORT.match(m) for _, m in log_messages if m.startswith("step")]
    assert all(reports[:5]) and sorted(expected) == [0, 1, 2, 3, 4]  # then none active
    for match in reports[:5]:
        step, in_fire, out, finished = (int(match[k]) for k in (1, 2, 4, 5))
        n, mean, lo, hi, fmax = expected[step]
        assert (in_fire, out, finished, n) == (2, 1, 1, 2)
        for printed, value in zip(match.group(6, 7, 8), (mean, lo, hi)):
            assert float(printed) == pytest.approx(value, abs=6e-7)
        assert float(match[9]) == pytest.approx(fmax, rel=6e-4)


class FakeClock:
    """``perf_counter`` advancing 0.5 s at every reading."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        self.now += 0.5
        return self.now


def test_rates_count_steps_and_atom_steps_by_a_fake_clock(log_messages, monkeypatch):
    """The Logger reads its clock at run start, at each report and at run end, 0.5 s apart
    here.  6 MD steps, a report every 2: the report after step 0 covers 1 step in 0.5 s
    (2 steps/s), the next ones 2 steps in 0.5 s (4 steps/s).  At run end the wall time
    is 4 x 0.5 = 2 s and the work 6 steps x (4 + 8) atoms = 72 atom-steps: 36/s."""
    from alchemi_lit.callbacks import logger as logger_module

    monkeypatch.setattr(logger_module, "time", FakeClock())
    Simulator(
        model=LennardJones(0.0104, 3.40, 6.0), stages=VelocityVerlet(dt=1.0, steps=6),
        callbacks=[Logger(every=2)], precision="64", accelerator="cpu",
    ).run([argon(1), argon(2, repeat=(2, 1, 1))])  # fmt: skip
    messages = [m for _, m in log_messages]
    rates = [m.rsplit("| ", 1)[1] for m in messages if m.startswith("step")]
    assert rates == ["2.0 steps/s", "4.0 steps/s", "4.0 steps/s"]
    end = next(m for m in messages if m.startswith("run end"))
    assert "6 steps in 2.00 s | 36 atom-steps/s" in end


def test_the_npt_means_are_over_the_systems_in_the_barostat_stage(log_messages):
    """FIRE then NPT: the perfect crystal leaves FIRE after step 0 and is alone in the
    barostat stage while the rattled ones relax.  The reported NPT pressure and volume
    are its own: ASE's ``-tr(stress)/3`` (LennardJones, ideal-gas term included) and
    ``get_volume`` of its state after that step, to the printed digits (4 and 2
    decimals) -- the FIRE systems' pressures (the stress is computed for all) stay out."""
    from ase.units import GPa

    from alchemi_lit.integrators import NPTLangevin

    expected: dict[int, tuple[float, float]] = {}

    def reference(ctx: StepContext) -> None:
        b = ctx.batch
        (rows,) = (b.status == 1).nonzero(as_tuple=True)  # code 1: the NPT stage
        if len(rows) != 1:
            return
        (atoms,) = ase_states(ctx, rows.tolist())
        stress = atoms.get_stress(voigt=False, include_ideal_gas=True)
        expected[ctx.step] = (-np.trace(stress) / 3 / GPa, atoms.get_volume())

    npt = NPTLangevin(dt=2.0, temperature=60.0, pressure_gpa=0.2, pdamp=200.0, steps=20)
    Simulator(
        model=LennardJones(0.0104, 3.40, 6.0), stages=FIRE(fmax=1e-4, max_steps=5) + npt,
        callbacks=[Logger(every=1), LambdaCallback(HookStageEnum.AFTER_STEP, reference)],
        sync_every=8, precision="64", accelerator="cpu", seed=3,
    ).run([argon(None), argon(1), argon(2, repeat=(2, 1, 1))])  # fmt: skip
    reports = [REPORT.match(m) for _, m in log_messages if m.startswith("step")]
    assert all(reports[:4]) and sorted(expected)[:4] == [0, 1, 2, 3]
    for match in reports[:4]:
        step = int(match[1])
        assert (int(match[2]), int(match[3])) == (2, 1)  # 2 in FIRE, 1 in NPT
        pressure, volume = expected[step]
        assert float(match[10]) == pytest.approx(pressure, abs=6e-5)
        assert float(match[11]) == pytest.approx(volume, abs=6e-3)
