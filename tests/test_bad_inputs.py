"""A catalogue of invalid inputs: configs, structures and runtime states.

Every case is one row of ``CASES`` and runs through ONE parametrized test.  A case says
how to produce the bad input and what must come out:

* CLI cases (``config``): a tiny config (a dict, or raw YAML text) is written to a
  temporary file and run through ``alchemi_lit.cli.main`` in-process.  The command must
  exit with ``status`` (2 for errors), print exactly one ``error: <key>: ...`` line on
  stderr naming ``key``, print no traceback, and the line must match ``match`` -- which
  names the problem AND the fix.  Status-0 cases (a warning, not an error) match the
  warnings instead.
* Python API cases (``call`` + ``exc``): the call must raise ``exc`` with a message
  matching ``match``.
* Runtime cases (``call`` without ``exc``): the call runs a tiny simulation and returns
  a text (exit reasons, logged errors) that must match ``match``: one bad system or one
  failing sink never costs the results of the others.

Structure files are in ``tests/bad_inputs/`` (see its README); the configs use 1-2
systems of 4 atoms so that the whole catalogue takes a few seconds.
"""

from __future__ import annotations

import contextlib
import copy
import io
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from ase import Atoms
from ase.build import bulk

from alchemi_lit import Batch, ConfigError, ModelError, Simulator, StructureError, workflows
from alchemi_lit.callbacks import load_checkpoint
from alchemi_lit.cli import main
from alchemi_lit.data import SizeAwareSampler, read_structures
from alchemi_lit.integrators import FIRE, Langevin, VelocityVerlet
from alchemi_lit.models import EMT, LennardJones
from alchemi_lit.sinks import HostMemory, Sink, ZarrSink
from alchemi_lit.strategies.buffers import BufferConfig

BAD = Path(__file__).resolve().parent / "bad_inputs"

#: A valid tiny config: one 4-atom argon crystal, 5 FIRE steps, on the CPU.
BASE: dict[str, Any] = {
    "simulator": {
        "model": {"class_path": "lj-argon"},
        "stages": [{"class_path": "FIRE", "init_args": {"fmax": 0.05, "max_steps": 5}}],
        "accelerator": "cpu",
    },
    "data": {"structures": "builtin:argon", "builtin_args": {"n_systems": 1, "repeat": 1}},
}
TWO_RANKS = [[{"class_path": "FIRE"}], [{"class_path": "FIRE"}]]  # a pipeline: FIRE | FIRE

Config = Callable[[Path], "dict[str, Any] | str"]


@dataclass(frozen=True)
class Case:
    """One invalid input; see the module docstring."""

    id: str
    match: str  # regex: names what is wrong and how to fix it
    config: Config | None = None  # CLI: the config (gets the test's tmp dir)
    key: str | None = None  # CLI: the key the error line names
    command: str = "validate"
    argv: tuple[str, ...] = ()
    status: int = 2
    call: Callable[[Path], Any] | None = None  # Python API / runtime case
    exc: type[BaseException] | None = None


# ---------------------------------------------------------------------- config builders
def edit(fn: Callable[[dict[str, Any], Path], None]) -> Config:
    """BASE, changed by ``fn(config, tmp)``."""

    def build(tmp: Path) -> dict[str, Any]:
        conf = copy.deepcopy(BASE)
        fn(conf, tmp)
        return conf

    return build


def sim(**kw: Any) -> Config:
    """BASE with these simulator arguments."""
    return edit(lambda c, _: c["simulator"].update(kw))


def stage(class_path: str = "FIRE", **init: Any) -> Config:
    """BASE with one stage ``class_path(**init)``."""
    return sim(stages=[{"class_path": class_path, "init_args": init}])


def fire(**init: Any) -> Config:
    """BASE with these FIRE parameters added."""
    return edit(lambda c, _: c["simulator"]["stages"][0]["init_args"].update(init))


def md(class_path: str = "Langevin", **init: Any) -> Config:
    """A short MD stage with valid defaults, ``init`` overriding them."""
    return stage(class_path, **{"dt": 1.0, "temperature": 10.0, "steps": 5, **init})


def data(**kw: Any) -> Config:
    """BASE with these data keys."""
    return edit(lambda c, _: c["data"].update(kw))


def builtin(**kw: Any) -> Config:
    return edit(lambda c, _: c["data"]["builtin_args"].update(kw))


def structures(name: str, model: str = "EMT", **kw: Any) -> Config:
    """Copper structures from ``bad_inputs/`` (EMT covers Cu), plus data keys ``kw``."""

    def fn(c: dict[str, Any], _: Path) -> None:
        c["simulator"]["model"] = {"class_path": model}
        c["data"] = {"structures": str(BAD / name), **kw}

    return edit(fn)


def text(yaml_text: str) -> Config:
    return lambda _: yaml_text


def existing_store(c: dict[str, Any], tmp: Path) -> None:
    store = tmp / "old.zarr"
    store.mkdir()
    c["simulator"]["sinks"] = [{"class_path": "ZarrSink", "init_args": {"store": str(store)}}]


def store_holding_the_ids(c: dict[str, Any], tmp: Path) -> None:
    """A store a run already wrote system 0 to, appended to by a run whose system is 0."""
    store = tmp / "old.zarr"
    simulator(sinks=[ZarrSink(store)]).run(argon())
    c["simulator"]["sinks"] = [
        {"class_path": "ZarrSink", "init_args": {"store": str(store), "mode": "a"}}
    ]


