"""Fused multi-stage runs, inflight batching and sinks on one device (issue 4)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import alchemi_lit as al
from alchemi_lit.callbacks import Callback
from alchemi_lit.core.errors import StructureError
from alchemi_lit.data import SizeAwareSampler, mixed_argon
from alchemi_lit.integrators import FIRE, Langevin, VelocityVerlet
from alchemi_lit.integrators.stages import Fused
from alchemi_lit.models import LennardJones

CUTOFF = 6.0  # short LJ cutoff keeps these tests fast; physics is checked elsewhere


def lj() -> LennardJones:
    return LennardJones(epsilon=0.0104, sigma=3.40, cutoff=CUTOFF)


def relax() -> FIRE:
    return FIRE(fmax=0.05, max_steps=60)


def heat() -> Langevin:
    return Langevin(dt=2.0, temperature=300.0, friction=0.02, steps=25)


def cool() -> FIRE:
    return FIRE(fmax=0.08, max_steps=40)


FIELDS = (
    "positions",
    "velocities",
    "forces",
    "energy",
    "total_steps",
    "stage_steps",
    "stage_exit",
    "exit_code",
    "converged",
)


def assert_same_state(a: al.Batch, b: al.Batch, atol: float = 0.0) -> None:
    assert a.system_id.tolist() == b.system_id.tolist()
    for name in FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        if x.is_floating_point():
            torch.testing.assert_close(x, y, atol=atol, rtol=0, msg=name)
        else:
            assert torch.equal(x, y), name


# ---------------------------------------------------------------------- composition
def test_plus_builds_printable_fused_plans() -> None:
    plan = relax() + heat() + cool()
    assert repr(plan) == "Fused([0:FIRE, 1:Langevin, 2:FIRE], entry=0, exit=3)"
    assert repr(relax() + (heat() + cool())) == repr(plan)  # a fused plan appends
    explicit = Fused([relax(), heat()], codes=[5, 9], exit=11)
    assert repr(explicit) == "Fused([5:FIRE, 9:Langevin], entry=5, exit=11)"
    assert explicit.next_code(0) == 9 and explicit.next_code(1) == 11
    with pytest.raises(ValueError, match="collides"):
        Fused([relax()], codes=[3], exit=3)


def test_explicit_status_codes_run_like_default_codes() -> None:
    data = mixed_argon(6, 8, 30, seed=3)
    a = al.Simulator(model=lj(), stages=relax() + heat(), sync_every=3).run(data)
    b = al.Simulator(
        model=lj(), stages=Fused([relax(), heat()], codes=[4, 7], exit=9), sync_every=3
    ).run(data)
    assert_same_state(a.batch, b.batch)
    assert b.batch.status.tolist() == [9] * 6


# ---------------------------------------------------------------------- execution
def test_fused_plan_equals_stages_run_one_after_another_alone() -> None:
    """32 systems through relax+heat+cool == each system alone through three runs."""
    data = mixed_argon(32, 8, 40, seed=11)
    fused = al.Simulator(model=lj(), stages=relax() + heat() + cool(), seed=7, sync_every=4)
    together = fused.run(data).batch
    for k in (0, 5, 17, 31):
        state = al.Batch.from_atoms([data[k]], system_ids=[k])
        for stage in (relax(), heat(), cool()):
            state = al.Simulator(model=lj(), stages=stage, seed=7, sync_every=4).run(state).batch
        mine = together.select([k])
        torch.testing.assert_close(mine.positions, state.positions, atol=1e-12, rtol=0)
        torch.testing.assert_close(mine.velocities, state.velocities, atol=1e-12, rtol=0)
        assert mine.total_steps.item() == state.total_steps.item()


def test_one_forward_per_step_whatever_the_number_of_stages() -> None:
    calls = []

    class Counting(LennardJones):
        def forward(self, batch, *args, **kwargs):
            calls.append(batch.num_systems)
            return super().forward(batch, *args, **kwargs)

    data = mixed_argon(8, 8, 30, seed=2)
    sim = al.Simulator(
        model=Counting(0.0104, 3.40, CUTOFF), stages=relax() + heat() + cool(), sync_every=1
    )
    res = sim.run(data)
    assert res.stats["forward_calls"] == res.stats["steps"] + 1
    assert len(calls) == res.stats["forward_calls"]


def test_integrator_state_of_systems_in_other_stages_is_untouched() -> None:
    """While a system sits in MD, FIRE's fields for it keep the values it left with."""
    data = mixed_argon(6, 8, 30, seed=5)
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    class Watch(Callback):
        def before_step(self, ctx):
            seen.append((ctx.batch.status.clone(), ctx.batch.fire_dt.clone()))

    al.Simulator(model=lj(), stages=relax() + heat(), callbacks=[Watch()], sync_every=50).run(data)
    for (s0, dt0), (s1, dt1) in itertools.pairwise(seen):
        in_md = (s0 == 1) & (s1 == 1)
        assert torch.equal(dt0[in_md], dt1[in_md])


