"""Every atom through the model is one that needs it (issue #18, part 1).

With ``sync_every="auto"`` finished systems leave the forward at the next step on CPU
and one step later on a device (where their flags are read a step late, without
waiting), results equal a run that books after every step bit for bit, the step loop
reads no device value, and a positions-only relaxation makes exactly one model
evaluation per step.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import pytest
import torch

import alchemi_lit as al
from alchemi_lit.core import tensor_ops
from alchemi_lit.data import SizeAwareSampler, mixed_argon
from alchemi_lit.engine import cadence as cadence_module
from alchemi_lit.engine.cadence import MAX_AUTO_INTERVAL, Cadence
from alchemi_lit.integrators import FIRE, Langevin, VelocityVerlet
from alchemi_lit.models import LennardJones
from conftest import price_bookkeeping_at_nothing

DATA = mixed_argon(16, 8, 40, seed=11)


class Counting(LennardJones):
    """LJ argon that counts its evaluations and the atoms it is given (``delay``: a
    slower model, so that keeping finished atoms costs more than a bookkeeping)."""

    def __init__(self, delay: float = 0.0) -> None:
        super().__init__(0.0104, 3.40, 6.0)
        self.delay = delay
        self.calls = 0
        self.atoms = 0

    def forward(self, batch, compute_stress=None, neighbors=None):
        self.calls += 1
        self.atoms += batch.num_atoms
        if self.delay:
            time.sleep(self.delay)
        return super().forward(batch, compute_stress=compute_stress, neighbors=neighbors)


def relax(model, sync_every, **kw) -> al.Results:
    sim = al.Simulator(
        model=model, stages=FIRE(fmax=0.05, max_steps=60), sync_every=sync_every, **kw
    )
    return sim.run(SizeAwareSampler(DATA, max_atoms=120))


def needed_atom_evaluations(res: al.Results) -> int:
    """Each system's atoms once per step it took, plus its first evaluation."""
    n = res.batch.n_atoms
    return int((n * (res.stage_steps.sum(1) + 1)).sum())


@pytest.fixture
def bookkeeping_pays(monkeypatch):
    """An expensive model: every bookkeeping costs less than the forward time a finished
    system wastes (the cost rule itself is tested with a fake clock below)."""
    price_bookkeeping_at_nothing(monkeypatch)


@pytest.mark.parametrize("reads_free", [True, False], ids=["cpu", "device-like"])
def test_finished_systems_leave_the_forward_at_once_or_one_step_late_and_results_are_equal(
    bookkeeping_pays, monkeypatch, reads_free
):
    """On CPU the flags are read in the step that sets them: exactly the atoms needed go
    through the model.  Where a read would wait on a device (simulated here), they are
    read a step later: at most one more evaluation per system."""
    monkeypatch.setattr(tensor_ops, "CPU_READS_FREE", reads_free)
    model = Counting()
    auto = relax(model, "auto")
    needed = needed_atom_evaluations(auto)
    if reads_free:
        assert model.atoms == needed, (model.atoms, needed)
    else:
        lag = int(auto.batch.n_atoms.sum())  # one more evaluation per system, at most
        assert needed < model.atoms <= needed + lag, (model.atoms, needed, lag)
    every = Counting()  # (the same path: its results are the same bit for bit)
    each_step = relax(every, 1)
    coarse = Counting()
    relax(coarse, 10)
    assert model.atoms < coarse.atoms  # the fixed cadence keeps finished atoms longer
    for key in ("positions", "velocities", "forces"):
        assert torch.equal(auto.batch.atom[key], each_step.batch.atom[key]), key
    for key in ("energy", "total_steps", "converged", "stage_steps"):
        assert torch.equal(auto.batch.system[key], each_step.batch.system[key]), key


def test_a_positions_only_relaxation_makes_one_evaluation_per_step():
    model = Counting()
    res = relax(model, "auto")
    assert model.calls == res.stats["forward_calls"] == res.stats["steps"] + 1
    assert torch.isnan(res.batch.stress).all()  # not asked for: not computed, not faked
    assert np.isnan(res.to_pandas()["pressure"]).all()
    assert "stress" not in res[0].calc.results

    with_stress = Counting()
    res = relax(with_stress, "auto", stress=True)
    assert with_stress.calls == res.stats["steps"] + 1  # in the step's own forward
    direct = LennardJones(0.0104, 3.40, 6.0)(al.Batch.from_atoms(res.to_atoms()))
    assert torch.allclose(res.batch.stress, direct["stress"], rtol=0, atol=1e-12)


def test_stress_false_with_a_stage_that_needs_it_is_refused():
    class NeedsStress(FIRE):
        requires_stress = True

    sim = al.Simulator(model=Counting(), stages=NeedsStress(), stress=False)
    with pytest.raises(al.ConfigError, match=r"NeedsStress need.*stress=False"):
        sim.run(DATA[:2])


