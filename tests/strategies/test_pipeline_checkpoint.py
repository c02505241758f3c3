"""Pipeline checkpoints: ranks checkpoint the same exchange rounds (a consistent cut);
a crashed or killed pipeline resumes from the newest round every rank has, and its
results equal the uninterrupted run bit for bit, each system once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import alchemi_lit as al
from alchemi_lit.callbacks import Checkpoint, HookStageEnum, LambdaCallback
from alchemi_lit.data import SizeAwareSampler, mixed_argon
from alchemi_lit.engine.checkpoint_file import read_checkpoint
from alchemi_lit.integrators import FIRE, Langevin
from alchemi_lit.models import LennardJones
from alchemi_lit.sinks import ZarrSink
from alchemi_lit.strategies.buffers import BufferConfig
from alchemi_lit.strategies.pipeline import PipelineError

pytestmark = pytest.mark.multirank
DATA = mixed_argon(24, 8, 50, seed=3)


class Crash(Exception):
    pass


def make(
    tmp: Path, mode: str, extra=(), temperature: float = 50.0, checkpoint=None
) -> al.Simulator:
    return al.Simulator(
        model=LennardJones(0.0104, 3.40, 6.0),
        stages=FIRE(fmax=0.05, max_steps=80)
        | Langevin(dt=2.0, temperature=temperature, friction=0.02, steps=30),
        strategy="pipeline",
        devices=2,
        start_method="fork",
        comm_mode=mode,
        buffer=BufferConfig(num_systems=4, num_atoms=200),
        sync_every=5,
        timeout=30,
        sinks=[ZarrSink(tmp / "res.zarr", mode="w")],
        callbacks=[checkpoint or Checkpoint(tmp / "ckpt", every=10), *extra],
    )


def assert_stores_equal(a: Path, b: Path) -> None:
    x, y = ZarrSink(a).read_batch(), ZarrSink(b).read_batch()
    assert x.system_id.tolist() == y.system_id.tolist() == list(range(len(DATA)))
    for key in x.atom:
        assert torch.equal(x.atom[key], y.atom[key]), key
    for key in x.system:
        assert torch.equal(x.system[key].nan_to_num(7.0), y.system[key].nan_to_num(7.0)), key


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The store of the uninterrupted run in a comm mode (made once: every test compares
    its resumed run with the same one)."""
    done: dict[str, Path] = {}

    def store(mode: str) -> Path:
        if mode not in done:
            tmp = tmp_path_factory.mktemp(f"full-{mode}")
            make(tmp, mode).run(SizeAwareSampler(DATA, max_atoms=250))
            done[mode] = tmp / "res.zarr"
        return done[mode]

    return store


@pytest.mark.timeout(240)
@pytest.mark.slow  # fast: the damaged-round and time-scheduled tests crash rank 1 and resume
@pytest.mark.parametrize("mode", ["sync", "async_recv"])
def test_pipeline_resume_after_rank_failure_is_bit_identical(tmp_path, mode, uninterrupted):
    def boom(ctx):
        if ctx.state.get("rank") == 1 and ctx.step == 57:
            raise Crash("crash on rank 1")

    cut = tmp_path / "cut"
    with pytest.raises(PipelineError, match="rank 1"):
        make(cut, mode, [LambdaCallback(HookStageEnum.AFTER_STEP, boom)]).run(
            SizeAwareSampler(DATA, max_atoms=250)
        )
    assert list((cut / "ckpt" / "rank0").glob("round-*.ckpt"))
    assert list((cut / "ckpt" / "rank1").glob("round-*.ckpt"))
    make(cut, mode).run(SizeAwareSampler(DATA, max_atoms=250), resume=str(cut / "ckpt"))
    assert_stores_equal(uninterrupted(mode), cut / "res.zarr")