def constrained_traj(c: dict[str, Any], tmp: Path) -> None:
    """An ASE trajectory (keeps constraints) with a FixScaled constraint (unsupported)."""
    from ase.constraints import FixScaled

    atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
    atoms.set_constraint(FixScaled(0, mask=(True, False, False)))
    path = tmp / "constrained.traj"
    atoms.write(path)
    c["simulator"]["model"] = {"class_path": "EMT"}
    c["data"] = {"structures": str(path)}


# ---------------------------------------------------------------------- Python API helpers
def argon(n: int = 1, noise: float = 0.05) -> list[Atoms]:
    rng = np.random.default_rng(0)
    out = []
    for _ in range(n):
        a = bulk("Ar", "fcc", a=5.26, cubic=True)
        a.positions += rng.normal(0.0, noise, a.positions.shape)
        out.append(a)
    return out


def lj() -> LennardJones:
    return LennardJones(epsilon=0.0104, sigma=3.40, cutoff=8.5)


def simulator(**kw: Any) -> Simulator:
    args = {"model": lj(), "stages": FIRE(fmax=0.05, max_steps=5), "accelerator": "cpu", **kw}
    return Simulator(**args)


def iron_batch() -> Batch:
    return Batch.from_atoms([bulk("Fe", "bcc", a=2.87, cubic=True)])


def fix_scaled() -> Batch:
    from ase.constraints import FixScaled

    a = argon()[0]
    a.set_constraint(FixScaled(0, mask=(True, False, False)))
    return Batch.from_atoms([a])


def not_a_checkpoint(tmp: Path) -> Any:
    path = tmp / "step-000000000010.ckpt"
    torch.save({"weights": torch.zeros(3)}, path)
    return load_checkpoint(tmp)


def zarr_existing(tmp: Path) -> Any:
    (tmp / "r.zarr").mkdir()
    return simulator(sinks=[ZarrSink(tmp / "r.zarr")]).run(argon())


def zarr_append_clash(tmp: Path) -> Any:
    simulator(sinks=[ZarrSink(tmp / "r.zarr")]).run(argon())
    return simulator(sinks=[ZarrSink(tmp / "r.zarr", mode="a")]).run(argon())


def trajectory_as_structures(tmp: Path) -> Any:
    from alchemi_lit.callbacks import TrajectoryWriter

    simulator(callbacks=[TrajectoryWriter(tmp / "t.zarr", every=1)]).run(argon())
    return read_structures(tmp / "t.zarr")


