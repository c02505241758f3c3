"""Checkpoint and resume: interrupted anywhere, resumed runs equal uninterrupted ones."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr

import alchemi_lit as al
from alchemi_lit.callbacks import Checkpoint, HookStageEnum, LambdaCallback, TrajectoryWriter
from alchemi_lit.callbacks.checkpoint import load_checkpoint
from alchemi_lit.callbacks.trajectory import read_trajectory
from alchemi_lit.core.errors import ConfigError
from alchemi_lit.data import SizeAwareSampler, mixed_argon
from alchemi_lit.engine.checkpoint_file import is_intact
from alchemi_lit.engine.hooks import Callback
from alchemi_lit.integrators import FIRE, Langevin
from alchemi_lit.models import LennardJones
from alchemi_lit.sinks import HostMemory, ZarrSink

DATA = mixed_argon(24, 8, 50, seed=2)
for _k, _a in enumerate(DATA):  # user metadata must survive stores and resumes
    _a.info.update(material_id=f"m-{_k}", weights=np.arange(3, dtype=np.float32) * _k)


class Crash(Exception):
    pass


def make_sim(tmp: Path, extra=(), every: int = 20, plan=None) -> al.Simulator:
    plan = plan or (
        FIRE(fmax=0.05, max_steps=60) + Langevin(dt=2.0, temperature=80.0, friction=0.02, steps=30)
    )
    return al.Simulator(
        model=LennardJones(0.0104, 3.40, 6.0),
        stages=plan,
        sinks=[HostMemory(capacity=8), ZarrSink(tmp / "res.zarr", mode="w")],
        callbacks=[
            Checkpoint(tmp / "ckpt", every=every),
            TrajectoryWriter(tmp / "traj.zarr", every=7, overwrite=True),
            *extra,
        ],
        sync_every=5,
    )


def sampler() -> SizeAwareSampler:
    return SizeAwareSampler(DATA, max_atoms=200)


def assert_batches_equal(a: al.Batch, b: al.Batch) -> None:
    assert a.system_id.tolist() == b.system_id.tolist()
    for store_a, store_b in ((a.atom, b.atom), (a.system, b.system)):
        for key in store_a:
            x, y = store_a[key], store_b[key]
            same = torch.equal(x, y) or (
                x.is_floating_point() and torch.equal(x.nan_to_num(7.0), y.nan_to_num(7.0))
            )
            assert same, key
    assert sorted(a.info) == sorted(b.info)
    for sid, info in a.info.items():
        other = b.info[sid]
        assert sorted(info) == sorted(other), sid
        for key, value in info.items():
            if isinstance(value, np.ndarray):
                assert value.dtype == other[key].dtype and np.array_equal(value, other[key])
            else:
                assert value == other[key], (sid, key)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reference")
    res = make_sim(tmp).run(sampler())
    return tmp, res


class GraduatedAtEnd(Callback):
    """Keeps ``graduated_systems`` (what progress and summaries count) at run end."""

    def on_run_end(self, ctx) -> None:  # type: ignore[no-untyped-def]
        self.count = ctx.graduated_systems


@pytest.mark.parametrize(("crash_step", "every"), [(11, 3), (23, 20), (61, 20), (94, 20)])
def test_resume_after_crash_is_bit_identical(tmp_path, reference, crash_step, every):
    """Crashes in the FIRE stage (step 11, checkpoint at 9: FIRE's counters past n_min
    must survive), in the fused FIRE + Langevin stretch, and late."""
    ref_dir, ref = reference

    def boom(ctx):
        if ctx.step == crash_step:
            raise Crash(f"simulated crash at step {crash_step}")

    with pytest.raises(Crash):
        make_sim(tmp_path, [LambdaCallback(HookStageEnum.AFTER_STEP, boom)], every).run(sampler())
    files = sorted((tmp_path / "ckpt").glob("step-*.ckpt"))
    assert 1 <= len(files) <= 2 and not list((tmp_path / "ckpt").glob("*.tmp"))
    if every == 3:  # the point of this case: FIRE state mid-stage
        saved = load_checkpoint(tmp_path / "ckpt")["batch"]["system"]
        in_fire = saved["status"] == 0
        assert (saved["fire_n"][in_fire] > FIRE().n_min).any(), "no checkpoint mid-FIRE"
        assert (saved["fire_dt"][in_fire] != FIRE().dt0).any()
    seen = GraduatedAtEnd()
    resumed = make_sim(tmp_path, [seen]).run(sampler(), resume=str(tmp_path / "ckpt"))
    assert seen.count == len(DATA)  # the count callbacks see goes on from the checkpoint's
    # sinks: every system exactly once, bit-identical to the uninterrupted run
    assert_batches_equal(
        ZarrSink(ref_dir / "res.zarr").read_batch(), ZarrSink(tmp_path / "res.zarr").read_batch()
    )
    assert_batches_equal(ref.batch, resumed.batch)
    total = len(ZarrSink(tmp_path / "res.zarr")) + len(resumed)
    assert total == len(DATA)
    stored = ZarrSink(tmp_path / "res.zarr").read_batch()
    # rows written after the checkpoint were rolled back, atoms too: none left orphaned
    attrs = zarr.open_group(str(tmp_path / "res.zarr"), mode="r").attrs
    assert attrs["n_atoms"] == int(stored.n_atoms.sum()) and attrs["n_systems"] == total - 8
    for sid in stored.system_id.tolist():
        assert stored.info[sid]["material_id"] == f"m-{sid}"
        assert stored.info[sid]["weights"].tolist() == [0.0, sid, 2.0 * sid]
    for sid in (0, 11, 23):
        frames_a = read_trajectory(ref_dir / "traj.zarr", sid)
        frames_b = read_trajectory(tmp_path / "traj.zarr", sid)
        assert [f.info.get("step") for f in frames_a] == [f.info.get("step") for f in frames_b]
        assert [f.info["run"] for f in frames_b] == [0] * len(frames_b)  # one run, resumed
        assert all((fa.positions == fb.positions).all() for fa, fb in zip(frames_a, frames_b))


def test_checkpoint_is_safe_to_load_and_complete(tmp_path):
    def boom(ctx):
        if ctx.step == 45:
            raise Crash("stop")

    with pytest.raises(Crash):
        make_sim(tmp_path, [LambdaCallback(HookStageEnum.AFTER_STEP, boom)]).run(sampler())
    state = load_checkpoint(tmp_path / "ckpt")  # weights_only=True inside
    assert state["step"] == 40
    assert state["batch"]["system"]["system_id"].dtype == torch.int64
    assert "fire_dt" in state["batch"]["system"]  # integrator state travels
    assert state["feed"]["sampler"]["position"] > 0
    assert state["fingerprint"]["stages"][1]["temperature"] == 80.0
    assert is_intact(state["path"])  # every record verified and weights_only-loaded


def test_resume_refuses_a_different_run(tmp_path):
    def boom(ctx):
        if ctx.step == 25:
            raise Crash("stop")

    with pytest.raises(Crash):
        make_sim(tmp_path, [LambdaCallback(HookStageEnum.AFTER_STEP, boom)]).run(sampler())
    other = make_sim(tmp_path, plan=FIRE(fmax=0.05, max_steps=60))
    with pytest.raises(ConfigError, match="plan"):
        other.run(sampler(), resume=str(tmp_path / "ckpt"))
    with pytest.raises(ConfigError, match="input structures"):
        make_sim(tmp_path).run(
            SizeAwareSampler(DATA[:10], max_atoms=200), resume=str(tmp_path / "ckpt")
        )


# ------------------------------------------------------------------ CLI, kill -9
CONFIG = """
simulator:
  model: {{class_path: LennardJones, init_args: {{epsilon: 0.0104, sigma: 3.40, cutoff: 6.0}}}}
  stages:
    - {{class_path: FIRE, init_args: {{fmax: 0.02, max_steps: 100}}}}
    - class_path: Langevin
      init_args: {{dt: 2.0, temperature: 80.0, friction: 0.02, steps: 100}}
  callbacks:
    - {{class_path: Checkpoint, init_args: {{dirpath: {ckpt}, every: 10}}}}
  sinks:
    - {{class_path: ZarrSink, init_args: {{store: {store}, mode: w}}}}
  sync_every: 5