@pytest.mark.timeout(240)
def test_pipeline_resume_checks_the_run_and_passes_over_a_damaged_round(tmp_path, uninterrupted):
    """The ranks refuse a resume of another run exactly as one device does (naming
    the parameter), and when a rank's newest round file has a flipped bit every rank
    goes back to the newest round all of them hold intact."""

    def boom(ctx):
        if ctx.state.get("rank") == 1 and ctx.step == 57:
            raise Crash("crash on rank 1")

    cut = tmp_path / "cut"
    with pytest.raises(PipelineError):
        make(cut, "async_recv", [LambdaCallback(HookStageEnum.AFTER_STEP, boom)]).run(
            SizeAwareSampler(DATA, max_atoms=250)
        )
    with pytest.raises(PipelineError, match=r"temperature: 50\.0 -> 90\.0"):
        make(cut, "async_recv", temperature=90.0).run(
            SizeAwareSampler(DATA, max_atoms=250), resume=str(cut / "ckpt")
        )
    rounds = sorted((cut / "ckpt" / "rank1").glob("round-*.ckpt"))
    assert len(rounds) >= 2
    data = bytearray(rounds[-1].read_bytes())
    data[len(data) // 2] ^= 0x01
    rounds[-1].write_bytes(bytes(data))
    make(cut, "async_recv").run(SizeAwareSampler(DATA, max_atoms=250), resume=str(cut / "ckpt"))
    assert_stores_equal(uninterrupted("async_recv"), cut / "res.zarr")


@pytest.mark.slow  # (a pipeline's step-scheduled checkpoints and resume stay fast:
# test_pipeline_resume_checks_the_run_and_passes_over_a_damaged_round)
@pytest.mark.timeout(240)
def test_time_scheduled_checkpoints_fall_on_the_same_round_on_every_rank(
    tmp_path, uninterrupted
):
    """Checkpoint(every_seconds=...) on a pipeline: the rank whose timer runs out asks for
    a round ahead in its message headers, so every rank checkpoints that same round; a
    crashed run resumes from one and equals the uninterrupted run."""

    def slow_then_boom(ctx):
        time.sleep(0.01)
        if ctx.state.get("rank") == 1 and ctx.step == 80:
            raise Crash("crash on rank 1")

    cut = tmp_path / "cut"
    timed = Checkpoint(cut / "ckpt", every=None, every_seconds=0.2, keep=50)
    with pytest.raises(PipelineError):
        make(
            cut, "async_recv", [LambdaCallback(HookStageEnum.AFTER_STEP, slow_then_boom)],
            checkpoint=timed,
        ).run(SizeAwareSampler(DATA, max_atoms=250))  # fmt: skip
    rounds = [
        {int(p.stem.split("-")[1]) for p in (cut / "ckpt" / f"rank{r}").glob("round-*.ckpt")}
        for r in (0, 1)
    ]
    assert rounds[1], "no time-scheduled checkpoint was written"
    assert rounds[1] <= rounds[0]  # the same rounds on both ranks (a consistent cut)
    make(cut, "async_recv", checkpoint=timed).run(
        SizeAwareSampler(DATA, max_atoms=250), resume=str(cut / "ckpt")
    )
    assert_stores_equal(uninterrupted("async_recv"), cut / "res.zarr")


CONFIG = """
simulator:
  model: {{class_path: LennardJones, init_args: {{epsilon: 0.0104, sigma: 3.40, cutoff: 6.0}}}}
  stages:
    - - {{class_path: FIRE, init_args: {{fmax: 0.02, max_steps: 120}}}}
    - - class_path: Langevin
        init_args: {{dt: 2.0, temperature: 80.0, friction: 0.02, steps: 120}}
  strategy: pipeline
  devices: 2
  timeout: 30
  buffer: {{num_systems: 4, num_atoms: 200}}
  callbacks:
    - {{class_path: Checkpoint, init_args: {{dirpath: {ckpt}, every: 10}}}}
  sinks:
    - {{class_path: ZarrSink, init_args: {{store: {store}, mode: w}}}}
  sync_every: 5
data:
  structures: builtin:mixed_argon
  builtin_args: {{n_systems: 24, min_atoms: 8, max_atoms: 50, seed: 5}}
  sampler: {{max_atoms: 250}}
"""


def _cli(*args: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "alchemi_lit.cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_cli_pipeline_killed_then_resumed_equals_uninterrupted(tmp_path):
    configs = {}
    for name in ("full", "cut"):
        configs[name] = tmp_path / f"{name}.yaml"
        configs[name].write_text(
            CONFIG.format(ckpt=tmp_path / f"{name}_ckpt", store=tmp_path / f"{name}.zarr")
        )
    full = _cli("run", "--config", str(configs["full"]))
    _, err = full.communicate(timeout=300)
    assert full.returncode == 0, err.decode()[-3000:]

    proc = _cli("run", "--config", str(configs["cut"]))
    ckpt = tmp_path / "cut_ckpt" / "rank1"
    deadline = time.time() + 200
    while len(list(ckpt.glob("round-*.ckpt"))) < 2 and time.time() < deadline:
        time.sleep(0.05)
    # the run lasts ~20 checkpoint rounds: two rounds written and the run still going,
    # or the checkpoint writer is broken (never "the machine was too fast")
    assert len(list(ckpt.glob("round-*.ckpt"))) >= 2, "no two checkpoint rounds written"
    assert proc.poll() is None, "the run ended two checkpoint rounds in"
    os.killpg(proc.pid, signal.SIGKILL)  # every rank of the job, as a scheduler would
    proc.communicate(timeout=60)
    resumed = _cli("run", "--config", str(configs["cut"]), "--resume")
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err.decode()[-3000:]
    assert_stores_equal(tmp_path / "full.zarr", tmp_path / "cut.zarr")


@pytest.mark.timeout(240)
def test_a_fresh_pipeline_run_sets_aside_an_earlier_runs_rank_checkpoints(tmp_path):
    """Stale rank folders (a done.ckpt of an earlier run would make a resume of this run
    think it had finished) are moved aside before the ranks start; the run completes
    and resuming it finds its own checkpoints."""
    stale = tmp_path / "ckpt" / "rank0"
    stale.mkdir(parents=True)
    (stale / "done.ckpt").write_bytes(b"an earlier run's")
    sim = make(tmp_path, "async_recv")
    sim.run(SizeAwareSampler(DATA[:8], max_atoms=250))
    (aside,) = (tmp_path / "ckpt").glob("earlier-*")
    assert (aside / "rank0" / "done.ckpt").read_bytes() == b"an earlier run's"
    assert read_checkpoint(tmp_path / "ckpt" / "rank0" / "done.ckpt")["done"]