class NaNForSystem1(LennardJones):
    """LJ whose energy is NaN for system 1 from the 2nd evaluation on."""

    def __init__(self) -> None:
        super().__init__(epsilon=0.0104, sigma=3.40, cutoff=8.5)
        self.calls = 0

    def forward(self, batch: Batch, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        out = super().forward(batch, *args, **kwargs)
        self.calls += 1
        if self.calls > 1:
            out["energy"] = torch.where(batch.system_id == 1, float("nan"), out["energy"])
        return out


class RaisesOnSystem1(LennardJones):
    """LJ that cannot evaluate any batch holding system 1."""

    def __init__(self) -> None:
        super().__init__(epsilon=0.0104, sigma=3.40, cutoff=8.5)

    def forward(self, batch: Batch, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        if bool((batch.system_id == 1).any()):
            raise RuntimeError("boom: descriptor undefined for this structure")
        return super().forward(batch, *args, **kwargs)


class FullDisk(Sink):
    """A sink whose every write fails like a full disk."""

    def write(self, batch: Batch) -> None:
        raise OSError(28, "No space left on device")


def logged(fn: Callable[[], Any]) -> tuple[Any, list[str]]:
    """``fn()`` and the loguru messages it produced."""
    from loguru import logger

    messages: list[str] = []
    sink = logger.add(lambda m: messages.append(m.record["message"]), level="DEBUG")
    try:
        return fn(), messages
    finally:
        logger.remove(sink)


def run_nan_model(_: Path) -> str:
    sim = Simulator(
        NaNForSystem1(), VelocityVerlet(dt=1.0, steps=6), sync_every=2, accelerator="cpu"
    )
    res = sim.run(argon(3))
    return ",".join(res.exit_reasons)


def run_raising_model(_: Path) -> str:
    sim = Simulator(RaisesOnSystem1(), VelocityVerlet(dt=1.0, steps=6), accelerator="cpu")
    res = sim.run(argon(3))
    error = res.batch.info[1]["model_error"]
    return f"{','.join(res.exit_reasons)} | {error}"


def run_failing_sink(_: Path) -> str:
    memory = HostMemory()
    sim = simulator(stages=VelocityVerlet(dt=1.0, steps=4), sinks=[FullDisk(), memory])
    res, messages = logged(lambda: sim.run(argon(3)))
    errors = [m for m in messages if "FullDisk failed" in m]
    return f"{len(memory)} in memory, {len(res)} results | {errors[0]}"


def run_all_sinks_failing(_: Path) -> str:
    sim = simulator(stages=VelocityVerlet(dt=1.0, steps=4), sinks=[FullDisk()])
    res, messages = logged(lambda: sim.run(argon(2)))
    kept = [m for m in messages if "kept in memory" in m]
    return f"{len(res)} results | {kept[0]}"


# ---------------------------------------------------------------------- the catalogue
CASES: list[Case] = [
    # --- plugin names -------------------------------------------------------------
    Case(
        "unknown-integrator",
        r"unknown integrator 'FIRE3'\. Did you mean .*fire.*alchemi-lit plugins",
        sim(stages=[{"class_path": "FIRE3"}]),
        "simulator.stages.0.class_path",
    ),
    Case(
        "unknown-model",
        r"unknown model 'lj-argn'\. Did you mean lj-argon",
        sim(model={"class_path": "lj-argn"}),
        "simulator.model.class_path",
    ),
    Case(
        "unknown-callback",
        r"unknown callback 'Loger'\. Did you mean Logger",
        sim(callbacks=[{"class_path": "Loger"}]),
        "simulator.callbacks.0.class_path",
    ),
    Case(
        "unknown-sink",
        r"unknown sink 'ZarSink'\. Did you mean ZarrSink",
        sim(sinks=[{"class_path": "ZarSink", "init_args": {"store": "x.zarr"}}]),
        "simulator.sinks.0.class_path",
    ),
    Case(
        "integrator-as-callback",
        r"'FIRE' is a registered integrator, not a callback.*--kind callback",
        sim(callbacks=["FIRE"]),
        "simulator.callbacks.0.class_path",
    ),
    Case(
        "import-path-not-a-class",
        r"'os\.path\.join' is not a class",
        sim(model={"class_path": "os.path.join"}),
        "simulator.model.class_path",
    ),
    Case(
        "import-path-missing-module",
        r"cannot import 'nosuchpkg\.Model'.*No module named.*full import path",
        sim(model={"class_path": "nosuchpkg.Model"}),
        "simulator.model.class_path",
    ),
    # regression (fuzz): a relative path ("..") escaped as TypeError (status 1)
    Case(
        "import-path-relative",
        r"cannot import '\.\.' .*give a registered plugin name or a full import path",
        sim(model={"class_path": ".."}),
        "simulator.model.class_path",
    ),
    Case(
        "class-of-wrong-base",
        r"OrderedDict is not a model \(not a subclass of Model\)",
        sim(model={"class_path": "collections.OrderedDict"}),
        "simulator.model.class_path",
    ),
    # --- wrong types ----------------------------------------------------------------
    Case(
        "list-for-float",
        r"expected float, got \[1, 2\]",
        fire(fmax=[1, 2]),
        "simulator.stages.0.init_args.fmax",
    ),
    Case(
        "dict-for-float",
        r"expected float, got .*'a': 1",
        fire(fmax={"a": 1}),
        "simulator.stages.0.init_args.fmax",
    ),
    Case(
        "string-for-int",
        r"expected int, got 'many'",
        fire(max_steps="many"),
        "simulator.stages.0.init_args.max_steps",
    ),
    Case("float-for-int-seed", r"expected int, got 1\.5", sim(seed=1.5), "simulator.seed"),
    Case(
        "dict-for-callback-list",
        r"expected a list of callbacks, e\.g\. `callbacks: \[\{class_path",
        sim(callbacks={"class_path": "Logger"}),
        "simulator.callbacks",
    ),
    Case(
        "string-for-sink-list",
        r"expected a list of sinks, e\.g\. `sinks: \[",
        sim(sinks="HostMemory"),
        "simulator.sinks",
    ),
    Case(
        "list-for-per-system-dt",
        r"expected float or Tensor or dict\[str, Any\], got \[1, -1\]",
        md(dt=[1, -1]),
        "simulator.stages.0.init_args.dt",
    ),
    Case(
        "init-args-not-a-mapping",
        r"expected a mapping of parameters, got \[1\]",
        sim(model={"class_path": "lj-argon", "init_args": [1]}),
        "simulator.model.init_args",
    ),
    # regression (fuzz): an integer parameter name crashed difflib (status 1)
    Case(
        "non-string-parameter-name",
        r"FIRE has no parameter 1\. Parameters: .*fmax",
        edit(lambda c, _: c["simulator"]["stages"][0]["init_args"].update({1: 2})),
        "simulator.stages.0.init_args.1",
    ),
    # regression (fuzz): dict_kwargs that is not a mapping gave jsonargparse's internals
    Case(
        "dict-kwargs-not-a-mapping",
        r"expected a mapping of keyword arguments, got \[1\]",
        sim(model={"class_path": "lj-argon", "dict_kwargs": [1]}),
        "simulator.model.dict_kwargs",
    ),
    Case(
        "nan-parameter",
        r"expected a finite number, got nan",
        fire(fmax=float("nan")),
        "simulator.stages.0.init_args.fmax",
    ),
    Case(
        "infinite-timeout",
        r"expected a finite number, got inf",
        sim(timeout=float("inf")),
        "simulator.timeout",
    ),
    # --- parameter values -------------------------------------------------------------
    Case(
        "zero-dt", r"Langevin: dt \(fs\) must be > 0", md(dt=0), "simulator.stages.0.init_args.dt"
    ),
    Case(
        "negative-dt",
        r"NoseHooverChain: dt \(fs\) must be > 0(\.0)?, got -1",
        md("NoseHooverChain", dt=-1.0),
        "simulator.stages.0.init_args.dt",
    ),
    Case(
        "negative-temperature",
        r"temperature \(K\) must be >= 0(\.0)?, got -10",
        md(temperature=-10.0),
        "simulator.stages.0.init_args.temperature",
    ),
    Case(
        "zero-friction",
        r"friction \(1/fs\) must be > 0",
        md(friction=0.0),
        "simulator.stages.0.init_args.friction",
    ),
    Case(
        "negative-fmax",
        r"FIRE2: fmax \(eV/Å\) must be > 0",
        stage("FIRE2", fmax=-0.1),
        "simulator.stages.0.init_args.fmax",
    ),
    Case(
        "negative-max-steps",
        r"FIRE: max_steps \(the step budget\) must be >= 0, got -1",
        fire(max_steps=-1),
        "simulator.stages.0.init_args.max_steps",
    ),
    Case(
        "negative-md-steps",
        r"Langevin: steps \(the step budget\) must be >= 0, got -5",
        md(steps=-5),
        "simulator.stages.0.init_args.steps",
    ),
    Case(
        "zero-thermostat-time",
        r"Bussi: taut \(fs\) must be > 0",
        md("Bussi", taut=0.0),
        "simulator.stages.0.init_args.taut",
    ),
    Case(
        "negative-cutoff",
        r"cutoff must be > 0, got -1",
        sim(model={"class_path": "lj-argon", "init_args": {"cutoff": -1.0}}),
        "simulator.model.init_args.cutoff",
    ),
    Case(
        "zero-sync-every",
        r"sync_every must be .auto. .* or an integer >= 1 .*got 0",
        sim(sync_every=0),
        "simulator.sync_every",
    ),
    # --- missing / unknown keys -------------------------------------------------------
    Case(
        "missing-model",
        r"missing: give a model, e\.g\. `model: \{class_path: lj-argon\}`",
        edit(lambda c, _: c["simulator"].pop("model")),
        "simulator.model",
    ),
    Case(
        "missing-stages",
        r"missing: give one integrator or a list of them",
        edit(lambda c, _: c["simulator"].pop("stages")),
        "simulator.stages",
    ),
    Case(
        "empty-stages",
        r"missing: give one integrator or a list of them",
        sim(stages=[]),
        "simulator.stages",
    ),
    Case(
        "unknown-section",
        r"unknown section in --config .*Sections: simulator, data, output",
        edit(lambda c, _: c.update(trainer={"max_epochs": 1})),
        "trainer",
    ),
    Case(
        "section-typo",
        r"Did you mean data\?",
        edit(lambda c, _: c.update(dta=c.pop("data"))),
        "dta",
    ),
    Case(
        "unknown-simulator-argument",
        r"unknown Simulator argument\. Did you mean seed",
        sim(sead=1),
        "simulator.sead",
    ),
    Case(
        "unknown-init-arg",
        r"FIRE has no parameter 'fmaxx'\. Did you mean fmax",
        fire(fmaxx=0.1),
        "simulator.stages.0.init_args.fmaxx",
    ),
    Case(
        "unknown-output-key",
        r"unknown key\. Did you mean dir",
        edit(lambda c, _: c.update(output={"dri": "out"})),
        "output.dri",
    ),
    Case(
        "missing-structures",
        r"missing: give a structure file .* or builtin:argon",
        edit(lambda c, _: c.pop("data")),
        "data.structures",
    ),
    Case(
        "structures-not-a-string",
        r"expected a file path or builtin:NAME, got 3",
        data(structures=3),
        "data.structures",
    ),
    # --- choices ------------------------------------------------------------------------
    Case(
        "bad-precision",
        r"expected one of '64', '32', '64-true', '32-true', got '16'",
        sim(precision="16"),
        "simulator.precision",
    ),
    Case(
        "bad-accelerator",
        r"unknown accelerator 'tpu'; choose 'auto', 'cpu' or 'cuda'",
        sim(accelerator="tpu"),
        "simulator.accelerator",
    ),
    Case(
        "strategy-typo",
        r"unknown strategy 'pipline'\. Did you mean pipeline\? Strategies: auto, pipeline, "
        r"replicas, single",
        sim(strategy="pipline"),
        "simulator.strategy",
    ),
    Case(
        "comm-mode-typo",
        r"expected one of 'sync', 'async_recv', 'fully_async' or null, got 'asyncrecv'",
        sim(comm_mode="asyncrecv"),
        "simulator.comm_mode",
    ),
    # --- ranks, devices, transfer buffers -----------------------------------------------
    Case(
        "devices-not-pipeline-stages",
        r"2 stage rank\(s\) but devices=3; the number of ranks must equal",
        sim(stages=TWO_RANKS, devices=3),
        "simulator.devices",
    ),
    Case(
        "more-ranks-than-stages",
        r"devices=2 asks for 2 ranks but the plan is fused.*use devices=1",
        sim(devices=2),
        "simulator.devices",
    ),
    Case(
        "pipeline-with-one-stage",
        r"1 stage rank\(s\) but devices=2",
        sim(strategy="pipeline", devices=2),
        "simulator.devices",
    ),
    Case(
        "replicas-not-a-multiple",
        r"multiple of the plan's 2 rank\(s\), got devices=3",
        sim(stages=TWO_RANKS, strategy="replicas", devices=3),
        "simulator.devices",
    ),
    Case(
        "pipeline-forced-single",
        r"a pipeline plan .* use strategy='pipeline'",
        sim(stages=TWO_RANKS, strategy="single"),
        "simulator.strategy",
    ),
    Case(
        "buffer-zero-atoms",
        r"num_atoms must be an integer >= 1, got 0",
        sim(stages=TWO_RANKS, devices=2, buffer={"num_atoms": 0}),
        "simulator.buffer.num_atoms",
    ),
    Case(
        "buffer-negative-systems",
        r"num_systems must be an integer >= 1, got -3",
        sim(stages=TWO_RANKS, devices=2, buffer={"num_systems": -3}),
        "simulator.buffer.num_systems",
    ),
    Case(
        "buffer-unknown-key",
        r"unknown key\. Did you mean num_atoms\? Keys: num_systems",
        sim(stages=TWO_RANKS, devices=2, buffer={"num_atom": 64}),
        "simulator.buffer.num_atom",
    ),
    Case(
        "buffer-not-a-mapping",
        r"expected a mapping with keys num_systems, num_atoms, num_edges",
        sim(stages=TWO_RANKS, devices=2, buffer="big"),
        "simulator.buffer",
    ),
    Case(
        "buffer-smaller-than-a-system",
        r"system 0 has 4 atoms but the transfer buffer holds 2.*"
        r"raise num_atoms to at least 4",
        sim(stages=TWO_RANKS, devices=2, buffer={"num_atoms": 2}),
        "simulator.buffer.num_atoms",
    ),
    # --- inflight sampler -----------------------------------------------------------
    Case(
        "sampler-smaller-than-a-system",
        r"system 0 \(system_id 0\) has 4 atoms, more than max_atoms=2.*raise max_atoms",
        data(sampler={"max_atoms": 2}),
        "data.sampler.max_atoms",
    ),
    Case(
        "sampler-zero-systems",
        r"max_systems must be >= 1, got 0",
        data(sampler={"max_atoms": 100, "max_systems": 0}),
        "data.sampler.max_systems",
    ),
    Case(
        "sampler-without-max-atoms",
        r"required: the most atoms in flight",
        data(sampler={"max_systems": 4}),
        "data.sampler.max_atoms",
    ),
    Case(
        "sampler-unknown-key",
        r"unknown key\. Did you mean max_atoms",
        data(sampler={"max_atom": 100}),
        "data.sampler.max_atom",
    ),
    # --- sinks and callbacks ---------------------------------------------------------
    Case(
        "zarr-store-exists-mode-w-",
        r"already exists and mode is 'w-'; set .*mode to 'a' \(append\)",
        edit(existing_store),
        "simulator.sinks.0.init_args.store",
    ),
    Case(
        "zarr-append-clashing-ids",
        r"already holds system_id\(s\) 0 of these structures; set .*mode to 'w' \(replace\)"
        r".*number the structures past the stored ids \(data\.first_id\)",
        edit(store_holding_the_ids),
        "simulator.sinks.0.init_args.store",
    ),
    Case(
        "zarr-bad-mode",
        r"expected one of 'w-', 'a', 'w', got 'r'",
        sim(sinks=[{"class_path": "ZarrSink", "init_args": {"store": "x.zarr", "mode": "r"}}]),
        "simulator.sinks.0.init_args.mode",
    ),
    Case(
        "zarr-missing-store",
        r"required by ZarrSink but not given",
        sim(sinks=["ZarrSink"]),
        "simulator.sinks.0.init_args.store",
    ),
    Case(
        "trajectory-every-zero",
        r"every must be an int >= 1",
        sim(
            callbacks=[
                {"class_path": "TrajectoryWriter", "init_args": {"path": "t.zarr", "every": 0}}
            ]
        ),
        "simulator.callbacks.0.init_args.every",
    ),
    Case(
        "trajectory-without-positions",
        r"fields must include 'positions'",
        sim(
            callbacks=[
                {
                    "class_path": "TrajectoryWriter",
                    "init_args": {"path": "t.zarr", "fields": ["energy"]},
                }
            ]
        ),
        "simulator.callbacks.0.init_args.fields",
    ),
    Case(
        "logger-level-typo",
        r"unknown loguru level 'INFOO'; use e\.g\. 'DEBUG'",
        sim(callbacks=[{"class_path": "Logger", "init_args": {"level": "INFOO"}}]),
        "simulator.callbacks.0.init_args.level",
    ),
    # --- config files ----------------------------------------------------------------
    Case(
        "yaml-scalar",
        r"expected a mapping with sections simulator, data, output",
        text("42\n"),
        "--config",
    ),
    Case(
        "yaml-list", r"expected a mapping with sections", text("- simulator\n- data\n"), "--config"
    ),
    Case(
        "yaml-tab-indent", r"invalid YAML at line 2", text("simulator:\n\tmodel: EMT\n"), "--config"
    ),
    # --- structures ------------------------------------------------------------------
    Case(
        "builtin-set-typo",
        r"unknown built-in set 'mixed-argon'\. Did you mean builtin:mixed_argon",
        data(structures="builtin:mixed-argon"),
        "data.structures",
    ),
    Case(
        "builtin-arg-typo",
        r"builtin:argon has no argument 'nsystems'\. Did you mean n_systems",
        builtin(nsystems=2),
        "data.builtin_args.nsystems",
    ),
    # regression (fuzz): a string for an int gave "'<' not supported between 'str' and 'int'"
    Case(
        "builtin-arg-wrong-type",
        r"expected int, got 'x'",
        builtin(n_systems="x"),
        "data.builtin_args.n_systems",
    ),
    Case(
        "builtin-arg-zero",
        r"n_systems must be >= 1, got 0",
        builtin(n_systems=0),
        "data.builtin_args.n_systems",
    ),
    Case(
        "builtin-args-with-a-file",
        r"only applies to builtin: sets, not to the file",
        edit(lambda c, _: c["data"].update(structures=str(BAD / "copper.extxyz"))),
        "data.builtin_args",
    ),
    Case(
        "structure-file-missing",
        r"structure file '.*no_such\.extxyz' does not exist; check the path",
        structures("no_such.extxyz"),
        "data.structures",
    ),
    Case(
        "structure-file-unparsable",
        r"unparsable\.extxyz' line 1: expected the atom count that starts a frame, found "
        r"'this is not'.*pass format=",
        structures("unparsable.extxyz"),
        "data.structures",
    ),
    Case(
        "structure-file-empty",
        r"empty\.extxyz' is an empty file: it contains no structures; check the file",
        structures("empty.extxyz"),
        "data.structures",
    ),
    Case(
        "structure-file-truncated",
        r"the frame at line 1 \(4 atoms\) ends early .*check the file",
        structures("truncated.extxyz"),
        "data.structures",
    ),
    Case(
        "structure-bad-format",
        r"unknown structure file format 'extxzy'\. Did you mean extxyz",
        structures("copper.extxyz", format="extxzy"),
        "data.format",
    ),
    Case(
        "structure-index-out-of-range",
        r"index 5 selects no structure .*use ':' for all frames",
        structures("copper.extxyz", index=5),
        "data.index",
    ),
    Case(
        "structure-index-invalid",
        r"index 'abc' is not a valid frame index; use ':'",
        structures("copper.extxyz", index="abc"),
        "data.index",
    ),
    Case(
        "nan-coordinates",
        r"system 0: non-finite \(NaN/inf\) coordinates at atom\(s\) \[1\]; fix or drop",
        structures("nan_positions.extxyz"),
        "data.structures",
    ),
    Case(
        "nan-coordinates-inflight",
        r"1 invalid structure\(s\).*non-finite.*pass skip_invalid=True",
        structures("nan_positions.extxyz", sampler={"max_atoms": 100}),
        "data.structures",
    ),
    Case(
        "partial-occupancy-cif",
        r"partial_occupancy\.cif' \(structure 0\) has partially occupied sites: site 0 \(Cu1, "
        r"Cu 0\.5 \+ Au 0\.5, 4 atoms\); ASE reads each as one species \(Au4\).*order it "
        r"first .*partial_occupancy='majority'",
        structures("partial_occupancy.cif"),
        "data.structures",
    ),
    Case(
        "partial-occupancy-majority-warn",
        r"partially occupied sites taken as their majority species .*site 0 \(Cu1, Cu 0\.5 "
        r"\+ Au 0\.5, 4 atoms\) as Au",
        structures("partial_occupancy.cif", partial_occupancy="majority"),
        status=0,
    ),
    Case(
        "partial-occupancy-unknown",
        r"minority",
        structures("partial_occupancy.cif", partial_occupancy="minority"),
        "data.partial_occupancy",
    ),
    Case(
        "api-partial-occupancy",
        r"site 0 \(Cu1, Cu 0\.5 \+ Au 0\.5, 4 atoms\)",
        call=lambda _: read_structures(BAD / "partial_occupancy.cif"),
        exc=StructureError,
    ),
    Case(
        "overlapping-atoms-warn",
        r"system 0: atoms 0 and 1 are only 0\.100 Å apart.*duplicate atoms",
        structures("overlapping_atoms.extxyz"),
        status=0,
    ),
    Case(
        "zero-mass",
        r"system 0: zero, negative or non-finite mass at atom\(s\) \[0\].*set positive",
        structures("zero_mass.extxyz"),
        "data.structures",
    ),
    Case(
        "negative-mass",
        r"system 0: zero, negative .* mass at atom\(s\) \[1\].*set positive masses",
        structures("negative_mass.extxyz"),
        "data.structures",
    ),
    Case(
        "unknown-element-for-model",
        r"EMT cannot evaluate element Fe \(Z=26\) in system 1.*"
        r"choose a model that covers it",
        structures("iron_for_emt.extxyz"),
        "data.structures",
    ),
    Case(
        "singular-cell-with-pbc",
        r"system 0: the cell is singular .*give a full cell or set pbc=False",
        structures("singular_cell.extxyz"),
        "data.structures",
    ),
    Case(
        "empty-system",
        r"system 1 has no atoms: remove it from the input",
        structures("empty_system.extxyz"),
        "data.structures",
    ),
    Case(
        "unsupported-constraint",
        r"constraint FixScaled is not supported; supported: ExternalForce, FixAtoms",
        edit(constrained_traj),
        "data.structures",
    ),
    # --- command line and resume -------------------------------------------------------
    Case(
        "override-section-typo",
        r"unknown option\. Did you mean --simulator",
        lambda _: BASE,
        "simulatr.seed",
        argv=("--simulatr.seed", "1"),
    ),
    Case(
        "override-without-value",
        r"expected a value after the option",
        lambda _: BASE,
        "simulator.seed",
        argv=("--simulator.seed",),
    ),
    Case(
        "resume-from-corrupt-checkpoint",
        r"corrupt\.ckpt' is damaged: it does not start like an alchemi_lit checkpoint",
        lambda _: BASE,
        None,
        command="run",
        argv=("--resume", str(BAD / "corrupt.ckpt")),
    ),
    # --- Python API ----------------------------------------------------------------------
    Case(
        "api-model-not-a-model",
        r"model must be an alchemi_lit Model.*subclassing",
        call=lambda _: simulator(model="lj-argon"),
        exc=ConfigError,
    ),
    Case(
        "api-bad-precision",
        r"precision must be one of",
        call=lambda _: simulator(precision="16"),
        exc=ConfigError,
    ),
    Case(
        "api-per-system-temperature",
        r"Langevin: every temperature \(K\) must be >= 0",
        call=lambda _: Langevin(temperature=torch.tensor([300.0, -1.0])),
        exc=ValueError,
    ),
    Case(
        "api-buffer-zero-atoms",
        r"num_atoms must be an integer >= 1, got 0",
        call=lambda _: BufferConfig(num_atoms=0),
        exc=ConfigError,
    ),
    Case(
        "api-buffer-negative-edges",
        r"num_edges must be an integer >= 0, got -1 \(0: unbounded\)",
        call=lambda _: BufferConfig(num_edges=-1),
        exc=ConfigError,
    ),
    Case(
        "api-buffer-string",
        r"num_systems must be an integer >= 1, got 'many'",
        call=lambda _: BufferConfig(num_systems="many"),
        exc=ConfigError,
    ),  # type: ignore[arg-type]
    Case(
        "api-pipeline-ranks",
        r"2 stage rank\(s\) but devices=4",
        call=lambda _: simulator(stages=FIRE() | FIRE(), devices=4),
        exc=ConfigError,
    ),
    Case(
        "api-empty-structure-list",
        r"no structures given: pass a non-empty list",
        call=lambda _: Batch.from_atoms([]),
        exc=StructureError,
    ),
    Case(
        "api-unsupported-constraint",
        r"system 0: constraint FixScaled is not supported",
        call=lambda _: fix_scaled(),
        exc=StructureError,
    ),
    Case(
        "api-sampler-too-small",
        r"system 0 \(system_id 0\) has 32 atoms, more than max_atoms=8.*raise max_atoms",
        call=lambda _: SizeAwareSampler([bulk("Ar", cubic=True).repeat(2)], max_atoms=8),
        exc=StructureError,
    ),
    Case(
        "api-sampler-generator",
        r"dataset must be indexable \(len\(\) and \[k\]\) or a path, got a generator; wrap it",
        call=lambda _: SizeAwareSampler((a for a in [bulk("Ar")]), max_atoms=8),
        exc=ConfigError,
    ),
    Case(
        "api-sampler-not-atoms",
        r"SizeAwareSampler: structure 1 is of type str, not ase\.Atoms; .*read_structures",
        call=lambda _: SizeAwareSampler([bulk("Ar"), "ar.xyz"], max_atoms=8),
        exc=StructureError,
    ),
    Case(
        "api-atomic-number-not-an-element",
        r"system 0: atomic number\(s\) \[200\] at atom\(s\) \[1\] are not elements "
        r"\(1-118, or 0 for a dummy atom X\); fix atoms\.numbers",
        call=lambda _: Batch.from_atoms(
            [Atoms(numbers=[29, 200], positions=[[0, 0, 0], [2, 0, 0]])]
        ),
        exc=StructureError,
    ),
    Case(
        "api-workflow-atomic-number-not-an-element",
        r"elastic: system 0: atomic number\(s\) \[-3\] at atom\(s\) \[0\] are not elements",
        call=lambda _: workflows.elastic(
            [Atoms(numbers=[-3], cell=np.eye(3) * 3, pbc=True)], EMT()
        ),
        exc=StructureError,
    ),
    Case(
        "api-batch-not-atoms",
        r"from_atoms: structure 0 is of type dict, not ase\.Atoms",
        call=lambda _: Batch.from_atoms([{"symbols": "Ar"}]),
        exc=StructureError,
    ),
    Case(
        "api-zarr-append-clashing-ids",
        r"already holds system_id\(s\) 0 \(1 of this run's systems\); give this run other ids",
        call=zarr_append_clash,
        exc=ConfigError,
    ),
    Case(
        "api-trajectory-as-structures",
        r"is a trajectory store, not an alchemi_lit results store",
        call=trajectory_as_structures,
        exc=StructureError,
    ),
    Case(
        "api-unparsable-file",
        r"could not read structures from .*unparsable",
        call=lambda _: read_structures(BAD / "unparsable.extxyz"),
        exc=StructureError,
    ),
    Case(
        "api-unknown-element",
        r"EMT cannot evaluate element Fe .*Remove that structure",
        call=lambda _: EMT().check_batch(iron_batch()),
        exc=ModelError,
    ),
    Case(
        "api-run-empty-list",
        r"run\(\) takes a Batch, an ase\.Atoms or a non-empty list",
        call=lambda _: simulator().run([]),
        exc=ConfigError,
    ),
    Case(
        "api-zarr-bad-mode",
        r"ZarrSink mode must be 'w-', 'a' or 'w', got 'r'",
        call=lambda _: ZarrSink("x.zarr", mode="r"),
        exc=ConfigError,
    ),  # type: ignore[arg-type]
    Case(
        "api-zarr-store-exists",
        r"already exists; use ZarrSink\(\.\.\., mode='a'\) to append",
        call=zarr_existing,
        exc=ConfigError,
    ),
    Case(
        "api-checkpoint-corrupt",
        r"corrupt\.ckpt' is damaged",
        call=lambda _: load_checkpoint(BAD / "corrupt.ckpt"),
        exc=ConfigError,
    ),
    Case(
        "api-not-a-checkpoint",
        r"every checkpoint there is damaged \(step-000000000010\.ckpt: it does not start like",
        call=not_a_checkpoint,
        exc=ConfigError,
    ),
    # --- runtime states: one bad system or sink never costs the others ---------------------
    Case(
        "runtime-model-nan-for-one-system", r"^completed,non_finite,completed$", call=run_nan_model
    ),
    Case(
        "runtime-model-raises-on-one-system",
        r"^completed,model_error,completed \| "
        r"RuntimeError: boom",
        call=run_raising_model,
    ),
    Case(
        "runtime-sink-fails",
        r"^3 in memory, 3 results \| sink FullDisk failed \(OSError: .*No "
        r"space left on device\).*go to the next sink or stay in memory",
        call=run_failing_sink,
    ),
    Case(
        "runtime-every-sink-fails",
        r"^2 results \| 2 finished system\(s\) could not be written to "
        r"any sink and are kept in memory",
        call=run_all_sinks_failing,
    ),
]


def test_catalogue_is_large_and_unique() -> None:
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)), "duplicate case ids"
    assert len(CASES) >= 40


