"""Replicas on two processes against one (issue 46: ">= 1.8x one").

    python bench/bench_replicas.py                 # 768 Cu cells, FIRE then Langevin, EMT
    python bench/bench_replicas.py --quick         # 64 cells (a smoke run)

One fused plan (FIRE to 0.05 eV/Å, at most 200 steps, then 200 Langevin steps at
300 K), EMT, float64, over rattled Cu cells of 16 to 48 atoms, run three ways, interleaved,
``--repeats`` times: one process with one torch thread (each replica's setting: the ratio
of the two is the replicas' scaling), one process with every core's thread (what a user
gets without replicas), and ``strategy="replicas", devices=2`` (two forked ranks of one
thread each, each on half of the structures by atom count, the results gathered on rank
0; forked, so that rank 1 does not run this script again as the default launcher's
re-executed rank would).  Wall time from ``Simulator(...)`` to the returned results,
start-up of the ranks included; atom-steps per second; the final energies of the three
runs compared (the same plan on the same structures: equal bit for bit, since no
reduction spans systems).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import format_table


def structures(n: int) -> list:
    """``n`` rattled fcc Cu cells of 16, 32 or 48 atoms (seeded)."""
    from ase.build import bulk

    rng = np.random.default_rng(0)
    shapes = [(1, 1, 4), (2, 2, 2), (2, 2, 3)]
    out = []
    for k in range(n):
        atoms = bulk("Cu", "fcc", a=3.61 * (1 + 0.01 * rng.uniform(-1, 1)), cubic=False)
        atoms = atoms.repeat(shapes[k % 3]) * (2, 1, 1)
        atoms.positions += rng.normal(scale=0.05, size=atoms.positions.shape)
        out.append(atoms)
    return out


def run(cells: list, how: str, steps: int) -> tuple[float, np.ndarray, int]:
    """Wall seconds, final energies by system_id and atom-steps of one way of running."""
    import torch

    from alchemi_lit import Simulator
    from alchemi_lit.data import SizeAwareSampler
    from alchemi_lit.integrators import FIRE, Langevin
    from alchemi_lit.models import EMT

    torch.set_num_threads(os.cpu_count() if how == "one process, all threads" else 1)
    options = {"strategy": "replicas", "devices": 2, "start_method": "fork"}
    options = options if how == "replicas x 2" else {}
    start = time.perf_counter()
    sim = Simulator(
        model=EMT(), precision="64", seed=0,
        stages=[FIRE(fmax=0.05, max_steps=steps), Langevin(dt=2.0, temperature=300.0, steps=steps)],
        **options,
    )  # fmt: skip
    results = sim.run(SizeAwareSampler(cells, max_atoms=2048))
    wall = time.perf_counter() - start
    table = results.to_pandas().sort_values("system_id")
    atom_steps = int((table["n_atoms"] * table["steps"]).sum())
    return wall, table["energy"].to_numpy(), atom_steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=768, help="structures")
    parser.add_argument("--steps", type=int, default=200, help="FIRE and Langevin steps")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="64 structures, 50 steps, once")
    args = parser.parse_args()
    if args.quick:
        args.n, args.steps, args.repeats = 64, 50, 1
    cells = structures(args.n)
    ways = ("one process, 1 thread", "one process, all threads", "replicas x 2")
    walls: dict[str, list[float]] = {w: [] for w in ways}
    energies, work = {}, {}
    for _ in range(args.repeats):
        for way in ways:  # interleaved: a slow spell of the machine hits every way
            wall, energies[way], work[way] = run(cells, way, args.steps)
            walls[way].append(wall)
            print(f"{way}: {wall:.2f} s", flush=True)
    base = statistics.median(walls[ways[0]])
    rows = []
    for way in ways:
        med = statistics.median(walls[way])
        diff = np.abs(energies[way] - energies[ways[0]]).max()
        rows.append([way, f"{med:.2f}", f"{work[way] / med:.3g}", f"{base / med:.2f}x",
                     f"{diff:.1e}"])  # fmt: skip
    title = (f"{args.n} Cu cells (16-48 atoms), FIRE <= {args.steps} + Langevin {args.steps}, "
             f"EMT float64, median of {args.repeats}")  # fmt: skip
    print(format_table(["run", "wall s", "atom-steps/s", "vs one process, 1 thread",
                        "max |dE| vs it (eV)"], rows, title=title))  # fmt: skip


if __name__ == "__main__":
    main()