@pytest.fixture
def accelerator_path():
    """The accelerator's path on CPU: branch-free, kernels off, no free host reads."""
    from alchemi_lit.testing import accelerator_path

    with accelerator_path():
        yield


#: where the framework's step loop lives (the model's own internals are its business)
LOOP_CODE = ("engine", "strategies", "hooks.py", "integrators", "convergence.py", "callbacks")


def test_the_step_loop_reads_no_device_value_between_bookkeepings(accelerator_path, monkeypatch):
    from alchemi_lit.engine.run_loop import RunLoop

    reads: list[str] = []
    inside = [False]

    def counted(name):
        original = getattr(torch.Tensor, name)

        def wrapper(self, *args, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            ours = "alchemi_lit" in caller and any(p in caller for p in LOOP_CODE)
            if inside[0] and ours and not getattr(self, "host_buffer", False):
                reads.append(f"{name} from {caller}:{sys._getframe(1).f_lineno}")
            return original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, wrapper)

    for name in ("item", "__bool__", "cpu", "tolist", "numpy"):
        counted(name)
    steps = RunLoop._steps

    def watched(self, ctx, guard):
        inside[0] = True
        try:
            return steps(self, ctx, guard)
        finally:
            inside[0] = False

    monkeypatch.setattr(RunLoop, "_steps", watched)
    plan = FIRE(fmax=0.05, max_steps=30) + Langevin(dt=2.0, temperature=50.0, steps=10)
    sim = al.Simulator(model=Counting(), stages=plan, sync_every="auto")
    res = sim.run(SizeAwareSampler(DATA, max_atoms=120))
    assert len(res) == len(DATA)
    assert not reads, reads[:10]


def test_auto_books_as_soon_as_the_wasted_forward_time_pays_for_it(monkeypatch):
    """A cheap bookkeeping is made at once; an expensive one waits until the finished
    atoms have wasted as much forward time as it costs."""
    clock = [0.0]
    monkeypatch.setattr(cadence_module.time, "perf_counter", lambda: clock[0])
    batch = al.Batch.from_atoms(DATA[:4])  # some finished, the rest not
    batch.status = torch.tensor([1, 0, 0, 0])
    share = int(batch.n_atoms[0]) / batch.num_atoms

    def steps_until_booked(book_s: float) -> int:
        c = Cadence("auto", torch.device("cpu"), on_converge=False)
        c.book_s = book_s
        for n in range(1, 200):
            clock[0] += 1.0  # every step takes one second
            if c.after_step(batch, exit_code=1, exited=None):
                return n
        return -1

    assert steps_until_booked(0.0) == 1  # finished at step 1: seen at once on CPU
    monkeypatch.setattr(tensor_ops, "CPU_READS_FREE", False)
    assert steps_until_booked(0.0) == 2  # where reads wait on a device: one step late
    monkeypatch.setattr(tensor_ops, "CPU_READS_FREE", True)
    waste, waited = 0.0, 0
    while waste < 10.0:  # the finished atoms' share of each one-second step, summed
        waste += 1.0 * share
        waited += 1
    assert waited > 5 and steps_until_booked(10.0) == waited  # (seen from step 1 on)


def test_auto_books_at_once_when_every_system_is_finished(monkeypatch):
    """However dear a bookkeeping was measured (a loaded machine), a batch whose every
    system is finished is booked after the step that finished it: no later step can
    gain anything.  A run of single points thus makes as many forwards on any machine
    (the chunked-workflow test counts them)."""
    batch = al.Batch.from_atoms(DATA[:3])
    batch.status = torch.tensor([1, 1, 1])
    for reads_free, expected in ((True, 1), (False, 2)):  # (one step late off the CPU)
        monkeypatch.setattr(tensor_ops, "CPU_READS_FREE", reads_free)
        c = Cadence("auto", torch.device("cpu"), on_converge=False)
        c.book_s = 1e6  # a bookkeeping far dearer than a step
        booked = [c.after_step(batch, exit_code=1, exited=None) for _ in range(3)]
        assert booked.index(True) + 1 == expected, booked


def test_auto_books_at_once_when_a_system_left_a_stage_and_a_callback_waits_for_it(monkeypatch):
    """ON_CONVERGE callbacks want to hear of an exit soon: with one, a step in which a
    system left a stage is booked (one step late off the CPU), however dear a
    bookkeeping and though nothing is finished; without one, an exit alone books
    nothing."""
    batch = al.Batch.from_atoms(DATA[:3])
    batch.status = torch.tensor([0, 0, 0])  # a system left stage 0 for stage 1
    exited = torch.tensor([False, True, False])
    for reads_free, expected in ((True, 1), (False, 2)):
        monkeypatch.setattr(tensor_ops, "CPU_READS_FREE", reads_free)
        for on_converge in (True, False):
            c = Cadence("auto", torch.device("cpu"), on_converge=on_converge)
            c.book_s = 1e6
            booked = [c.after_step(batch, exit_code=1, exited=exited) for _ in range(3)]
            if on_converge:
                assert booked.index(True) + 1 == expected, booked
            else:
                assert not any(booked), booked


