"""Two-rank runs of every sink kind from a launcher (tests/strategies/test_multinode.py).

    torchrun --nnodes=2 --nproc_per_node=1 --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT \
        tests/scripts/scale_script.py OUT_DIR
    SLURM_NTASKS=2 SLURM_PROCID=r ... python tests/scripts/scale_script.py OUT_DIR

Runs ``replicas`` (FIRE + Langevin fused, two replicas) and ``pipeline`` (FIRE | Langevin)
with each sink setup of ``test_results_every_sink.py`` (none, HostMemory, ZarrSink,
a bounded HostMemory before a ZarrSink).  Here rank 0 is this very process -- the case
where the returned Results once read a per-rank store that the merge had removed.  Rank
0 checks that each returned Results prints and tabulates, then saves what it holds as
``OUT_DIR/<strategy>-<sinks>.npz`` (and the store, if any, is ``<strategy>-<sinks>.zarr``);
every rank writes ``OUT_DIR/rank<r>.json`` with the ranks it was given.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np
import torch

import alchemi_lit as al
from alchemi_lit.data import SizeAwareSampler, mixed_argon
from alchemi_lit.integrators import FIRE, Langevin
from alchemi_lit.models import LennardJones
from alchemi_lit.sinks import HostMemory, ZarrSink
from alchemi_lit.strategies.buffers import BufferConfig

N = 16
KEPT = 3


def plan(strategy: str):
    relax = FIRE(fmax=0.05, max_steps=25)
    md = Langevin(dt=2.0, temperature=50.0, friction=0.02, steps=8)
    return relax | md if strategy == "pipeline" else relax + md


def sinks_of(kind: str, store: Path) -> list | None:
    return {
        "none": None,
        "memory": [HostMemory()],
        "zarr": [ZarrSink(store, mode="w")],
        "chain": [HostMemory(capacity=KEPT), ZarrSink(store, mode="w")],
    }[kind]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--strategies", default="replicas,pipeline")
    parser.add_argument("--sinks", default="none,memory,zarr,chain")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for strategy in args.strategies.split(","):
        for kind in args.sinks.split(","):
            name = f"{strategy}-{kind}"
            sim = al.Simulator(
                model=LennardJones(epsilon=0.0104, sigma=3.40, cutoff=6.0),
                stages=plan(strategy),
                strategy=strategy,
                devices=2,
                buffer=BufferConfig(num_systems=8, num_atoms=200),
                sinks=sinks_of(kind, args.out / f"{name}.zarr"),
                sync_every=4,
                timeout=60.0,
            )
            results = sim.run(SizeAwareSampler(mixed_argon(N, 8, 30, seed=4), max_atoms=200))
            if not sim.is_global_zero:
                continue
            text = repr(results)  # raised ConfigError naming '<store>.rank0.zarr' before
            table = results.to_pandas()
            b = results.batch
            np.savez(
                args.out / f"{name}.npz",
                system_id=b.system_id.numpy(),
                positions=b.positions.numpy(),
                velocities=b.velocities.numpy(),
                energy=b.energy.numpy(),
                total_steps=b.total_steps.numpy(),
                rows=len(table),
                systems=results.stats["systems"],
                sinks=np.array([str(getattr(s, "path", "memory")) for s in sim.sinks or []]),
                text=text,
            )
    rank = sim.global_rank
    seen = {
        "rank": rank,
        "world": int(torch.distributed.get_world_size())
        if torch.distributed.is_initialized()
        else None,
        "pid": os.getpid(),
    }
    (args.out / f"rank{rank}.json").write_text(json.dumps(seen))


if __name__ == "__main__":
    main()
