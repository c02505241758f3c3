"""Temperature and pressure ramps: the target each thermostat and barostat reads at each
step equals the formula (written out here in NumPy), a resumed run mid-ramp gives the
same bits, a batch of systems with different ramps equals each alone, YAML's mapping
spelling builds the same ramp, and bad ramps are refused before a run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from ase.build import bulk

from alchemi_lit import Simulator
from alchemi_lit.callbacks import Checkpoint, HookStageEnum, LambdaCallback
from alchemi_lit.cli.build import instantiate
from alchemi_lit.core.errors import ConfigError
from alchemi_lit.core.state import Batch
from alchemi_lit.core.units import GPa
from alchemi_lit.integrators import (
    MTKNPT,
    Berendsen,
    Bussi,
    CRescale,
    Langevin,
    NoseHooverChain,
    NPTLangevin,
    Ramp,
    ops,
)
from alchemi_lit.models import LennardJones

THERMOSTATS = [Langevin, Bussi, NoseHooverChain, Berendsen, CRescale, MTKNPT, NPTLangevin]
BAROSTATS = [CRescale, MTKNPT, NPTLangevin]


def expected(shape: str, s: np.ndarray, start, stop, steps, levels=None) -> np.ndarray:
    u = np.minimum(s / steps, 1.0)
    if shape == "linear":
        return start + (stop - start) * u
    if shape == "cosine":
        return stop + (start - stop) * (1 + np.cos(np.pi * u)) / 2
    k = np.minimum(np.floor(s * levels / steps), levels - 1)
    return start + (stop - start) * k / (levels - 1)


def argon(seed: int):
    atoms = bulk("Ar", "fcc", a=5.3, cubic=True).repeat(2)
    atoms.rattle(0.05, seed=seed)
    return atoms


@pytest.mark.parametrize("cls", THERMOSTATS)
@pytest.mark.parametrize(("shape", "levels"), [("linear", None), ("cosine", None), ("step", 4)])
def test_every_thermostat_and_barostat_reads_the_formula(cls, shape, levels) -> None:
    """The target each reads (ops.per_system, what every one of them calls) at stage steps
    0..120 of systems with their own start values equals the formula; the ramp takes the
    stage's steps unless it names its own; pressures are converted from GPa."""
    kw = {"pressure_gpa": Ramp(0.0, 2.0, shape=shape, levels=levels)} if cls in BAROSTATS else {}
    stage = cls(dt=1.0, temperature=Ramp([300.0, 500.0], 900.0, shape=shape, levels=levels),
                steps=100, **kw)  # fmt: skip
    batch = Batch.from_atoms([argon(0), argon(1)], system_ids=[1, 0])
    for s in (0, 1, 25, 50, 99, 100, 120):
        batch.step = torch.tensor([s, s])
        got = ops.per_system(batch, stage.temperature).numpy()
        want = expected(shape, np.array([s, s], float), np.array([500.0, 300.0]), 900.0, 100,
                        levels)  # fmt: skip
        np.testing.assert_allclose(got, want, rtol=1e-15, atol=1e-12)
        if cls in BAROSTATS:
            p = ops.per_system(batch, stage.pressure).numpy() / GPa
            np.testing.assert_allclose(p, expected(shape, s, 0.0, 2.0, 100, levels), atol=1e-12)


def test_a_langevin_run_holds_the_ramp_at_each_step() -> None:
    """During a run the target at BEFORE_PRE_UPDATE of stage step s is the formula at s,
    also for a ramp with its own length (held at stop after it)."""
    seen: list[tuple[int, float]] = []
    stage = Langevin(dt=2.0, temperature=Ramp(50.0, 150.0, steps=6, shape="cosine"), steps=10)

    def record(ctx) -> None:
        target = ops.per_system(ctx.batch, stage.temperature)
        seen.append((int(ctx.batch.step[0]), float(target[0])))

    probe = LambdaCallback(HookStageEnum.BEFORE_PRE_UPDATE, record)
    Simulator(model=LennardJones(0.0104, 3.40, 6.0), stages=stage, precision="64",
              callbacks=[probe]).run([argon(0)])  # fmt: skip
    steps = np.array([s for s, _ in seen])
    assert steps.tolist() == list(range(10))
    np.testing.assert_allclose([t for _, t in seen], expected("cosine", steps, 50.0, 150.0, 6))


def run(systems, ids, stage, folder: Path | None = None, extra=(), resume=False):
    checkpoint = [Checkpoint(folder, every=10)] if folder is not None else []
    sim = Simulator(model=LennardJones(0.0104, 3.40, 6.0), stages=stage, sync_every=5,
                    callbacks=[*checkpoint, *extra], precision="64", accelerator="cpu")  # fmt: skip
    where = str(folder) if resume else None
    return sim.run(Batch.from_atoms(systems, system_ids=ids), resume=where)


def ramped() -> Langevin:
    return Langevin(dt=4.0, temperature=Ramp([40.0, 120.0], [160.0, 20.0], shape="cosine"),
                    steps=20)  # fmt: skip


