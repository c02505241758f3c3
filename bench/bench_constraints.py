"""The cost of constraints as a share of a step (issue 43).

Run (from the repository root)::

    python bench/bench_constraints.py            # 64 argon crystals of 256 atoms, 200 steps
    python bench/bench_constraints.py --quick    # seconds: a check that it runs
    python bench/bench_constraints.py --device cuda

Workload: argon crystals (LJ, float64), velocity Verlet at 2 fs.  The same systems run
without constraints and with each kind on a quarter of their atoms (FixCartesian z,
FixedPlane, FixedLine, Hookean springs between neighbours, ExternalForce pulls,
FixBondLengths on neighbour pairs (SHAKE/RATTLE), FixCom on the whole system).
Reported: wall time per step (median of repeats after a warm-up run) and the extra
time over the unconstrained run as a share of its step.  ``--device cuda`` runs the
accelerator path (fixed SHAKE/RATTLE sweeps, no host reads).
"""

from __future__ import annotations

import argparse
import statistics
import time

from ase.constraints import (
    ExternalForce,
    FixBondLengths,
    FixCartesian,
    FixCom,
    FixedLine,
    FixedPlane,
    Hookean,
)

import alchemi_lit as al
from alchemi_lit.data import argon_crystals
from alchemi_lit.integrators import VelocityVerlet
from alchemi_lit.models import LennardJones


def kinds(n: int) -> dict:
    """Constraint sets for a structure of ``n`` atoms (a quarter of them each)."""
    q = list(range(0, n, 4))
    pairs = [(i, i + 1) for i in q if i + 1 < n]
    return {
        "none": lambda a: [],
        "FixCartesian": lambda a: [FixCartesian(q, mask=(False, False, True))],
        "FixedPlane": lambda a: [FixedPlane(q, direction=(0, 0, 1))],
        "FixedLine": lambda a: [FixedLine(q, direction=(1, 0, 0))],
        "FixCom": lambda a: [FixCom()],
        "Hookean": lambda a: [Hookean(i, j, k=1.0, rt=3.0) for i, j in pairs],
        "ExternalForce": lambda a: [ExternalForce(i, j, 0.01) for i, j in pairs],
        "FixBondLengths": lambda a: [FixBondLengths(pairs)],
    }


def time_per_step(systems: list, steps: int, device: str, repeats: int) -> float:
    model = LennardJones(epsilon=0.0104, sigma=3.40, cutoff=8.5)
    times = []
    for r in range(repeats + 1):
        sim = al.Simulator(model=model, stages=VelocityVerlet(dt=2.0, steps=steps,
                           temperature=40.0), accelerator=device, seed=0)  # fmt: skip
        start = time.perf_counter()
        sim.run([a.copy() for a in systems])
        if r:  # the first run warms up
            times.append((time.perf_counter() - start) / steps)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks it runs")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    n_sys, repeat, steps, repeats = (4, 2, 5, 1) if args.quick else (64, 4, 200, 3)
    base = argon_crystals(n_systems=n_sys, repeat=repeat, seed=0)
    rows = []
    for name, make in kinds(len(base[0])).items():
        systems = []
        for a in base:
            a = a.copy()
            a.set_constraint(make(a))
            systems.append(a)
        rows.append((name, time_per_step(systems, steps, args.device, repeats)))
    ref = rows[0][1]
    print(f"{n_sys} systems x {len(base[0])} atoms, {steps} steps, device {args.device}")
    print(f"{'constraint':<16}{'ms/step':>10}{'extra share':>14}")
    for name, t in rows:
        print(f"{name:<16}{1e3 * t:>10.3f}{(t - ref) / ref:>13.1%}")


if __name__ == "__main__":
    main()