def test_after_a_bookkeeping_the_flags_of_the_batch_before_are_forgotten(monkeypatch):
    """Where the flags are read a step late, the last ones read describe the batch
    before the bookkeeping, whose finished systems have left: the first step after it
    must not book on them (an extra bookkeeping, a sync, after every one)."""
    monkeypatch.setattr(tensor_ops, "CPU_READS_FREE", False)
    before = al.Batch.from_atoms(DATA[:3])
    before.status = torch.tensor([1, 0, 0])
    c = Cadence("auto", torch.device("cpu"), on_converge=False)
    c.booked(0.0)  # (a bookkeeping costs nothing: any finished system is worth one)
    assert [c.after_step(before, exit_code=1, exited=None) for _ in range(2)] == [False, True]
    c.booked(0.0)
    after = al.Batch.from_atoms(DATA[1:3])  # the finished system graduated
    after.status = torch.tensor([0, 0])
    assert not c.after_step(after, exit_code=1, exited=None)


def test_steps_left_before_a_bookkeeping():
    """A fixed ``sync_every`` books at its multiples of the step count, also after a
    step that was cut short; "auto" books at least every MAX_AUTO_INTERVAL steps,
    counted from the last bookkeeping."""
    fixed = Cadence(4, torch.device("cpu"), on_converge=False)
    assert [fixed.steps_left(step) for step in (0, 1, 3, 4, 5, 11)] == [4, 3, 1, 4, 3, 1]
    batch = al.Batch.from_atoms(DATA[:2])
    batch.status = torch.tensor([0, 0])  # nothing finishes
    auto, most = Cadence("auto", torch.device("cpu"), on_converge=False), MAX_AUTO_INTERVAL
    for n in range(most):
        assert auto.steps_left(n) == most - n
        assert not auto.after_step(batch, exit_code=1, exited=None)
    assert auto.steps_left(most) == 0
    auto.booked(0.0)
    assert auto.steps_left(most) == most


class FailsForSystem1FromItsFourthCall(LennardJones):
    """LJ argon that raises on any batch holding system 1 from its fourth call on (the
    forward of the run's third step): that system is quarantined in mid-segment."""

    def __init__(self) -> None:
        super().__init__(0.0104, 3.40, 6.0)
        self.calls = 0

    def forward(self, batch, compute_stress=None, neighbors=None):
        self.calls += 1
        if self.calls >= 4 and bool((batch.system_id == 1).any()):
            raise RuntimeError("descriptor undefined")
        return super().forward(batch, compute_stress=compute_stress, neighbors=neighbors)


def test_a_quarantine_books_at_once_and_the_fixed_cadence_keeps_its_multiples(monkeypatch):
    """A quarantine cuts the segment short (the system leaves before the next forward);
    after it, ``sync_every=4`` books at 4, 8, 12 as before -- not every step from then
    on, nor at 7, 11, 15.  The loop's own step count is the run's."""
    from alchemi_lit.engine.run_loop import RunLoop

    booked_at = []
    graduate = RunLoop._graduate

    def spy(self, ctx):
        booked_at.append(ctx.step)
        return graduate(self, ctx)

    monkeypatch.setattr(RunLoop, "_graduate", spy)
    sim = al.Simulator(
        model=FailsForSystem1FromItsFourthCall(), stages=VelocityVerlet(dt=2.0, steps=12),
        sync_every=4, precision="64", accelerator="cpu",
    )  # fmt: skip
    res = sim.run(DATA[:2])
    assert res.exit_reasons == ["completed", "model_error"]
    assert booked_at == [3, 4, 8, 12]
    assert sim.strategy.run_loop.stats.steps == res.stats["steps"] == 12


def test_a_bookkeepings_time_is_not_counted_as_a_steps(monkeypatch):
    """A step's measured time starts after the bookkeeping before it: a slow
    bookkeeping counted as step time would make the finished atoms' waste look larger
    and book sooner."""
    clock = [0.0]
    monkeypatch.setattr(cadence_module.time, "perf_counter", lambda: clock[0])
    batch = al.Batch.from_atoms(DATA[:2])
    batch.status = torch.tensor([0, 0])
    c = Cadence("auto", torch.device("cpu"), on_converge=False)
    for _ in range(2):
        clock[0] += 1.0  # a step: one second
        c.after_step(batch, exit_code=1, exited=None)
        clock[0] += 10.0  # a bookkeeping: ten
        c.booked(10.0)
    assert (c.step_s, c.book_s) == (1.0, 10.0)