def test_optimizer_exit_zeroes_velocities_and_md_draws_maxwell_boltzmann() -> None:
    data = mixed_argon(4, 20, 30, seed=8)
    snaps = []

    class Watch(Callback):
        def after_step(self, ctx):
            b = ctx.batch
            entered = (b.status == 1) & (b.step == 0)
            if bool(entered.any()):
                snaps.append(b.kinetic_energy()[entered])

    al.Simulator(model=lj(), stages=relax() + heat(), callbacks=[Watch()], sync_every=1).run(data)
    assert snaps and all(bool((k > 0).all()) for k in snaps)  # MB velocities drawn on entry


# ---------------------------------------------------------------------- inflight
def test_inflight_every_system_once_within_budgets() -> None:
    data = mixed_argon(200, 8, 200, seed=1)
    budget = 2000
    peaks = {"atoms": 0, "systems": 0}

    class Budget(Callback):
        def before_step(self, ctx):
            peaks["atoms"] = max(peaks["atoms"], ctx.batch.num_atoms)
            peaks["systems"] = max(peaks["systems"], ctx.batch.num_systems)

    sim = al.Simulator(
        model=LennardJones(0.0104, 3.40, 4.5),
        stages=FIRE(fmax=0.1, max_steps=15) + VelocityVerlet(dt=2.0, steps=3),
        callbacks=[Budget()],
        sync_every=5,
    )
    res = sim.run(SizeAwareSampler(data, max_atoms=budget, max_systems=40))
    assert sorted(res.system_id.tolist()) == list(range(200))
    assert peaks["atoms"] <= budget and peaks["systems"] <= 40
    occupancy = res.stats["atom_occupancy"]
    assert 0.3 < occupancy <= 1.0
    print(f"mean atom-slot occupancy by active systems: {occupancy:.2f}")


def test_refills_keep_within_the_system_budget() -> None:
    """Small systems whose atoms never fill the budget: the system budget binds, at the
    first fill and at every refill as systems graduate (the test above never reaches
    its system budget: its systems average ~100 atoms, 20 to the 2000-atom budget)."""
    data = mixed_argon(10, 8, 8, seed=2)
    peak = [0]

    class Budget(Callback):
        def before_step(self, ctx):
            peak[0] = max(peak[0], ctx.batch.num_systems)

    sim = al.Simulator(model=lj(), stages=FIRE(fmax=1e-9, max_steps=1), callbacks=[Budget()],
                       sync_every=1)  # fmt: skip
    res = sim.run(SizeAwareSampler(data, max_atoms=10_000, max_systems=3))
    assert sorted(res.system_id.tolist()) == list(range(10))
    assert peak[0] == 3


def test_sampler_lets_small_systems_pass_a_large_one_for_a_while() -> None:
    """First fit: while a large system waits for room, smaller ones behind it use the
    room that is free -- but only MAX_PASSED times, then the room is kept for it; every
    system comes out once, and a checkpointed sampler continues the same way."""
    from ase import Atoms

    def cluster(n: int) -> Atoms:
        return Atoms(f"Ar{n}", positions=np.arange(3 * n).reshape(n, 3) * 4.0)

    sizes = [10, 60, 10, 10, 10, 10]
    sampler = SizeAwareSampler([cluster(n) for n in sizes], max_atoms=60)
    _, ids = sampler.take(free_atoms=15, free_systems=10)
    assert ids == [0]
    _, ids = sampler.take(free_atoms=25, free_systems=10)  # 60 waits; two 10s pass it
    assert ids == [2, 3]
    clone = SizeAwareSampler([cluster(n) for n in sizes], max_atoms=60)
    clone.load_state_dict(sampler.state_dict())
    sampler.MAX_PASSED = clone.MAX_PASSED = 1  # (it was passed once): keep room for it now
    for s in (sampler, clone):
        assert s.take(free_atoms=15, free_systems=10)[1] == []
        assert s.take(free_atoms=60, free_systems=10)[1] == [1]
        assert s.take(free_atoms=60, free_systems=10)[1] == [4, 5]
        assert s.exhausted
    # the window bounds the systems passed, not those taken: a fill takes all that fit
    many = SizeAwareSampler([cluster(2)] * 600, max_atoms=2000)
    assert len(many.take(free_atoms=2000, free_systems=10**6)[1]) == 600


