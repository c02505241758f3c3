"""A 2-rank relax | MD pipeline against the same plan fused in one process.

Run (from the repository root; ~2-3 minutes on 2 CPU cores)::

    python bench/bench_pipeline.py

Workload: 96 fcc argon crystals of 108 atoms (noise 0.1 Å, seed 0), LJ (ε 0.0104 eV,
σ 3.40 Å, rc 8.5 Å), float64.  Plan: ``FIRE(fmax=0.01, max_steps=500)`` then
``Langevin(dt=2 fs, 60 K, friction 0.01/fs, steps=--md-steps)``; every system gets its
FIRE steps then the MD steps in every mode, so the total work is the same.

* **pipeline, 2 ranks**: ``stages=relax | md``, ``strategy="pipeline"``, ``devices=2``,
  gloo, ``comm_mode="async_recv"`` (``--comm-mode`` to compare the others),
  ``start_method="fork"`` (each rank one torch thread, as forked ranks must),
  ``BufferConfig(num_systems=16, num_atoms=1728)``, each rank's batch budget
  ``SizeAwareSampler(max_atoms=1728)``.  Rank 0 relaxes and streams relaxed systems to
  rank 1, which runs MD.
* **fused, 1 process, 2 threads**: ``stages=relax + md`` with the same sampler budget
  -- the same two cores used by one process.
* **fused, 1 process, 1 thread**: the per-core reference (the pipeline uses 2 cores).

Reported: wall time (median of repeats; the pipeline's includes starting the ranks,
~0.1 s with fork), atom-steps/s (Σ_systems atoms x steps, both stages) and ratios;
for the pipeline, per rank (``results.stats["ranks"]``): steps, systems in/out,
idle fraction (time waiting on a neighbour / wall) and mean time per exchange.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from common import (
    ARGON_LJ,
    argon_set,
    environment_line,
    format_table,
    gate_arguments,
    gate_from,
    median,
    setup_threads,
)

import alchemi_lit as al
from alchemi_lit.data import SizeAwareSampler
from alchemi_lit.integrators import FIRE, Langevin
from alchemi_lit.models import LennardJones
from alchemi_lit.strategies.buffers import BufferConfig


def model() -> LennardJones:
    return LennardJones(**ARGON_LJ, skin=1.0, compute_stress=False)


def atom_steps(res) -> float:
    b = res.batch
    return float((b.total_steps.to(torch.float64) * b.n_atoms.to(torch.float64)).sum())


def _net_ms(r: dict) -> float:
    """Mean exchange time without the time spent waiting on the neighbour."""
    if not r["rounds"]:
        return 0.0
    wait_ms = r["idle_fraction"] * r["wall_s"] * 1e3
    return max(0.0, r["mean_exchange_ms"] - wait_ms / r["rounds"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--systems", type=int, default=96)
    p.add_argument("--md-steps", type=int, default=40)
    p.add_argument("--fmax", type=float, default=0.01)
    p.add_argument("--batch-systems", type=int, default=16, help="systems per rank's batch")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument(
        "--comm-mode", default="async_recv", choices=["sync", "async_recv", "fully_async"]
    )
    gate_arguments(p)
    args = p.parse_args(argv)
    setup_threads(2)
    gate = gate_from(args)
    systems = argon_set(args.systems)
    n_atoms = sum(len(a) for a in systems)
    budget = args.batch_systems * len(systems[0])
    relax = FIRE(fmax=args.fmax, max_steps=500)
    md = Langevin(dt=2.0, temperature=60.0, friction=0.01, steps=args.md_steps)
    print(
        f"# relax|md pipeline vs fused: {args.systems} argon crystals x {len(systems[0])} atoms "
        f"({n_atoms} atoms), FIRE(fmax {args.fmax}) then Langevin({args.md_steps} steps), "
        f"batch budget {budget} atoms/rank"
    )
    print(f"# {environment_line()}", flush=True)

    def fused(threads: int):
        def run(data):
            torch.set_num_threads(threads)
            try:
                s = al.Simulator(model=model(), stages=relax + md, accelerator="cpu", seed=0)
                return s.run(SizeAwareSampler(data, max_atoms=budget))
            finally:
                torch.set_num_threads(2)

        return run

    def pipeline(data):
        s = al.Simulator(
            model=model(),
            stages=relax | md,
            strategy="pipeline",
            devices=2,
            accelerator="cpu",
            start_method="fork",
            seed=0,
            comm_mode=args.comm_mode,
            buffer=BufferConfig(num_systems=args.batch_systems, num_atoms=budget),
        )
        return s.run(SizeAwareSampler(data, max_atoms=budget))

    modes = [
        ("pipeline relax|md, 2 ranks x 1 thread", pipeline),
        ("fused relax+md, 1 process x 2 threads", fused(2)),
        ("fused relax+md, 1 process x 1 thread", fused(1)),
    ]
    # warm-up on a few systems (imports, first fork, Fabric)
    for _, fn in modes:
        fn(systems[: args.batch_systems])
    results = {}
    for name, fn in modes:
        gate.wait(name)
        walls, res = [], None
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            res = fn(systems)
            walls.append(time.perf_counter() - t0)
        n_out = res.stats["systems"] if "systems" in res.stats else len(res)
        assert n_out == args.systems and len(res) == args.systems, f"{name}: {n_out} systems out"
        results[name] = (median(walls), atom_steps(res), res)

    ref_name = modes[1][0]
    ref = results[ref_name][1] / results[ref_name][0]
    rows = []
    for name, (wall, work, _res) in results.items():
        rate = work / wall
        rows.append(
            (
                name,
                f"{wall:.2f}",
                f"{rate:,.0f}",
                f"{args.systems / wall:.2f}",
                f"{rate / ref:.2f}x",
            )
        )
    print()
    print(format_table(["mode", "wall s", "atom-steps/s", "systems/s", "vs fused 2 threads"], rows))
    ranks = results[modes[0][0]][2].stats["ranks"]
    print()
    print("pipeline ranks (last repeat):")
    print(
        format_table(
            [
                "rank",
                "stage",
                "steps",
                "systems in",
                "systems out",
                "wall s",
                "idle fraction",
                "exchanges",
                "ms/exchange",
                "ms/exchange excl. waiting",
                "peak atoms",
            ],
            [
                (
                    r["rank"],
                    ("relax (FIRE)", "md (Langevin)")[r["rank"]],
                    r["steps"],
                    r["systems_in"],
                    r["systems_out"],
                    f"{r['wall_s']:.2f}",
                    f"{r['idle_fraction']:.3f}",
                    r["rounds"],
                    f"{r['mean_exchange_ms']:.2f}",
                    f"{_net_ms(r):.2f}",
                    r["peak_atoms"],
                )
                for r in ranks
            ],
        )
    )
    print(
        "  (ms/exchange: mean wall time of an exchange round, waiting for the neighbour "
        "included; excl. waiting: minus the rank's total wait time spread over its rounds)"
    )
    print()
    print(
        f"* work per mode: {results[ref_name][1]:,.0f} atom-steps (identical plans; every system "
        f"relaxed then {args.md_steps} MD steps)"
    )
    print(f"* {gate.status_line()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
