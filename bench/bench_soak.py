"""Soak test: 20 000 small systems streamed through a fused relax + MD plan.

Run (from the repository root; several minutes on 2 CPU cores at the default size)::

    python bench/bench_soak.py                  # 20 000 systems
    python bench/bench_soak.py --systems 2000   # shorter

Workload: ``alchemi_lit.data.mixed_argon`` systems of 8-32 atoms (free clusters and
small periodic crystals, noise 0.1 Å, seed 0), LJ (ε 0.0104 eV, σ 3.40 Å,
rc 8.5 Å), float64, 2 torch threads.  Plan ``FIRE(fmax=0.05, max_steps=200) +
Langevin(dt=2 fs, 60 K, friction 0.01/fs, steps=20)``, inflight batching with
``SizeAwareSampler(max_atoms=3000)``, results streamed to a ``ZarrSink`` in a
temporary folder (so memory measures the framework, not accumulated results).

A callback (host values only: no tensor reads) samples the resident set size
(psutil, else ``/proc/self/status``) and progress every ``--every`` bookkeepings;
the table shows RSS and throughput over time.  At the end every system must be
accounted for: ``results.stats["systems"]`` equals the number of systems and the
store holds each ``system_id`` exactly once.  RSS growth between 25 % of the run and
the end is reported (a leak would grow with the number of systems streamed).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from common import (
    ARGON_LJ,
    environment_line,
    format_table,
    gate_arguments,
    gate_from,
    peak_rss_mb,
    rss_mb,
    setup_threads,
    small_argon,
)

import alchemi_lit as al
from alchemi_lit.callbacks import Callback
from alchemi_lit.data import SizeAwareSampler
from alchemi_lit.integrators import FIRE, Langevin
from alchemi_lit.models import LennardJones
from alchemi_lit.sinks import ZarrSink


class MemoryProbe(Callback):
    """Record (elapsed s, step, systems graduated, RSS MiB) every ``every`` steps."""

    def __init__(self, every: int) -> None:
        super().__init__(every=every)
        self.samples: list[tuple[float, int, int, float]] = []
        self.t0 = time.perf_counter()

    def on_run_start(self, ctx) -> None:
        self.t0 = time.perf_counter()

    def after_step(self, ctx) -> None:
        self.samples.append(
            (
                time.perf_counter() - self.t0,
                ctx.step,
                int(ctx.state.get("graduated_systems", 0)),
                rss_mb(),
            )
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--systems", type=int, default=20_000)
    p.add_argument("--max-atoms", type=int, default=3000, help="atoms in flight")
    p.add_argument("--md-steps", type=int, default=20)
    p.add_argument("--sync-every", type=int, default=10)
    p.add_argument("--every", type=int, default=50, help="bookkeepings between RSS samples")
    p.add_argument("--rows", type=int, default=16, help="rows of the over-time table")
    p.add_argument("--threads", type=int, default=2)
    gate_arguments(p)
    args = p.parse_args(argv)
    setup_threads(args.threads)
    gate = gate_from(args)

    systems = small_argon(args.systems)
    n_atoms = sum(len(a) for a in systems)
    print(
        f"# soak: {args.systems} argon systems of 8-32 atoms ({n_atoms} atoms; "
        f"{sum(bool(a.pbc.any()) for a in systems)} periodic), FIRE(fmax 0.05, <=200) + "
        f"Langevin({args.md_steps} steps), budget {args.max_atoms} atoms, ZarrSink"
    )
    print(f"# {environment_line()}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="alchemi_soak_"))
    store = tmp / "soak.zarr"
    probe = MemoryProbe(every=args.every * args.sync_every)
    model = LennardJones(**ARGON_LJ, skin=1.0, compute_stress=False)
    stages = FIRE(fmax=0.05, max_steps=200) + Langevin(
        dt=2.0, temperature=60.0, friction=0.01, steps=args.md_steps
    )
    # warm-up on a few systems (first calls, zarr import)
    al.Simulator(
        model=model,
        stages=stages,
        accelerator="cpu",
        seed=0,
        sinks=[ZarrSink(tmp / "warm.zarr", mode="w")],
    ).run(SizeAwareSampler(systems[:50], max_atoms=args.max_atoms))
    rss_before = rss_mb()
    sim = al.Simulator(
        model=model,
        stages=stages,
        accelerator="cpu",
        seed=0,
        sync_every=args.sync_every,
        callbacks=[probe],
        sinks=[ZarrSink(store, mode="w")],
    )
    load = gate.wait("soak")
    t0 = time.perf_counter()
    try:
        res = sim.run(SizeAwareSampler(systems, max_atoms=args.max_atoms))
        wall = time.perf_counter() - t0
        import zarr

        root = zarr.open_group(str(store), mode="r")
        n_store = int(root.attrs["n_systems"])
        ids = np.asarray(root["systems/system_id"][:n_store])
        steps = np.asarray(root["systems/total_steps"][:n_store])
        sizes = np.asarray(root["systems/n_atoms"][:n_store])
        conv = np.asarray(root["systems/converged"][:n_store])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    samples = [*probe.samples, (wall, res.stats["steps"], res.stats["systems"], rss_mb())]
    pick = np.unique(
        np.linspace(0, len(samples) - 1, min(args.rows, len(samples))).round().astype(int)
    )
    rows, prev = [], None
    for k in pick:
        t, step, done, rss = samples[k]
        rate = "" if prev is None or t <= prev[0] else f"{(done - prev[2]) / (t - prev[0]):.1f}"
        rows.append(
            (f"{t:.1f}", step, done, f"{100 * done / args.systems:.1f}%", rate, f"{rss:.1f}")
        )
        prev = (t, step, done)
    print()
    print(
        format_table(
            ["elapsed s", "step", "systems done", "progress", "systems/s (interval)", "RSS MiB"],
            rows,
        )
    )

    quarter = next((s for s in samples if s[2] >= args.systems // 4), samples[0])
    rss_end = samples[-1][3]
    ok_count = res.stats["systems"] == args.systems and n_store == args.systems
    ok_ids = len(np.unique(ids)) == args.systems and set(ids.tolist()) == set(range(args.systems))
    atom_steps = float((steps * sizes).sum())
    print()
    print(
        format_table(
            ["quantity", "value"],
            [
                (
                    "systems in / results.stats['systems'] / rows in ZarrSink",
                    f"{args.systems} / {res.stats['systems']} / {n_store}",
                ),
                ("every system_id exactly once", "yes" if ok_ids else "NO"),
                ("relaxed to fmax", f"{int(conv.sum())} / {n_store}"),
                ("wall s", f"{wall:.1f}"),
                ("systems/s", f"{args.systems / wall:.1f}"),
                ("atom-steps/s", f"{atom_steps / wall:,.0f}"),
                ("steps / forward calls", f"{res.stats['steps']} / {res.stats['forward_calls']}"),
                ("mean atom occupancy", f"{res.stats['atom_occupancy']:.3f}"),
                ("RSS before run (after warm-up) MiB", f"{rss_before:.1f}"),
                ("RSS at 25 % of systems MiB", f"{quarter[3]:.1f}"),
                ("RSS at end MiB", f"{rss_end:.1f}"),
                ("RSS growth 25 % -> end MiB", f"{rss_end - quarter[3]:+.1f}"),
                ("peak RSS (VmHWM) MiB", f"{peak_rss_mb():.1f}"),
            ],
        )
    )
    print()
    print(f"* 1-min load average at start {load:.2f}; {gate.status_line()}")
    if not (ok_count and ok_ids):
        print("FAILED: not every system accounted for")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