def test_inflight_results_equal_each_system_alone() -> None:
    data = mixed_argon(12, 8, 40, seed=4)
    plan = lambda: relax() + heat()  # noqa: E731
    res = al.Simulator(model=lj(), stages=plan(), sync_every=3).run(
        SizeAwareSampler(data, max_atoms=120)
    )
    for k in (0, 7, 11):
        alone = al.Simulator(model=lj(), stages=plan(), sync_every=3).run(
            al.Batch.from_atoms([data[k]], system_ids=[k])
        )
        assert_same_state(res.batch.select([k]), alone.batch)


def test_system_larger_than_budget_is_an_error_before_the_run() -> None:
    data = mixed_argon(5, 8, 50, seed=2)
    with pytest.raises(StructureError, match=r"system \d+ \(system_id \d+\) has \d+ atoms, more"):
        SizeAwareSampler(data, max_atoms=20)
    big = next(k for k, a in enumerate(data) if len(a) > 20)  # by position and by its id
    with pytest.raises(StructureError, match=rf"system {big} \(system_id {10 + big}\) has"):
        SizeAwareSampler(data, max_atoms=20, system_ids=range(10, 10 + len(data)))


def test_invalid_structure_in_dataset_named_before_run() -> None:
    data = mixed_argon(4, 8, 20, seed=2)
    data[2].positions[0, 0] = np.nan
    sim = al.Simulator(model=lj(), stages=relax())
    with pytest.raises(StructureError, match="system 2"):
        sim.run(SizeAwareSampler(data, max_atoms=100))
    res = sim.run(SizeAwareSampler(data, max_atoms=100, skip_invalid=True))
    assert sorted(res.system_id.tolist()) == [0, 1, 3]


def test_skip_invalid_leaves_out_oversize_structures_and_the_summary_says_why(
    log_messages, tmp_path
) -> None:
    """``skip_invalid=True`` used to raise for a structure above max_atoms all the same."""
    from alchemi_lit.report import read_store_runs
    from alchemi_lit.sinks import ZarrSink

    data = mixed_argon(4, 8, 20, seed=2)  # 18, 18, 20 and 9 atoms
    too_big = r"system 2 \(system_id 2\) has 20 atoms.*or pass skip_invalid=True"
    with pytest.raises(StructureError, match=too_big):
        SizeAwareSampler(data, max_atoms=19)
    data[3].positions[0, 0] = np.nan
    store = ZarrSink(tmp_path / "r.zarr")
    sim = al.Simulator(model=lj(), stages=relax(), sinks=[store])
    res = sim.run(SizeAwareSampler(data, max_atoms=19, skip_invalid=True, system_ids=[5, 6, 7, 8]))
    assert sorted(res.system_id.tolist()) == [5, 6]
    said = [m for level, m in log_messages if level == "WARNING" and m.startswith("skipping")]
    assert "system 2 (system_id 7): 20 atoms, more than max_atoms=19" in said[0]
    assert "system 3 (system_id 8): non-finite" in said[1]
    skipped = [(s["system_id"], s["reason"]) for s in res.stats["skipped"]]
    assert skipped[0] == (7, "20 atoms, more than max_atoms=19")
    assert skipped[1][0] == 8 and skipped[1][1].startswith("non-finite (NaN/inf) coordinates")
    assert read_store_runs(tmp_path / "r.zarr")[-1]["stats"]["skipped"][0] == {
        "index": 2, "system_id": 7, "reason": "20 atoms, more than max_atoms=19"
    }  # fmt: skip
    edges = SizeAwareSampler(data[:3], max_atoms=100, max_edges=70, skip_invalid=True)
    edges.bind(CUTOFF)
    assert (
        len(edges) == 2
        and "73 neighbour pairs, more than max_edges=70" in (edges.skipped[0]["reason"])
    )


