"""A 2-rank relax | md pipeline run from a plain script (launch-path tests).

    python tests/scripts/pipeline_script.py OUT_DIR [--systems N] [--slow S] [--linger S]
    python -m torch.distributed.run --nproc_per_node=2 tests/scripts/pipeline_script.py OUT_DIR

Started plainly, Fabric re-runs this command line for rank 1 (start_method="popen");
under torchrun every rank runs it.  Results go to ``OUT_DIR/results.zarr``.  Each rank
writes ``OUT_DIR/pid_rank<r>`` (its process id) once the run has started, and with
``--slow`` sleeps that long every step (so a test can kill a rank mid-run).  Rank 0
writes ``OUT_DIR/done.json`` when the run returns; with ``--linger`` the other ranks
take that long to finish after it (a slow shutdown).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

import alchemi_lit as al
from alchemi_lit.data import SizeAwareSampler, mixed_argon
from alchemi_lit.engine.hooks import Callback
from alchemi_lit.integrators import FIRE, Langevin
from alchemi_lit.models import LennardJones
from alchemi_lit.sinks import ZarrSink
from alchemi_lit.strategies.buffers import BufferConfig


class RankMarker(Callback):
    """Writes this rank's pid at run start; optionally slows every step down."""

    def __init__(self, out: Path, slow: float) -> None:
        super().__init__()
        self.out, self.slow = out, slow

    def on_run_start(self, ctx) -> None:
        import torch.distributed as dist

        rank = dist.get_rank() if dist.is_initialized() else 0
        tmp = self.out / f".pid_rank{rank}"
        tmp.write_text(str(os.getpid()))
        tmp.replace(self.out / f"pid_rank{rank}")

    def after_step(self, ctx) -> None:
        if self.slow:
            time.sleep(self.slow)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--systems", type=int, default=20)
    parser.add_argument("--slow", type=float, default=0.0)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--linger", type=float, default=0.0)
    args = parser.parse_args()
    torch.set_num_threads(1)

    # everything above launch() runs on every rank: no side effects here
    data = mixed_argon(args.systems, 8, 40, seed=5)
    sim = al.Simulator(
        model=LennardJones(epsilon=0.0104, sigma=3.40, cutoff=6.0),
        stages=FIRE(fmax=0.05, max_steps=30) | Langevin(dt=2.0, temperature=50.0, steps=10),
        strategy="pipeline",
        devices=2,
        buffer=BufferConfig(num_systems=8, num_atoms=200),
        sinks=[ZarrSink(args.out / "results.zarr")],
        callbacks=[RankMarker(args.out, args.slow)],
        sync_every=5,
        timeout=args.timeout,
    )
    results = sim.run(SizeAwareSampler(data, max_atoms=200))
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0:
        summary = {"systems": len(results), "stats": results.stats.get("systems")}
        (args.out / "done.json").write_text(json.dumps(summary))
    else:
        time.sleep(args.linger)


if __name__ == "__main__":
    main()
