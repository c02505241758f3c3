"""What the MD observables cost as a share of an MD step (issue #44, target <= 5 %).

Run (from the repository root; on a GPU add ``--device cuda``)::

    python bench/bench_observables.py [--device cuda] [--systems 64] [--steps 400]
    python bench/bench_observables.py --quick     # a CPU smoke run of a few seconds

Workload: ``--systems`` argon crystals of 108 atoms (fcc, a = 5.3 Å, rattled), LJ
rc 8.5 Å, float64, Langevin NVT at 80 K for ``--steps`` steps.  Each observable runs at
the cadence a study uses -- RDF (rmax 7.5 Å, 100 bins) and MSD (window 100) every 10
steps, VACF (window 200) and BlockAverages (energy, temperature, volume) every step --
then all four together.  One process, runs interleaved ``--repeats`` times; the table
gives the median wall time per step without observables, with each, and the extra time
as a share of the bare step -- of the medians, and paired: the median over repeats of
each run against the bare run of the same repeat (a slow spell of a shared machine then
weighs on both sides of a ratio) -- and the time inside the observables' hooks (their
samples and their results, timed around each call) per step and as a share of the bare
step of the same repeat, the cost itself, as bench_constraints reports its constraints'.
``--device cuda`` times with ``torch.cuda.synchronize``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment_line, format_table, timed_into


def observables(name: str) -> list:
    from alchemi_lit.callbacks import MSD, RDF, VACF, BlockAverages

    make = {
        "RDF every 10": lambda: [RDF(rmax=7.5, nbins=100, every=10)],
        "MSD every 10": lambda: [MSD(window=100, every=10)],
        "VACF every 1": lambda: [VACF(window=200, every=1)],
        "BlockAverages every 1": lambda: [
            BlockAverages(("energy", "temperature", "volume"), every=1)
        ],
    }
    if name == "all four":
        return [cb for f in make.values() for cb in f()]
    return make[name]() if name in make else []


CASES = ("none", "RDF every 10", "MSD every 10", "VACF every 1", "BlockAverages every 1",
         "all four")  # fmt: skip


def timed_hooks(callbacks: list, device: str) -> dict[str, float]:
    """Wrap each observable's hooks (its samples, and its results when systems finish) so
    that their wall time adds to the returned ``{"s": seconds}``."""
    inside = {"s": 0.0}
    for cb in callbacks:
        for hook in ("on_run_start", "before_step", "on_converge"):
            setattr(cb, hook, timed_into(getattr(cb, hook), inside, device))
    return inside


def time_case(name: str, systems: list, steps: int, device: str) -> tuple[float, float]:
    """Seconds per step of one Langevin run with the observables of ``name``, and of
    those the seconds per step inside the observables' hooks."""
    import torch

    import alchemi_lit as al
    from alchemi_lit.integrators import Langevin
    from alchemi_lit.models import LennardJones

    model = LennardJones(epsilon=0.0104, sigma=3.40, cutoff=8.5, skin=1.0)
    callbacks = observables(name)
    inside = timed_hooks(callbacks, device)
    sim = al.Simulator(model=model, stages=Langevin(dt=2.0, temperature=80.0, steps=steps),
                       callbacks=callbacks, accelerator=device, precision="64",
                       sync_every=50)  # fmt: skip
    if device == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    sim.run([a.copy() for a in systems])
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / steps, inside["s"] / steps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--systems", type=int, default=64)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="a few seconds on CPU")
    args = p.parse_args(argv)
    if args.quick:
        args.systems, args.steps, args.repeats = 2, 20, 1
    from ase.build import bulk

    systems = []
    for k in range(args.systems):
        atoms = bulk("Ar", "fcc", a=5.3, cubic=True).repeat(3)
        atoms.rattle(0.05, seed=k)
        systems.append(atoms)
    time_case("none", systems[:1], 5, args.device)  # warm-up (imports, kernels)
    times: dict[str, list[float]] = {c: [] for c in CASES}
    inside: dict[str, list[float]] = {c: [] for c in CASES}
    for _ in range(args.repeats):
        for case in CASES:
            wall, hooks = time_case(case, systems, args.steps, args.device)
            times[case].append(wall)
            inside[case].append(hooks)
    bare = statistics.median(times["none"])
    rows = []
    for case in CASES:
        t = statistics.median(times[case])
        share = paired = hooks = hook_share = ""
        if case != "none":
            share = f"{100 * (t - bare) / bare:.1f}"
            ratios = [c / n - 1.0 for c, n in zip(times[case], times["none"])]
            paired = f"{100 * statistics.median(ratios):.1f}"
            hooks = f"{1e3 * statistics.median(inside[case]):.3f}"
            # the hooks' time against the bare step of the same repeat
            shares = [h / n for h, n in zip(inside[case], times["none"])]
            hook_share = f"{100 * statistics.median(shares):.1f}"
        spread = f"{1e3 * min(times[case]):.3f}-{1e3 * max(times[case]):.3f}"
        rows.append([case, f"{1e3 * t:.3f}", spread, share, paired, hooks, hook_share])
    print(environment_line())
    print(f"{args.systems} x 108-atom argon, LJ rc 8.5 Å, Langevin, {args.steps} steps, "
          f"device {args.device}, median of {args.repeats}")  # fmt: skip
    headers = ["observables", "ms / step", "range", "extra (% of a bare step)",
               "paired extra (%)", "inside (ms / step)", "inside (% of a bare step)"]  # fmt: skip
    print(format_table(headers, rows,
                       title=f"observables' cost per MD step ({args.device})"))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