class FailsOn27Atoms(LennardJones):
    """LJ that cannot evaluate a batch holding a 27-atom system (as an MLIP whose
    descriptor is undefined for one structure)."""

    def forward(self, batch, *args, **kwargs):
        if bool((batch.n_atoms == 27).any()):
            raise RuntimeError("descriptor undefined")
        return super().forward(batch, *args, **kwargs)


@pytest.mark.parametrize(("order", "max_atoms"), [((0, 1, 0), 200), ((0, 0, 1, 0), 64)])
def test_a_quarantine_is_logged_once(log_messages, order, max_atoms: int) -> None:
    """At the run's first evaluation (it used to be logged again by the first step's,
    which found the system still in the batch) or when it joins at a refill."""
    from ase.build import bulk

    kinds = [bulk("Ar", "fcc", a=5.26, cubic=True) * (2, 2, 2), bulk("Ar", "sc", a=3.7) * 3]
    data = [kinds[k].copy() for k in order]
    for sync_every in (1, 4, "auto"):
        log_messages.clear()
        model = FailsOn27Atoms(epsilon=0.0104, sigma=3.40, cutoff=CUTOFF)
        sim = al.Simulator(
            model=model, stages=VelocityVerlet(dt=2.0, steps=6), sync_every=sync_every
        )
        res = sim.run(SizeAwareSampler(data, max_atoms=max_atoms))
        bad = order.index(1)
        assert res.batch.info[bad]["model_error"] == "RuntimeError: descriptor undefined"
        assert sorted(res.exit_reasons).count("model_error") == 1
        said = [m for _, m in log_messages if "quarantined" in m]
        assert said == [
            f"system {bad} quarantined: the model raised on it (RuntimeError: descriptor undefined)"
        ], (sync_every, said)


class FailsOn27AtomsLater(LennardJones):
    """LJ that raises on a 27-atom system from its third call on: after a relaxation
    stage has found it converged."""

    calls = 0

    def forward(self, batch, *args, **kwargs):
        self.calls += 1
        if self.calls > 2 and bool((batch.n_atoms == 27).any()):
            raise RuntimeError("descriptor undefined")
        return super().forward(batch, *args, **kwargs)


def test_a_model_error_after_convergence_is_never_reported_converged() -> None:
    """Perfect crystals (no force) converge at FIRE's first evaluation; the MD stage's
    model then fails on one of them: that system leaves with its model error and is
    not converged, the other one is."""
    from ase.build import bulk

    data = [bulk("Ar", "fcc", a=5.26, cubic=True) * (2, 2, 2), bulk("Ar", "sc", a=3.7) * 3]
    model = FailsOn27AtomsLater(epsilon=0.0104, sigma=3.40, cutoff=CUTOFF)
    plan = FIRE(fmax=0.05, max_steps=5) + VelocityVerlet(dt=2.0, steps=4)
    res = al.Simulator(model=model, stages=plan).run(data)
    rows = res.batch.system_id.tolist()
    assert res.exit_reasons[rows.index(1)] == "model_error"
    assert res.batch.converged.tolist() == [k == 0 for k in rows]


def test_results_carry_the_final_stress_as_ase_computes_it():
    """The step loop skips stress; finished systems get it in one evaluation -- crystals
    as ASE's LennardJones gives it at their final positions, molecules (no cell) none."""
    from ase import Atoms
    from ase.build import bulk
    from ase.calculators.lj import LennardJones as AseLJ

    crystals = [bulk("Ar", "fcc", a=5.26, cubic=True).repeat((2, 2, n)) for n in (1, 2, 2)]
    for k, atoms in enumerate(crystals):
        atoms.rattle(0.05, seed=k)
    crystals[2].set_cell(crystals[2].cell * 1.02, scale_atoms=True)  # under tension
    molecule = Atoms("Ar3", positions=[[0, 0, 0], [3.7, 0, 0], [0.4, 3.6, 0]])
    res = al.Simulator(model=lj(), stages=relax(), precision="64", stress=True).run(
        [*crystals, molecule]
    )
    out = res.to_atoms()
    for atoms in out[:3]:
        ref = atoms.copy()
        ref.calc = AseLJ(epsilon=0.0104, sigma=3.40, rc=CUTOFF, smooth=False)
        np.testing.assert_allclose(atoms.get_stress(), ref.get_stress(), atol=1e-9)
    assert torch.equal(res.batch.stress[3], torch.zeros(3, 3, dtype=torch.float64))
    assert "stress" not in out[3].calc.results