data:
  structures: builtin:mixed_argon
  builtin_args: {{n_systems: 24, min_atoms: 8, max_atoms: 50, seed: 5}}
  sampler: {{max_atoms: 300}}
"""


def _write_config(tmp: Path, name: str) -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(CONFIG.format(ckpt=tmp / f"{name}_ckpt", store=tmp / f"{name}.zarr"))
    return path


def _cli(*args: str, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "alchemi_lit.cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **kwargs,
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["kill", "sigterm"])
def test_cli_killed_then_resumed_equals_uninterrupted(tmp_path, how):
    full = _cli("run", "--config", str(_write_config(tmp_path, "full")))
    _, err = full.communicate(timeout=240)
    assert full.returncode == 0, err.decode()[-2000:]

    config = _write_config(tmp_path, "cut")
    proc = _cli("run", "--config", str(config))
    ckpt = tmp_path / "cut_ckpt"
    deadline = time.time() + 120

    def steps_saved() -> list[int]:
        return [int(f.stem.split("-")[1]) for f in ckpt.glob("step-*.ckpt")]

    # interrupted after the second checkpoint (step 20), between two checkpoints; the
    # run lasts up to 200 steps, so it is still going unless checkpoints are broken
    while max(steps_saved(), default=0) < 20 and time.time() < deadline:
        time.sleep(0.02)
    assert max(steps_saved(), default=0) >= 20, "no checkpoint at step 20 appeared"
    assert proc.poll() is None, "the run ended right after its second checkpoint"
    proc.send_signal(signal.SIGKILL if how == "kill" else signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    if how == "sigterm":
        assert proc.returncode == 128 + signal.SIGTERM, err.decode()[-2000:]
        assert "--resume" in err.decode()
    resumed = _cli("run", "--config", str(config), "--resume")
    _, err = resumed.communicate(timeout=240)
    assert resumed.returncode == 0, err.decode()[-2000:]
    assert_batches_equal(
        ZarrSink(tmp_path / "full.zarr").read_batch(), ZarrSink(tmp_path / "cut.zarr").read_batch()
    )


@pytest.mark.parametrize("mode", ["w-", "a"])
def test_cli_resume_is_not_refused_by_its_own_store(tmp_path, mode):
    """The store a run was writing exists, and holds its ids, when the run resumes: the
    checks that protect stores from other runs (mode 'w-', ids already stored with
    'a') must not refuse the resume.  Resumed from the checkpoint of a mid-run step,
    the store ends as the uninterrupted run left it, each system once."""
    import contextlib
    import io

    from alchemi_lit.cli import main

    text = CONFIG.format(ckpt=tmp_path / "ckpt", store=tmp_path / "r.zarr")
    text = text.replace("mode: w}", f"mode: '{mode}'}}").replace("n_systems: 24", "n_systems: 8")
    config = tmp_path / "run.yaml"
    config.write_text(text)
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        assert main(["run", "--config", str(config)]) == 0, err.getvalue()
        first = ZarrSink(tmp_path / "r.zarr").read_batch()
        older = sorted((tmp_path / "ckpt").glob("step-*.ckpt"))[0]  # a mid-run state
        status = main(["run", "--config", str(config), "--resume", str(older)])
    assert status == 0, err.getvalue()
    assert_batches_equal(first, ZarrSink(tmp_path / "r.zarr").read_batch())


def test_a_fresh_run_sets_aside_the_checkpoints_an_earlier_run_left(tmp_path):
    """Two runs share a checkpoint folder: the second must not resume the first's
    systems (resuming took the newest file by name, the first run's), nor lose its
    own checkpoints to pruning.  The first run's files are kept, aside, by path."""
    first = make_sim(tmp_path, every=5)
    first.run(SizeAwareSampler(DATA[:6], max_atoms=200))
    earlier = sorted(p.name for p in (tmp_path / "ckpt").glob("step-*.ckpt"))
    batch = al.Batch.from_atoms(DATA[6:9], system_ids=[16, 17, 18])
    second = make_sim(tmp_path, every=5)
    second.plan.stages[0].max_steps = 8  # a shorter run: fewer, lower-numbered files
    second.run(batch)
    aside = list((tmp_path / "ckpt").glob("earlier-*"))
    assert len(aside) == 1 and sorted(p.name for p in aside[0].glob("*.ckpt")) == earlier
    resumed = second.run(batch, resume=str(tmp_path / "ckpt"))
    assert resumed.system_id.tolist() == [16, 17, 18]
    with pytest.raises(ConfigError, match="input structures"):  # another batch: refused
        second.run(al.Batch.from_atoms(DATA[6:9]), resume=str(tmp_path / "ckpt"))


def test_the_auto_cadence_books_when_a_checkpoint_is_due(tmp_path):
    """With ``sync_every="auto"`` nothing finishes in a run of MD until its end, so only a
    due checkpoint makes the loop book: it is written at the step it is due, not at the
    next bookkeeping the cadence would make for itself (the run's end here)."""
    every = Checkpoint(tmp_path / "ckpt", every=3)
    sim = al.Simulator(
        model=LennardJones(0.0104, 3.40, 6.0), stages=Langevin(dt=2.0, temperature=80.0, steps=10),
        callbacks=[every], sync_every="auto",
    )  # fmt: skip
    sim.run(DATA[:2])
    assert [int(p.stem.split("-")[1]) for p in every.saved] == [3, 6, 9]


def test_a_resume_admits_at_once_what_the_checkpoints_bookkeeping_admitted(tmp_path):
    """A checkpoint is written in a bookkeeping after graduation and before admission:
    the resumed run admits first, as the uninterrupted run did right after it, so both
    end at the same step.  (Admitted a bookkeeping late, the new systems leave every
    result equal -- what the crash tests compare -- but the run longer.)"""

    def sim(folder: str) -> al.Simulator:
        return al.Simulator(
            model=LennardJones(0.0104, 3.40, 6.0), stages=FIRE(fmax=0.1, max_steps=20),
            callbacks=[Checkpoint(tmp_path / folder, every=1, keep=100)],
            sinks=[HostMemory()], sync_every=2,
        )  # fmt: skip

    def two_at_a_time() -> SizeAwareSampler:
        return SizeAwareSampler(DATA[:3], max_atoms=200, max_systems=2)

    whole = sim("whole").run(two_at_a_time())  # (one of the first two leaves at step 8)
    saved = sorted((tmp_path / "whole").glob("step-*.ckpt"))
    first_refill = next(f for f in saved if load_checkpoint(f)["graduated"] >= 1)
    running = load_checkpoint(first_refill)["batch"]["system"]["status"]
    assert len(running) == 1  # (the refill joins a system still running)
    resumed = sim("resumed").run(two_at_a_time(), resume=str(first_refill))
    assert len(resumed) == len(whole) == 3  # (the delivered systems are in the checkpoint)
    assert resumed.stats["steps"] == whole.stats["steps"]


def test_when_a_checkpoint_is_due(tmp_path, monkeypatch):
    """A signal writes one unless on_signal=False; otherwise every steps or
    every_seconds seconds after the last one (a fake clock)."""
    from alchemi_lit.callbacks import checkpoint

    now = [100.0]
    monkeypatch.setattr(checkpoint.time, "monotonic", lambda: now[0])
    assert Checkpoint(tmp_path, every=None).due(3, interrupted=True)
    quiet = Checkpoint(tmp_path, every=10, every_seconds=60.0, on_signal=False)
    assert not quiet.due(3, interrupted=True)
    quiet.mark_saved(20, tmp_path / "x.ckpt")
    assert not quiet.due(29) and quiet.due(30)
    now[0] += 59.5
    assert not quiet.due(21)
    now[0] += 0.5
    assert quiet.due(21)
