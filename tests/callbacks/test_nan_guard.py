"""NaNGuard: a system that turns non-finite gets its last finite state back and leaves;
the others run on exactly as they would without it.  The guard keeps references to
the step's starting tensors, so an integrator writing into them in place must be
caught (it would otherwise "restore" the broken values)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from ase.build import bulk
from loguru import logger

from alchemi_lit import Simulator
from alchemi_lit.callbacks.nan_guard import NAN_CELL, NAN_FORCES, NAN_POSITIONS
from alchemi_lit.core.state import Batch
from alchemi_lit.engine.hooks import HookStageEnum, LambdaCallback
from alchemi_lit.integrators import VelocityVerlet
from alchemi_lit.models import LennardJones

POISONED = 1  # system_id whose forces turn NaN


class PoisonedForces(LennardJones):
    """LJ whose output ``field`` of system 1 turns NaN at evaluation ``at``: the forces
    on its first atom, or its whole stress (energy and forces fine)."""

    field = "forces"

    def __init__(self, at: int | None) -> None:
        super().__init__(epsilon=0.0104, sigma=3.40, cutoff=8.5)
        self.at, self.calls = at, 0

    def forward(self, batch: Batch, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        out = super().forward(batch, *args, **kwargs)
        self.calls += 1
        if self.calls == self.at:
            row = int((batch.system_id == POISONED).nonzero())
            out[self.field] = out[self.field].clone()
            index = int(batch.ptr[row]) if self.field == "forces" else row
            out[self.field][index] = float("nan")
        return out


class InPlaceVerlet(VelocityVerlet):
    """Velocity Verlet that first writes into the step's starting positions in place
    (values unchanged): against the integrator contract, as a careless plugin might."""

    def pre_update(self, batch: Batch, mask: torch.Tensor) -> None:
        batch.positions.mul_(1.0)
        super().pre_update(batch, mask)


def argon(seed: int):
    atoms = bulk("Ar", "fcc", a=5.26, cubic=True)
    atoms.positions += np.random.default_rng(seed).normal(scale=0.05, size=(4, 3))
    atoms.set_momenta(np.random.default_rng(seed + 10).normal(scale=0.2, size=(4, 3)))
    return atoms


def run(at: int | None, stage_cls=VelocityVerlet):
    """Run 3 systems for 6 steps; returns results, each step's starting positions of
    the poisoned system, and the warnings logged."""
    before: list[torch.Tensor] = []

    def keep(ctx) -> None:
        b = ctx.batch
        row = (b.system_id == POISONED).nonzero()
        if len(row):
            r = int(row)
            before.append(b.positions[int(b.ptr[r]) : int(b.ptr[r + 1])].clone())

    sim = Simulator(
        model=PoisonedForces(at),
        stages=stage_cls(dt=1.0, steps=6),
        callbacks=[LambdaCallback(HookStageEnum.BEFORE_PRE_UPDATE, keep)],
        accelerator="cpu",
        precision="64",
    )
    warnings: list[str] = []
    sink = logger.add(lambda m: warnings.append(m.record["message"]), level="WARNING")
    try:
        res = sim.run([argon(0), argon(1), argon(2)])
    finally:
        logger.remove(sink)
    return res, before, warnings


def rows(res, system_id: int) -> torch.Tensor:
    b = res.batch
    r = int((b.system_id == system_id).nonzero())
    return b.positions[int(b.ptr[r]) : int(b.ptr[r + 1])]


def test_non_finite_forces_restore_the_last_finite_state_others_unaffected(code_path):
    clean, _, _ = run(at=None)
    res, before, warnings = run(at=4)  # evaluation 4 = the force call of step 3
    assert res.exit_reasons == ["completed", "non_finite", "completed"]
    b = res.batch
    assert int(b.nan_flags[b.system_id == POISONED]) == NAN_FORCES
    # back to where step 3 started (positions move before the force call)
    assert torch.equal(rows(res, POISONED), before[2])
    assert torch.isfinite(b.forces).all() and torch.isfinite(b.energy).all()
    for sid in (0, 2):  # the others: exactly as in a run without the NaN
        assert torch.equal(rows(res, sid), rows(clean, sid))
    assert not any("NaNGuard" in w for w in warnings)


def test_in_place_writer_is_detected_and_guarded_by_copies(code_path):
    res, before, warnings = run(at=4, stage_cls=InPlaceVerlet)
    guard = [w for w in warnings if w.startswith("NaNGuard")]
    assert len(guard) == 1 and "positions" in guard[0] and "in place" in guard[0]
    assert res.exit_reasons == ["completed", "non_finite", "completed"]
    assert torch.equal(rows(res, POISONED), before[2])  # copies kept since step 1
    clean, _, _ = run(at=None)
    for sid in (0, 2):
        assert torch.equal(rows(res, sid), rows(clean, sid))


def test_in_place_writer_in_the_failing_step_still_quarantines(code_path):
    """Caught in the very step that fails: no copy of its start exists, so the system
    leaves as it is -- quarantined, flagged, and the others unaffected."""
    res, _, warnings = run(at=2, stage_cls=InPlaceVerlet)  # step 1's force call
    assert any(w.startswith("NaNGuard") for w in warnings)
    assert res.exit_reasons == ["completed", "non_finite", "completed"]
    b = res.batch
    assert int(b.nan_flags[b.system_id == POISONED]) == NAN_FORCES
    clean, _, _ = run(at=None)
    assert torch.equal(rows(res, 0), rows(clean, 0))


# ---------------------------------------------------------------- cell relaxations
class PoisonedStress(PoisonedForces):
    field = "stress"


def run_cell(model: LennardJones, poison_cell_at: int | None = None):
    """FIRE with a Frechet cell filter on 3 strained argon cells, 8 steps; returns the
    results and the poisoned system's (positions, cell, cell_ref) at each step's start.
    ``poison_cell_at``: the step after whose force call system 1's cell turns NaN, and
    nothing else, before the guard looks.  (The tests break things in the last step:
    a guard that missed a NaN cell must fail the test, not hand the cell to the next
    forward -- vesin crashes the process on a NaN cell with finite positions.)"""
    from alchemi_lit.callbacks import NaNGuard
    from alchemi_lit.integrators import FIRE

    before: list[tuple[torch.Tensor, ...]] = []

    def keep(ctx) -> None:
        b = ctx.batch
        if not bool((b.system_id == POISONED).any()):
            return  # quarantined and gone
        r = int((b.system_id == POISONED).nonzero())
        span = slice(int(b.ptr[r]), int(b.ptr[r + 1]))
        before.append((b.positions[span].clone(), b.cell[r].clone(), b.cell_ref[r].clone()))

    def poison(ctx) -> None:
        if ctx.step == poison_cell_at:
            cell = ctx.batch.cell.clone()
            cell[int((ctx.batch.system_id == POISONED).nonzero())] = float("nan")
            ctx.batch.cell = cell

    systems = [argon(k) for k in range(3)]
    for k, atoms in enumerate(systems):
        atoms.set_cell(atoms.cell.array * (1.0 + 0.02 * (k + 1)), scale_atoms=True)
    sim = Simulator(
        model=model,
        stages=FIRE(fmax=1e-6, max_steps=8, cell="frechet"),
        callbacks=[
            LambdaCallback(HookStageEnum.BEFORE_PRE_UPDATE, keep),
            LambdaCallback(HookStageEnum.AFTER_COMPUTE, poison),
            NaNGuard(),  # after the poison
        ],
        precision="64",
        sync_every=1,  # graduate at once: no forward after the last step
    )
    return sim.run(systems), before


@pytest.mark.filterwarnings("ignore:invalid value encountered in det:RuntimeWarning")
def test_non_finite_stress_in_a_cell_relaxation_restores_positions_and_cell(code_path):
    """A NaN stress makes the next cell step NaN (cell and positions): the system gets the
    cell, reference cell and positions that step started from, and leaves."""
    clean, _ = run_cell(PoisonedStress(None))
    res, before = run_cell(PoisonedStress(8))  # the force call of step 6 (of 0-7)
    assert res.exit_reasons == ["max_steps", "non_finite", "max_steps"]
    b = res.batch
    r = int((b.system_id == POISONED).nonzero())
    assert int(b.nan_flags[r]) & NAN_CELL and int(b.nan_flags[r]) & NAN_POSITIONS
    positions, cell, _ = before[7]  # step 7 moved the cell with step 6's NaN stress
    assert torch.equal(rows(res, POISONED), positions)
    assert torch.equal(b.cell[r], cell) and not torch.equal(cell, before[0][1])  # it had moved
    for sid in (0, 2):
        assert torch.equal(rows(res, sid), rows(clean, sid))
        assert torch.equal(b.cell[b.system_id == sid], clean.batch.cell[b.system_id == sid])


def test_a_non_finite_cell_alone_is_non_finite(monkeypatch, code_path):
    """A cell turned NaN while positions, energy and forces stay finite is caught,
    flagged as the cell, and restored with its reference cell and cell velocities; the
    others run on untouched."""
    from alchemi_lit.callbacks import nan_guard

    kept: dict[str, torch.Tensor] = {}
    restore = nan_guard.NaNGuard._restore

    def spy(self, b, bad, saved):
        restore(self, b, bad, saved)
        kept.update(cell_ref=b.cell_ref.clone(), v=b.fire_cell_velocities.clone())

    monkeypatch.setattr(nan_guard.NaNGuard, "_restore", spy)
    clean, _ = run_cell(PoisonedStress(None))
    res, before = run_cell(PoisonedStress(None), poison_cell_at=7)
    assert res.exit_reasons == ["max_steps", "non_finite", "max_steps"]
    b = res.batch
    r = int((b.system_id == POISONED).nonzero())
    assert int(b.nan_flags[r]) == NAN_CELL
    positions, cell, cell_ref = before[7]
    assert torch.equal(b.cell[r], cell) and torch.equal(rows(res, POISONED), positions)
    assert torch.equal(kept["cell_ref"][r], cell_ref) and torch.isfinite(kept["v"]).all()
    for sid in (0, 2):
        assert torch.equal(rows(res, sid), rows(clean, sid))


def test_a_cell_written_in_place_with_nan_is_caught(code_path):
    """NVE moves no cell, so the guard tests the cell only where a step replaced it or
    wrote into it.  Here something writes NaN into system 1's cell in place after the
    last force call: the cell is still the tensor the step started with, only its
    version counter tells.  System 1 leaves quarantined, flagged as the cell (its last
    finite state is gone: written in place), the others complete as without it."""
    from alchemi_lit.callbacks import NaNGuard

    def poison(ctx) -> None:
        if ctx.step == 5:
            ctx.batch.cell[int((ctx.batch.system_id == POISONED).nonzero())] = float("nan")

    def simulate(*callbacks):
        return Simulator(
            model=PoisonedForces(None), stages=VelocityVerlet(dt=1.0, steps=6),
            callbacks=[*callbacks, NaNGuard()], precision="64", sync_every=1,
        ).run([argon(0), argon(1), argon(2)])  # fmt: skip

    clean = simulate()
    res = simulate(LambdaCallback(HookStageEnum.AFTER_COMPUTE, poison))
    assert res.exit_reasons == ["completed", "non_finite", "completed"]
    assert int(res.batch.nan_flags[res.batch.system_id == POISONED]) == NAN_CELL
    for sid in (0, 2):
        assert torch.equal(rows(res, sid), rows(clean, sid))
