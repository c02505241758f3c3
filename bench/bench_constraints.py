"""The cost of constraints as a share of a step (issue 43).

Run (from the repository root)::

    python bench/bench_constraints.py            # 64 argon crystals of 256 atoms, 200 steps
    python bench/bench_constraints.py --quick    # seconds: a check that it runs
    python bench/bench_constraints.py --device cuda

Workload: argon crystals (LJ, float64), velocity Verlet at 2 fs.  The same systems run
without constraints and with each kind on a quarter of their atoms (FixCartesian z,
FixedPlane, FixedLine, Hookean springs between neighbours, ExternalForce pulls,
FixBondLengths on neighbour pairs (SHAKE/RATTLE), FixCom on the whole system).
Each kind runs 20 and 200 steps (median of repeats after a warm-up run of each kind; the
kinds and lengths interleaved within each repeat, so a slow spell of a shared machine
hits them alike).  Reported: the wall time per step of the 200-step run and its extra
over the unconstrained run; the step itself, the slope between the two lengths, and its
extra; the time inside the constraints' step hooks (``integrators.constrain``, timed
around each call) and its share of the step -- the issue's target, at most 5 %; and the
extra set-up (encoding the constraints, the intercept), which a longer run amortizes.
The extra wall time also holds what the constraints do to the dynamics: springs and
pulls move atoms faster, so more neighbour lists are rebuilt (counted: "lists rebuilt",
systems over the 200-step run).  ``--device cuda``
runs the accelerator path (fixed SHAKE/RATTLE sweeps, no host reads).  The table is kept as a record
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
from common import environment_line, format_table, timed_into


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


#: seconds spent inside the constraints' step hooks (engine.step's calls of
#: integrators.constrain), over the current run
INSIDE = {"s": 0.0, "rebuilt": 0}


def time_the_constraints(device: str) -> None:
    """Wrap the constraint hooks the step calls so that their time adds to ``INSIDE``
    (on a GPU the device is synchronised around each call, so its kernels count)."""
    from alchemi_lit.engine import step
    from alchemi_lit.integrators import constrain

    for name in ("snapshot", "after_pre_update", "adjust_results", "after_post_update"):
        setattr(step.constrain, name, timed_into(getattr(constrain, name), INSIDE, device))
    from alchemi_lit.models.neighbors import NeighborList

    rebuild = NeighborList._rebuild

    def counted(self, batch, need):  # systems whose neighbour list is rebuilt
        INSIDE["rebuilt"] += int(need.sum())
        return rebuild(self, batch, need)

    NeighborList._rebuild = counted


def time_per_step(systems: list, steps: int, device: str) -> float:
    """Wall seconds per step of one run of ``systems`` (set-up included, as a user
    pays it: encoding the constraints is part of a constrained run)."""
    model = LennardJones(epsilon=0.0104, sigma=3.40, cutoff=8.5)
    sim = al.Simulator(model=model, stages=VelocityVerlet(dt=2.0, steps=steps,
                       temperature=40.0), accelerator=device, seed=0)  # fmt: skip
    INSIDE["s"], INSIDE["rebuilt"] = 0.0, 0
    start = time.perf_counter()
    sim.run([a.copy() for a in systems])
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks it runs")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    n_sys, repeat, short, steps, repeats = (4, 2, 2, 5, 2) if args.quick else (64, 4, 20, 200, 5)
    if args.quick:  # (a check that it runs, not a figure: no record)
        os.environ["ALCHEMI_BENCH_RESULTS"] = "off"
    base = argon_crystals(n_systems=n_sys, repeat=repeat, seed=0)
    cases = {}
    for name, make in kinds(len(base[0])).items():
        cases[name] = [a.copy() for a in base]
        for a in cases[name]:
            a.set_constraint(make(a))
    for systems in cases.values():  # warm-up: imports, compiled kernels, allocator
        time_per_step(systems, short, args.device)
    time_the_constraints(args.device)
    times: dict[tuple[str, int], list[float]] = {}
    inside: dict[str, list[float]] = {}
    rebuilt: dict[str, int] = {}
    for _ in range(repeats):  # interleaved: a slow spell of the machine hits every kind
        for name, systems in cases.items():
            for n in (short, steps):
                times.setdefault((name, n), []).append(time_per_step(systems, n, args.device) * n)
                if n == steps:
                    inside.setdefault(name, []).append(INSIDE["s"] / n)
                    rebuilt[name] = INSIDE["rebuilt"]
    # a run of n steps takes set-up + n x step: the slope between two lengths is the step
    fit = {}
    for name in cases:
        t_short, t_long = (statistics.median(times[(name, n)]) for n in (short, steps))
        step = (t_long - t_short) / (steps - short)
        fit[name] = (t_long / steps, step, t_short - short * step)
    ref_run, ref_step, ref_setup = fit["none"]
    rows = []
    for name, (run, step, setup) in fit.items():
        own = statistics.median(inside[name])
        rows.append([name, f"{1e3 * run:.3f}", f"{100 * (run - ref_run) / ref_run:.1f}",
                     f"{1e3 * step:.3f}", f"{100 * (step - ref_step) / ref_step:.1f}",
                     f"{1e3 * own:.3f}", f"{100 * own / run:.1f}",
                     f"{setup - ref_setup:+.3f}", str(rebuilt[name])])  # fmt: skip
    print(environment_line())
    print(f"{n_sys} systems x {len(base[0])} atoms, LJ rc 8.5 Å, float64, velocity Verlet "
          f"2 fs, runs of {short} and {steps} steps, device {args.device}, median of "
          f"{repeats} interleaved")  # fmt: skip
    print(format_table(
        ["constraint", f"ms / step ({steps}-step run)", "extra (%)", "ms / step (slope)",
         "extra per step (%)", "in the constraints (ms / step)", "their share (%)",
         "extra set-up (s)", "lists rebuilt"], rows,
        title=f"constraints' cost per MD step ({args.device})",
    ))  # fmt: skip

if __name__ == "__main__":
    main()
