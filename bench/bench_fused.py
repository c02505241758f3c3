"""Workloads (b) and (c): fused relax+MD vs stages in turn; inflight vs static batches.

Run (from the repository root; ~3 minutes on 2 CPU cores)::

    python bench/bench_fused.py            # both parts
    python bench/bench_fused.py --part b   # or c

**(b) fused vs sequential.**  256 mixed-size argon systems
(``alchemi_lit.data.mixed_argon(256, 8, 100)``: perturbed fcc supercells, trimmed to
8-100 atoms as free clusters or kept periodic), LJ (ε 0.0104 eV, σ 3.40 Å,
rc 8.5 Å), float64.  Plan: ``FIRE(fmax=0.05, max_steps=300)`` then ``Langevin(dt=2 fs,
60 K, friction 0.01/fs, 50 steps)``, inflight batching with
``SizeAwareSampler(max_atoms=2000)``.  *Fused*: one ``Simulator`` with
``stages=relax + md``.  *Sequential*: a ``Simulator`` with ``relax`` over all
systems, then one with ``md`` over the relaxed structures -- the same total work
(every system: its FIRE steps, then 50 MD steps).  The fused plan keeps the batch
full while the last, slow relaxations finish (their empty slots take MD work);
the sequential one drains the batch at the end of each stage.

**(c) inflight vs static batches.**  96 argon crystals of 108 atoms whose noise
cycles through 0.02, 0.1, 0.3, 0.5, 0.7 Å, so relaxations take from ~15 to ~200
FIRE steps (fmax 0.01 eV/Å, at most 500 steps).  Batch budget 1728 atoms
(16 systems).  *Inflight*: one run with ``SizeAwareSampler(max_atoms=1728)``
refilling freed slots as systems converge.  *Static*: fixed chunks of 16 consecutive
systems, each run to completion before the next starts (a sampler per chunk, so
occupancy is recorded against the same budget).  Converged systems graduate in both
(alchemi_lit compacts the batch), so a static chunk's tail runs with a shrinking
batch rather than padding.

Reported: wall time (median of repeats after a warm-up run on a smaller set), model
forward calls (= batch steps; on a GPU, where a step below saturation costs about the
same whatever the batch holds, this is what the wall time follows; on this CPU a step
costs in proportion to the atoms in it), atom-steps/s (Σ_systems atoms x steps taken,
all stages) and systems/s, the mean
atom-slot occupancy over bookkeepings (``results.stats["atom_occupancy"]``: atoms in
flight / budget; for several runs, weighted by their wall time) and ratios.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from common import (
    ARGON_LJ,
    environment_line,
    format_table,
    gate_arguments,
    gate_from,
    median,
    mixed_noise_argon,
    setup_threads,
)

import alchemi_lit as al
from alchemi_lit.data import SizeAwareSampler, mixed_argon
from alchemi_lit.integrators import FIRE, Langevin
from alchemi_lit.models import LennardJones


def model() -> LennardJones:
    return LennardJones(**ARGON_LJ, skin=1.0, compute_stress=False)


def sim(stages, **kw) -> al.Simulator:
    return al.Simulator(
        model=model(), stages=stages, accelerator="cpu", precision="64", seed=0, **kw
    )


class Outcome:
    def __init__(
        self,
        wall: float,
        atom_steps: float,
        systems: int,
        occupancy: float | None,
        converged: int,
        extra: str = "",
        forwards: int = 0,
    ) -> None:
        self.wall, self.atom_steps, self.systems, self.forwards = (
            wall,
            atom_steps,
            systems,
            forwards,
        )
        self.occupancy, self.converged, self.extra = occupancy, converged, extra


def atom_steps(res) -> float:
    b = res.batch
    return float((b.total_steps.to(torch.float64) * b.n_atoms.to(torch.float64)).sum())


def weighted_occupancy(parts: list[tuple[float, float | None]]) -> float | None:
    parts = [(w, o) for w, o in parts if o is not None]
    total = sum(w for w, _ in parts)
    return sum(w * o for w, o in parts) / total if total else None


def timed(fn, repeats: int, gate, label: str) -> tuple[float, Outcome]:
    gate.wait(label)
    walls, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        walls.append(time.perf_counter() - t0)
    return median(walls), out


# --------------------------------------------------------------------------- (b)
def part_b(args, gate) -> tuple[str, list[str]]:
    systems = mixed_argon(n_systems=args.b_systems, min_atoms=8, max_atoms=100, seed=0)
    relax = FIRE(fmax=0.05, max_steps=300)
    md = Langevin(dt=2.0, temperature=60.0, friction=0.01, steps=args.md_steps)
    budget = args.b_budget

    def fused(data):
        res = sim(relax + md).run(SizeAwareSampler(data, max_atoms=budget))
        return Outcome(
            0,
            atom_steps(res),
            res.stats["systems"],
            res.stats["atom_occupancy"],
            int(res.converged.sum()),
            forwards=res.stats["forward_calls"],
        )

    def sequential(data):
        t0 = time.perf_counter()
        r1 = sim(relax).run(SizeAwareSampler(data, max_atoms=budget))
        t1 = time.perf_counter()
        relaxed = r1.to_atoms()  # system_id order = input order
        r2 = sim(md).run(SizeAwareSampler(relaxed, max_atoms=budget))
        t2 = time.perf_counter()
        occ = weighted_occupancy(
            [(t1 - t0, r1.stats["atom_occupancy"]), (t2 - t1, r2.stats["atom_occupancy"])]
        )
        return Outcome(
            0,
            atom_steps(r1) + atom_steps(r2),
            r2.stats["systems"],
            occ,
            int(r1.converged.sum()),
            f"relax {t1 - t0:.1f} s + MD {t2 - t1:.1f} s",
            r1.stats["forward_calls"] + r2.stats["forward_calls"],
        )

    warm = systems[: max(8, len(systems) // 16)]
    fused(warm)
    sequential(warm)
    rows = []
    for name, fn in (("fused relax + md", fused), ("sequential relax; md", sequential)):
        wall, out = timed(lambda fn=fn: fn(systems), args.repeats, gate, f"(b) {name}")
        out.wall = wall
        rows.append((name, out))
    n_atoms = sum(len(a) for a in systems)
    head = (
        f"# (b) {len(systems)} mixed argon systems ({n_atoms} atoms, 8-100 per system), "
        f"FIRE(fmax 0.05, <=300) + Langevin({args.md_steps} steps), budget {budget} atoms, "
        f"{args.repeats} repeats"
    )
    return head + "\n" + table(rows, rows[0][1]), [
        f"(b) {n}: {o.converged}/{o.systems} relaxed to fmax" + (f"; {o.extra}" if o.extra else "")
        for n, o in rows
    ]


# --------------------------------------------------------------------------- (c)
def part_c(args, gate) -> tuple[str, list[str]]:
    systems = mixed_noise_argon(n_systems=args.c_systems, repeat=3)
    per_chunk = args.c_chunk
    budget = per_chunk * len(systems[0])
    relax = FIRE(fmax=0.01, max_steps=500)

    def inflight(data):
        res = sim(relax).run(SizeAwareSampler(data, max_atoms=budget))
        steps = res.steps
        return Outcome(
            0,
            atom_steps(res),
            res.stats["systems"],
            res.stats["atom_occupancy"],
            int(res.converged.sum()),
            f"FIRE steps {int(steps.min())}-{int(steps.max())}",
            res.stats["forward_calls"],
        )

    def static(data):
        parts, total, n, conv, fwd = [], 0.0, 0, 0, 0
        for lo in range(0, len(data), per_chunk):
            t0 = time.perf_counter()
            res = sim(relax).run(SizeAwareSampler(data[lo : lo + per_chunk], max_atoms=budget))
            parts.append((time.perf_counter() - t0, res.stats["atom_occupancy"]))
            total += atom_steps(res)
            n += res.stats["systems"]
            conv += int(res.converged.sum())
            fwd += res.stats["forward_calls"]
        return Outcome(
            0, total, n, weighted_occupancy(parts), conv, f"{len(parts)} chunks of {per_chunk}", fwd
        )

    warm = systems[:per_chunk]
    inflight(warm)
    static(warm)
    rows = []
    for name, fn in (("inflight (SizeAwareSampler)", inflight), ("static chunks", static)):
        wall, out = timed(lambda fn=fn: fn(systems), args.repeats, gate, f"(c) {name}")
        out.wall = wall
        rows.append((name, out))
    head = (
        f"# (c) {len(systems)} argon crystals x 108 atoms, noise cycling 0.02-0.7 Å, "
        "FIRE(fmax 0.01, "
        f"<=500), budget {budget} atoms ({per_chunk} systems), {args.repeats} repeats"
    )
    return head + "\n" + table(rows, rows[0][1]), [
        f"(c) {n}: {o.converged}/{o.systems} converged; {o.extra}" for n, o in rows
    ]


def table(rows, ref: Outcome) -> str:
    out = []
    for name, o in rows:
        out.append(
            (
                name,
                f"{o.wall:.2f}",
                o.forwards,
                f"{o.atom_steps / o.wall:,.0f}",
                f"{o.systems / o.wall:.2f}",
                "n/a" if o.occupancy is None else f"{o.occupancy:.3f}",
                f"{(o.atom_steps / o.wall) / (ref.atom_steps / ref.wall):.2f}x",
                f"{(o.systems / o.wall) / (ref.systems / ref.wall):.2f}x",
            )
        )
    return format_table(
        [
            "mode",
            "wall s",
            "forward calls",
            "atom-steps/s",
            "systems/s",
            "atom occupancy",
            "atom-steps/s ratio",
            "systems/s ratio",
        ],
        out,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=["b", "c", "both"], default="both")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--b-systems", type=int, default=256)
    p.add_argument("--b-budget", type=int, default=2000, help="(b) atoms in flight")
    p.add_argument("--md-steps", type=int, default=50, help="(b) MD steps per system")
    p.add_argument("--c-systems", type=int, default=96)
    p.add_argument("--c-chunk", type=int, default=16, help="(c) systems per batch")
    gate_arguments(p)
    args = p.parse_args(argv)
    setup_threads(args.threads)
    gate = gate_from(args)
    print(f"# fused / inflight batching | {environment_line()}", flush=True)
    notes = []
    if args.part in ("b", "both"):
        text, n = part_b(args, gate)
        print("\n" + text, flush=True)
        notes += n
    if args.part in ("c", "both"):
        text, n = part_c(args, gate)
        print("\n" + text, flush=True)
        notes += n
    print()
    for note in notes:
        print(f"* {note}")
    print(f"* {gate.status_line()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
