"""Hook stages: order within a step, every gating, ON_CONVERGE, errors, one forward per step."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ase.build import bulk

from alchemi_lit import Simulator
from alchemi_lit.callbacks import Callback, HookStageEnum, LambdaCallback, StepContext
from alchemi_lit.integrators import FIRE, VelocityVerlet
from alchemi_lit.models import LennardJones

H = HookStageEnum
STEP_STAGES = [s.value for s in HookStageEnum if s is not H.ON_CONVERGE]


def lj() -> LennardJones:
    return LennardJones(epsilon=0.0104, sigma=3.40, cutoff=8.5)


def argon(noise: float, seed: int, repeat: int = 1):
    atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(repeat)
    atoms.positions += np.random.default_rng(seed).normal(scale=noise, size=atoms.positions.shape)
    return atoms


def simulator(stages, callbacks, sync_every: int = 1, model=None) -> Simulator:
    return Simulator(
        model=model or lj(),
        stages=stages,
        callbacks=callbacks,
        sync_every=sync_every,
        accelerator="cpu",
        precision="64",
    )


class Recorder(Callback):
    """Records ``(hook name, ctx.step)`` for every hook, including run start and end."""

    def __init__(self, every: int = 1) -> None:
        super().__init__(every)
        self.calls: list[tuple[str, int]] = []

    def on_run_start(self, ctx: StepContext) -> None:
        self.calls.append(("on_run_start", ctx.step))

    def on_run_end(self, ctx: StepContext) -> None:
        self.calls.append(("on_run_end", ctx.step))

    def steps_of(self, name: str) -> list[int]:
        return [s for n, s in self.calls if n == name]


def _record(name: str):
    def hook(self: Recorder, ctx: StepContext) -> None:
        self.calls.append((name, ctx.step))

    hook.__name__ = name
    return hook


for _stage in HookStageEnum:  # override all nine hook methods
    setattr(Recorder, _stage.value, _record(_stage.value))


def test_every_stage_fires_in_documented_order() -> None:
    rec = Recorder()
    assert set(rec.hook_stages()) == set(HookStageEnum)
    simulator(VelocityVerlet(dt=1.0, steps=3), [rec]).run(argon(0.05, 0))
    expected = [("on_run_start", 0)]
    for step in range(3):
        expected += [(name, step) for name in STEP_STAGES]
    # the stage budget ends at step 2; the bookkeeping after it reports the exit
    expected += [("on_converge", 3), ("on_run_end", 3)]
    assert rec.calls == expected
    assert STEP_STAGES == [
        "before_step",
        "before_pre_update",
        "after_pre_update",
        "before_compute",
        "after_compute",
        "before_post_update",
        "after_post_update",
        "after_step",
    ]


def test_frequency_gates_step_hooks_but_not_on_converge() -> None:
    rec = Recorder(every=3)
    simulator(VelocityVerlet(dt=1.0, steps=10), [rec], sync_every=2).run(argon(0.05, 0))
    for name in STEP_STAGES:
        assert rec.steps_of(name) == [0, 3, 6, 9], name
    # ON_CONVERGE is an event: it reaches the callback although 10 % 3 != 0
    assert rec.steps_of("on_converge") == [10]
    assert rec.calls[0] == ("on_run_start", 0) and rec.calls[-1] == ("on_run_end", 10)


@pytest.mark.parametrize("sync_every", [1, 4])
def test_on_converge_marks_exactly_the_converged_systems(sync_every: int) -> None:
    structures = [
        argon(0.0, 0),  # perfect crystal: converged before its first step
        argon(0.03, 1),
        argon(0.08, 2),
        argon(0.25, 3),  # too far away for the step budget
    ]
    events: list[tuple[int, list[int], list[int]]] = []

    def on_converge(ctx: StepContext) -> None:
        ids = ctx.batch.system_id
        assert ctx.converged is not None and ctx.exited is not None
        assert not bool((ctx.converged & ~ctx.exited).any())
        events.append((ctx.step, ids[ctx.converged].tolist(), ids[ctx.exited].tolist()))

    # every 7 must not hide convergence events of bookkeepings at other steps
    cb = LambdaCallback(H.ON_CONVERGE, on_converge, every=7)
    res = simulator(FIRE(fmax=2e-3, max_steps=25), [cb], sync_every).run(structures)

    converged_ids = res.system_id[res.converged].tolist()
    assert 0 in converged_ids and 3 not in converged_ids and len(converged_ids) >= 2
    reported = [sid for _, conv, _ in events for sid in conv]
    assert sorted(reported) == sorted(converged_ids)  # each converged system exactly once
    exited = [sid for _, _, ex in events for sid in ex]
    assert sorted(exited) == [0, 1, 2, 3]  # the max_steps system exits without converging
    steps = dict(zip(res.system_id.tolist(), res.steps.tolist()))
    assert steps[0] == 0 and steps[3] == 25
    for step, conv, _ in events:
        assert step % sync_every == 0
        for sid in conv:  # reported at the first bookkeeping after the system converged
            assert steps[sid] <= step < steps[sid] + sync_every or (steps[sid] == 0 and step)


def test_lambda_callback_runs_at_its_stage_and_frequency() -> None:
    seen: list[tuple[int, float]] = []

    def record(ctx: StepContext) -> None:
        seen.append((ctx.step, float(ctx.batch.energy[0])))

    cb = LambdaCallback(H.AFTER_COMPUTE, record, every=2)
    assert cb.hook_stages() == [H.AFTER_COMPUTE]
    simulator(VelocityVerlet(dt=1.0, steps=5), [cb]).run(argon(0.05, 0))
    assert [s for s, _ in seen] == [0, 2, 4]
    assert all(np.isfinite(e) for _, e in seen)
    with pytest.raises(ValueError, match="every"):
        LambdaCallback(H.AFTER_STEP, record, every=0)
    with pytest.raises(ValueError):
        LambdaCallback("not_a_stage", record)


def test_callback_error_propagates_and_run_end_still_runs() -> None:
    def explode(ctx: StepContext) -> None:
        if ctx.step == 2:
            raise RuntimeError("boom at step 2")

    rec = Recorder()
    sim = simulator(VelocityVerlet(dt=1.0, steps=10), [rec, LambdaCallback(H.AFTER_STEP, explode)])
    with pytest.raises(RuntimeError, match="boom at step 2"):
        sim.run(argon(0.05, 0))
    assert rec.calls[-1] == ("on_run_end", 2)
    assert rec.steps_of("after_step") == [0, 1, 2]


def test_failing_run_start_still_ends_started_callbacks() -> None:
    class BadStart(Callback):
        def on_run_start(self, ctx: StepContext) -> None:
            raise ValueError("cannot start")

    rec = Recorder()
    with pytest.raises(ValueError, match="cannot start"):
        simulator(VelocityVerlet(dt=1.0, steps=3), [rec, BadStart()]).run(argon(0.05, 0))
    assert rec.calls == [("on_run_start", 0), ("on_run_end", 0)]


class CountingLJ(LennardJones):
    """Lennard-Jones that counts its forward calls."""

    def __init__(self) -> None:
        super().__init__(epsilon=0.0104, sigma=3.40, cutoff=8.5)
        self.calls = 0

    def forward(self, batch, *args, **kwargs):  # type: ignore[override]
        self.calls += 1
        return super().forward(batch, *args, **kwargs)


def test_exactly_one_model_forward_per_step_with_fused_stages() -> None:
    model = CountingLJ()
    window: dict[str, list[int]] = {"before": [], "after": []}
    callbacks = [
        LambdaCallback(H.BEFORE_STEP, lambda ctx: window["before"].append(model.calls)),
        LambdaCallback(H.AFTER_STEP, lambda ctx: window["after"].append(model.calls)),
    ]
    sim = simulator(
        FIRE(fmax=5e-3, max_steps=20) + VelocityVerlet(dt=1.0, steps=6),
        callbacks,
        sync_every=3,
        model=model,
    )
    res = sim.run([argon(0.05, 0), argon(0.1, 1), argon(0.0, 2)])
    steps = res.stats["steps"]
    assert len(window["before"]) == len(window["after"]) == steps
    # within every step (two stages fused) the model runs exactly once
    assert np.all(np.subtract(window["after"], window["before"]) == 1)
    # the loop's own count: one evaluation before the first step, then one per step
    assert sim.strategy.loop.num_forward_calls == steps + 1
    assert torch.all(res.steps > 0)