def _write_config(tmp: Path, conf: dict[str, Any] | str) -> Path:
    path = tmp / "config.yaml"
    path.write_text(conf if isinstance(conf, str) else yaml.safe_dump(conf))
    return path


def _cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(argv)
    return status, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(
    case: Case,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    log_messages: list[tuple[str, str]],
) -> None:
    monkeypatch.chdir(tmp_path)  # relative paths (stores, trajectories) stay in here
    if case.config is None:  # Python API or runtime case
        assert case.call is not None
        if case.exc is not None:
            with pytest.raises(case.exc, match=case.match):
                case.call(tmp_path)
        else:
            result = case.call(tmp_path)
            assert re.search(case.match, result), result
        return
    path = _write_config(tmp_path, case.config(tmp_path))
    status, _, err = _cli([case.command, "--config", str(path), *case.argv])
    assert status == case.status, err
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    if case.status == 0:  # a warning, not an error
        assert not lines, err
        warnings = [m for level, m in log_messages if level == "WARNING"]
        assert any(re.search(case.match, m) for m in warnings), warnings
        return
    assert len(lines) == 1, err
    line = lines[0]
    if case.key is not None:
        assert line.startswith(f"error: {case.key}: "), line
    assert re.search(case.match, line), line
    assert "(run again with --debug" not in err  # a usage error, not an internal one