def test_status_masks_follow_every_change_of_the_status_tensor() -> None:
    """The step's stage masks are kept per status tensor: a replaced tensor or one
    written in place (a callback moving a system) gives fresh masks, an unchanged one
    the kept masks."""
    from alchemi_lit.core.state import Batch
    from alchemi_lit.engine.hooks import HookDispatcher
    from alchemi_lit.engine.step import FusedLoop

    plan = FIRE() + Langevin(steps=5)
    loop = FusedLoop(LennardJones(epsilon=0.0104, sigma=3.4, cutoff=8.5), plan, HookDispatcher([]))
    batch = Batch.from_atoms([a[:8] for a in mixed_argon(3, seed=0)])
    batch.status = torch.tensor([plan.codes[0], plan.codes[1], plan.exit])

    def expect(status: list[int]) -> None:
        masks = loop.status_masks(batch)
        for code, mask, held in zip(plan.codes, masks.stages, masks.held):
            assert mask.tolist() == [s == code for s in status] and held == (code in status)
        assert masks.finished.tolist() == [s == plan.exit for s in status]
        assert masks.any_finished == (plan.exit in status)
        assert masks.steps.tolist() == [int(s in plan.codes) for s in status]

    expect([plan.codes[0], plan.codes[1], plan.exit])
    assert loop.status_masks(batch) is loop.status_masks(batch)  # kept while unchanged
    batch.status[2] = plan.codes[0]  # written in place
    expect([plan.codes[0], plan.codes[1], plan.codes[0]])
    batch.status = torch.full_like(batch.status, plan.exit)  # replaced
    expect([plan.exit] * 3)


@pytest.fixture(params=[True, False], ids=["kernels", "torch"])
def cpu_kernels(request, monkeypatch) -> bool:
    """Each test twice: with the compiled CPU kernels and with the torch path."""
    from alchemi_lit import kernels

    monkeypatch.setattr(kernels, "ENABLED", request.param)
    return request.param


def md_run(n_systems: int, seed: int, stages, after_step=None) -> al.Results:
    """Small argon systems through ``stages``, with an AFTER_STEP callback if given."""
    from alchemi_lit.callbacks import LambdaCallback
    from alchemi_lit.engine.hooks import HookStageEnum

    callbacks = [LambdaCallback(HookStageEnum.AFTER_STEP, after_step)] if after_step else []
    systems = [a[:8] for a in mixed_argon(n_systems, seed=seed)]
    return al.Simulator(model=lj(), stages=stages, callbacks=callbacks, seed=0).run(systems)


def test_md_stage_leaves_on_time_when_a_callback_moves_step_counters(cpu_kernels) -> None:
    """On CPU the fused loop skips an MD stage's exit test while a countdown says every
    system has steps left; a callback that moves a system's stage step counter -- in
    place or with a new tensor -- still makes it leave exactly when its counter reaches
    the stage's budget (and the torch path, without kernels, agrees)."""

    def jump(ctx) -> None:
        b = ctx.batch
        if ctx.step == 3:
            b.step[0] += 6  # in place: counter 4 -> 10
        elif ctx.step == 5:
            b.step = b.step + torch.tensor([0, 4, 0])  # a new tensor: counter 6 -> 10

    results = md_run(3, 2, VelocityVerlet(dt=1.0, steps=12), jump)
    assert results.steps.tolist() == [6, 8, 12]  # steps taken: 12 - 6, 12 - 4, 12
    assert results.stage_steps[:, 0].tolist() == [12, 12, 12]  # each counter at exit


