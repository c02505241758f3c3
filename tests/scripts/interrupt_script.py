"""A run without a Checkpoint callback that a test stops with a signal.

    python tests/scripts/interrupt_script.py OUT_DIR [--pipeline] [--resume]

Writes ``OUT_DIR/results.zarr`` (a buffering ZarrSink: nothing reaches the store before
the run ends unless the signal handling flushes it).  Once ``READY_AFTER`` systems have
finished it writes ``OUT_DIR/ready`` and slows every step down, so the test can send
its signal mid-run.  ``--resume`` continues the stopped run (``resume=True``).  The
exception the signal raises is written to ``OUT_DIR/interrupted.txt``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

import alchemi_lit as al
from alchemi_lit.data import SizeAwareSampler, mixed_argon
from alchemi_lit.engine.hooks import Callback
from alchemi_lit.engine.interrupt import RunInterrupted
from alchemi_lit.integrators import FIRE, Langevin
from alchemi_lit.models import LennardJones
from alchemi_lit.sinks import ZarrSink
from alchemi_lit.strategies.buffers import BufferConfig

READY_AFTER = 3


def data() -> list:
    return mixed_argon(24, 8, 30, seed=9)


def simulator(out: Path, pipeline: bool, marker: Callback | None) -> al.Simulator:
    relax = FIRE(fmax=0.05, max_steps=40)
    md = Langevin(dt=2.0, temperature=60.0, friction=0.02, steps=30)
    extra = {}
    if pipeline:
        extra = dict(
            strategy="pipeline", devices=2, start_method="popen", timeout=60,
            buffer=BufferConfig(num_systems=8, num_atoms=200),
        )  # fmt: skip
    return al.Simulator(
        model=LennardJones(0.0104, 3.40, 6.0),
        stages=relax | md if pipeline else relax + md,
        sinks=[ZarrSink(out / "results.zarr", mode="w")],
        callbacks=[marker] if marker is not None else [],
        sync_every=5,
        **extra,
    )


class Ready(Callback):
    """Marks the moment enough systems finished, then slows the run down."""

    def __init__(self, out: Path) -> None:
        super().__init__()
        self.out = out
        self.finished = 0

    def on_converge(self, ctx) -> None:
        if ctx.state.get("rank", 1) == 1:  # one device, or the pipeline's last rank
            # (each finished system is at the exit code at one bookkeeping only)
            self.finished += int((ctx.batch.status == ctx.state["exit_code"]).sum())

    def after_step(self, ctx) -> None:
        if self.finished >= READY_AFTER:
            (self.out / "ready").touch()
        if (self.out / "ready").exists():
            time.sleep(0.05)


def assert_same_results(a: al.Batch, b: al.Batch) -> None:
    """Two read-back batches of this run hold the same systems, bit for bit."""
    assert a.system_id.tolist() == b.system_id.tolist()
    for key in ("positions", "velocities", "forces"):
        assert torch.equal(a.atom[key], b.atom[key]), key
    for key in ("energy", "total_steps", "converged", "exit_code"):
        assert torch.equal(a.system[key], b.system[key]), key


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--pipeline", action="store_true")
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    marker = None if args.resume else Ready(args.out)
    sim = simulator(args.out, args.pipeline, marker)
    sampler = SizeAwareSampler(data(), max_atoms=150)
    try:
        sim.run(sampler, resume=True if args.resume else None)
    except RunInterrupted as exc:
        if sim.is_global_zero:
            (args.out / "interrupted.txt").write_text(f"{exc.signum}\n{exc}")
        raise


if __name__ == "__main__":
    main()
