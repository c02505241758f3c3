"""The cost of constraints as a share of a step (issue 43).

Run (from the repository root)::

    python bench/bench_constraints.py            # 64 argon crystals of 256 atoms, 200 steps
    python bench/bench_constraints.py --quick    # seconds: a check that it runs
    python bench/bench_constraints.py --device cuda

Workload: argon crystals (LJ, float64), velocity Verlet at 2 fs.  The same systems run
without constraints and with each kind on a quarter of their atoms (FixCartesian z,
FixedPlane, FixedLine, Hookean springs between neighbours, ExternalForce pulls,
FixBondLengths on neighbour pairs (SHAKE/RATTLE), FixCom on the whole system).
Reported: wall time per step (median of repeats after a warm-up run of each kind; the
kinds interleaved within each repeat, so a slow spell of a shared machine hits them
alike), its ratio to the unconstrained run and the extra time as a share of that step
(the issue's target: at most 5 %).  ``--device cuda`` runs the accelerator path (fixed
SHAKE/RATTLE sweeps, no host reads).  The table is kept as a record
(``bench/records.py``: ``bench/results/bench_constraints-<time>.json``, filed as
``bench/results/19-constraints-cost.json``); ``--quick`` writes none.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment_line, format_table


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


def time_per_step(systems: list, steps: int, device: str) -> float:
    """Wall seconds per step of one run of ``systems`` (set-up included, as a user
    pays it: encoding the constraints is part of a constrained run)."""
    model = LennardJones(epsilon=0.0104, sigma=3.40, cutoff=8.5)
    sim = al.Simulator(model=model, stages=VelocityVerlet(dt=2.0, steps=steps,
                       temperature=40.0), accelerator=device, seed=0)  # fmt: skip
    start = time.perf_counter()
    sim.run([a.copy() for a in systems])
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks it runs")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    n_sys, repeat, steps, repeats = (4, 2, 5, 2) if args.quick else (64, 4, 200, 5)
    if args.quick:  # (a check that it runs, not a figure: no record)
        os.environ["ALCHEMI_BENCH_RESULTS"] = "off"
    base = argon_crystals(n_systems=n_sys, repeat=repeat, seed=0)
    cases = {}
    for name, make in kinds(len(base[0])).items():
        cases[name] = [a.copy() for a in base]
        for a in cases[name]:
            a.set_constraint(make(a))
    for systems in cases.values():  # warm-up: imports, compiled kernels, allocator
        time_per_step(systems, steps, args.device)
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):  # interleaved: a slow spell of the machine hits every kind
        for name, systems in cases.items():
            times[name].append(time_per_step(systems, steps, args.device))
    ref = statistics.median(times["none"])
    rows = []
    for name in cases:
        t = statistics.median(times[name])
        extra = "" if name == "none" else f"{100 * (t - ref) / ref:.1f}"
        rows.append([name, f"{1e3 * t:.3f}", f"{t / ref:.3f}", extra])
    print(environment_line())
    print(f"{n_sys} systems x {len(base[0])} atoms, LJ rc 8.5 Å, float64, velocity Verlet "
          f"2 fs, {steps} steps, device {args.device}, median of {repeats} interleaved")
    print(format_table(
        ["constraint", "ms / step", "ratio to none", "extra (% of a bare step)"], rows,
        title=f"constraints' cost per MD step ({args.device})",
    ))  # fmt: skip


if __name__ == "__main__":
    main()