def test_resume_mid_ramp_and_alone_give_the_same_bits(tmp_path: Path) -> None:
    """A run crashed mid-ramp and resumed from its checkpoint ends on the bits of an
    uninterrupted one; each system of a batch with different ramps (per-system start and
    stop) ends as it does alone; and the ramp changes the run (a flat one would not)."""
    systems = [argon(0), argon(1)]
    whole = run(systems, [0, 1], ramped(), tmp_path / "whole")

    class Crash(Exception):
        pass

    def crash(ctx) -> None:
        if ctx.step == 14:
            raise Crash

    with pytest.raises(Crash):
        stop = LambdaCallback(HookStageEnum.AFTER_STEP, crash)
        run(systems, [0, 1], ramped(), tmp_path / "c", [stop])
    resumed = run(systems, [0, 1], ramped(), tmp_path / "c", resume=True)
    for field in ("positions", "velocities"):
        assert torch.equal(getattr(resumed.batch, field), getattr(whole.batch, field)), field
    for k in (0, 1):
        alone = run([systems[k]], [k], ramped())
        for field in ("positions", "velocities"):
            assert torch.equal(getattr(alone.batch, field),
                               getattr(whole.batch.select([k]), field)), (k, field)  # fmt: skip
    flat = run(systems, [0, 1], Langevin(dt=4.0, temperature=[40.0, 120.0], steps=20))
    assert not torch.equal(flat.batch.velocities, whole.batch.velocities)


def test_yaml_spells_a_ramp_as_a_mapping_and_bad_ramps_are_refused() -> None:
    stage = instantiate({"class_path": "alchemi_lit.integrators.Langevin", "init_args": {
        "temperature": {"start": 300, "stop": 600, "shape": "step", "levels": 3}, "steps": 9,
    }}, "simulator.stages.0")  # fmt: skip
    assert isinstance(stage.temperature, Ramp) and stage.temperature.steps == 9
    assert repr(stage.temperature) == "Ramp(300 -> 600, steps=9, shape='step', levels=3)"
    with pytest.raises(ConfigError, match="levels"):
        Ramp(300, 600, shape="step")
    with pytest.raises(ConfigError, match="shape"):
        Ramp(300, 600, shape="exponential")
    with pytest.raises(ConfigError, match="temperature"):
        Langevin(temperature=Ramp(300, -5))
    with pytest.raises(ConfigError, match="0 K"):  # Nosé-Hoover cannot reach 0 K
        NoseHooverChain(temperature=Ramp(300, 0))
    with pytest.raises(ConfigError, match="start and stop"):
        Langevin(temperature={"begin": 300, "stop": 600})


def ramped_npt(graphs: bool, callbacks=(), steps: int = 16):
    stage = CRescale(dt=2.0, temperature=Ramp(40.0, 120.0), steps=steps,
                     pressure_gpa=Ramp(0.0, 1.0, shape="cosine"))  # fmt: skip
    sim = Simulator(model=LennardJones(0.0104, 3.40, 6.0), stages=stage, sync_every=8,
                    callbacks=list(callbacks), precision="64", accelerator="cpu",
                    cuda_graphs=graphs)  # fmt: skip
    return sim.run([argon(0), argon(1)])


def test_ramps_on_the_accelerator_path_read_nothing() -> None:
    """A ramped NPT run (temperature and pressure) reads nothing on the host at steady
    steps under accelerator_path()."""
    from alchemi_lit.testing import StepProbe, accelerator_path

    probe = StepProbe()
    with accelerator_path(), probe:
        ramped_npt(False, [probe], steps=8)
    assert probe.share_without_reads() >= 0.5, probe.where


def test_ramps_replay_in_emulated_cuda_graphs() -> None:
    """Emulated CUDA graphs -- whose replays read batch.step in place -- end a ramped NPT
    run on the eager bits."""
    from alchemi_lit.testing import accelerator_path, emulated_cuda_graphs

    with accelerator_path():
        eager = ramped_npt(False)
        with emulated_cuda_graphs() as backends:
            graphed = ramped_npt(True)
    assert sum(b.captures for b in backends) >= 1
    for field in ("positions", "velocities", "cell"):
        assert torch.equal(getattr(graphed.batch, field), getattr(eager.batch, field)), field


def test_the_command_line_takes_a_ramp_mapping_and_refuses_a_ramped_time_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The config parser's types admit the mapping spelling (validate passes); a ramp
    where no ramp belongs (dt) is refused naming the parameter."""
    import yaml

    from alchemi_lit.cli import main

    def config(**stage) -> str:
        path = tmp_path / "c.yaml"
        path.write_text(yaml.safe_dump({
            "simulator": {"model": {"class_path": "lj-argon"},
                          "stages": [{"class_path": "Langevin", "init_args": stage}]},
            "data": {"structures": "builtin:argon"},
        }))  # fmt: skip
        return str(path)

    ramp = {"start": 30.0, "stop": 120.0, "shape": "cosine"}
    assert main(["validate", "--config", config(steps=10, temperature=ramp)]) == 0
    capsys.readouterr()
    assert main(["validate", "--config", config(steps=10, dt=ramp)]) != 0
    said = capsys.readouterr()
    assert "dt cannot ramp" in said.out + said.err