def test_a_zero_step_md_stage_is_passed_through_at_once(cpu_kernels) -> None:
    """Systems entering an MD stage of 0 steps leave it in the same step's transitions
    (an exit test skipped by a countdown made before they entered would keep them a
    step)."""
    results = md_run(2, 3, VelocityVerlet(dt=1.0, steps=3) + VelocityVerlet(dt=1.0, steps=0))
    assert results.steps.tolist() == [3, 3]
    assert results.stage_steps.tolist() == [[3, 0], [3, 0]]


def test_an_md_budget_cut_during_the_run_applies_at_once(cpu_kernels) -> None:
    """A callback that shortens an MD stage's budget mid-run (its ``max_steps``) makes
    the systems leave at the new budget, countdown or not."""

    def cut(ctx) -> None:
        if ctx.step == 3:
            ctx.stages[0].max_steps = 6

    assert md_run(2, 4, VelocityVerlet(dt=1.0, steps=50), cut).steps.tolist() == [6, 6]


def test_an_integrator_class_for_stages_is_refused_with_the_fix() -> None:
    """``stages=FIRE`` (the class, a common slip) names the parameter and the call."""
    with pytest.raises(TypeError, match=r"^stages: got the class FIRE, .* FIRE\(\)"):
        al.Simulator(model=lj(), stages=FIRE)
    with pytest.raises(TypeError, match=r"^stages\[1\]: got the class Langevin, .*Langevin\(\)"):
        al.Simulator(model=lj(), stages=[relax(), Langevin])
    with pytest.raises(TypeError, match=r"^stages\[1\]\[0\]: got the class FIRE"):
        al.Simulator(model=lj(), stages=[[relax()], [FIRE]])  # a pipeline's rank
    with pytest.raises(TypeError, match=r"a fused stage: got the class FIRE, .*FIRE\(\)"):
        relax() + FIRE  # type: ignore[operator]
    with pytest.raises(TypeError, match=r"stages must be an Integrator .* got int"):
        al.Simulator(model=lj(), stages=3)


def test_fixed_atoms_of_a_system_that_joins_at_a_refill_feel_no_force() -> None:
    """The first batch has no fixed atoms; the system that joins at a refill has some
    (FixAtoms): their forces are zeroed from its first evaluation on, as when it runs
    alone -- a relaxation does not chase forces its atoms cannot follow."""
    from ase.constraints import FixAtoms

    data = mixed_argon(2, 8, 20, seed=3)
    data[1].set_constraint(FixAtoms(indices=[0, 1, 2]))
    one_at_a_time = SizeAwareSampler(data, max_atoms=max(len(a) for a in data))
    plan = FIRE(fmax=0.05, max_steps=8)
    res = al.Simulator(model=lj(), stages=plan, precision="64").run(one_at_a_time)
    alone = al.Simulator(model=lj(), stages=plan, precision="64").run(
        al.Batch.from_atoms([data[1]], system_ids=[1])
    )
    joined = res.batch.select([1])
    assert int(joined.fixed.sum()) == 3 and not bool(joined.forces[joined.fixed].any())
    assert_same_state(joined, alone.batch)


def test_an_edge_budget_is_handed_back_as_systems_graduate(monkeypatch) -> None:
    """With ``max_edges``, the feed counts the neighbour pairs of the systems in flight;
    each graduation hands its pairs back, or the room never frees and the run waits
    for ever on an empty batch (each refill is counted here, to fail instead of hang)."""
    from alchemi_lit.engine.feeds import SamplerFeed

    data = mixed_argon(5, 8, 20, seed=7)
    count = SizeAwareSampler(data, max_atoms=1000, max_edges=10**9)
    count.bind(CUTOFF + lj().neighbors.skin)
    sampler = SizeAwareSampler(data, max_atoms=1000, max_edges=int(count.edges.max()))
    admit, refills = SamplerFeed.admit, []

    def counted(self, batch):
        refills.append(batch.num_systems)
        if len(refills) > 100:
            raise RuntimeError("the feed admits nothing: its edge budget is never handed back")
        return admit(self, batch)

    monkeypatch.setattr(SamplerFeed, "admit", counted)
    sim = al.Simulator(model=lj(), stages=VelocityVerlet(dt=2.0, steps=3), sync_every=1)
    res = sim.run(sampler)
    assert sorted(res.system_id.tolist()) == list(range(len(data)))
    assert sim.strategy.run_loop.feed.inflight_edges == 0