def test_debug_adds_the_traceback(tmp_path: Path) -> None:
    """The same error with --debug: the traceback first, the one-line error last."""
    path = _write_config(tmp_path, md(dt=-1.0)(tmp_path))
    status, _, err = _cli(["validate", "--config", str(path), "--debug"])
    assert status == 2
    assert "Traceback" in err
    assert err.strip().splitlines()[-1].startswith("error: simulator.stages.0.init_args.dt: ")


def test_characters_beyond_the_bmp_are_accepted(tmp_path: Path) -> None:
    """Regression (fuzz): a value with a character beyond U+FFFF (an emoji in a store
    path) broke jsonargparse's YAML reading of the merged config ("invalid Unicode
    character escape code"); such values are valid and now pass through unchanged."""
    store = str(tmp_path / "r\U0001f600\x9a.zarr")
    conf = sim(sinks=[{"class_path": "ZarrSink", "init_args": {"store": store}}])(tmp_path)
    path = _write_config(tmp_path, conf)
    status, out, err = _cli(["run", "--config", str(path), "--print_config"])
    assert status == 0, err
    assert yaml.safe_load(out)["simulator"]["sinks"][0]["init_args"]["store"] == store


def test_every_element_a_model_lacks_is_named_at_once_with_its_systems(tmp_path):
    """A screen with Po, Rn and Fe in it (EMT covers none) names all three and every
    structure holding them in one error -- it named the first and stopped (#42); past
    the cap the rest are counted."""
    from ase.io import write

    from alchemi_lit.models.base import SHOWN_SYSTEMS

    cu = bulk("Cu", "fcc", a=3.6)
    po, rn, fe = bulk("Po", "sc", a=3.35), bulk("Rn", "fcc", a=6.0), bulk("Fe", "bcc", a=2.87)
    structures = [cu, po, cu, rn, fe, po] + [fe.copy() for _ in range(SHOWN_SYSTEMS + 3)]
    with pytest.raises(ModelError) as caught:
        EMT().check_batch(Batch.from_atoms(structures, validate=False))
    text = str(caught.value)
    assert "Fe (Z=26) in systems 4, 6, 7, 8, 9, 10 and 4 more" in text
    assert "Po (Z=84) in systems 1, 5;" in text and "Rn (Z=86) in system 3 (" in text
    assert "(13 systems in all)" in text and "Remove those structures" in text
    with pytest.raises(StructureError) as caught:
        workflows.eos(structures[:6], EMT())
    text = str(caught.value)
    assert "structures 1, 5;" in text and "structure 4;" in text
    assert "structure 3 (4 structures" in text
    store = tmp_path / "in.extxyz"
    write(str(store), structures[:6])
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        f"simulator: {{model: {{class_path: EMT}}, stages: [{{class_path: FIRE}}]}}\n"
        f"data: {{structures: {str(store)!r}}}\n"
    )
    assert main(["validate", "--config", str(cfg)]) != 0
