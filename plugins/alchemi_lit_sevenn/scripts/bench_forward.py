"""Time SevenNet-0 forwards (energy + forces + stress): batched plugin vs sevenn's calculator.

Why: the plugin's point is one forward for many structures; this measures what that
buys over sevenn's ASE calculator, which evaluates structures one at a time.

    python plugins/alchemi_lit_sevenn/scripts/bench_forward.py --systems 1 16 --repeat 3
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import torch
from alchemi_lit_sevenn import SevenNet
from alchemi_lit_sevenn.model import _e3nn_import_guard
from ase.build import bulk

from alchemi_lit.core.state import Batch


def si64(seed: int):
    atoms = bulk("Si", "diamond", a=5.43, cubic=True).repeat(2)  # 64 atoms
    atoms.positions += np.random.default_rng(seed).normal(scale=0.05, size=(64, 3))
    return atoms


def best_of(fn, repeat: int) -> float:
    fn()  # warm-up (first call builds the neighbour list)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--systems", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--calculator", action="store_true", help="also time sevenn's ASE calc")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    t0 = time.perf_counter()
    model = SevenNet().to(args.device)
    print(f"model build: {time.perf_counter() - t0:.2f} s, threads={torch.get_num_threads()}")
    calc = None
    if args.calculator:
        with _e3nn_import_guard():
            from sevenn.calculator import SevenNetCalculator
        calc = SevenNetCalculator("7net-0", device=args.device)
    for n in args.systems:
        atoms = [si64(s) for s in range(n)]
        batch = Batch.from_atoms(atoms, dtype=torch.float32, device=args.device)

        def ours(batch: Batch = batch) -> None:
            model(batch)
            if batch.device.type == "cuda":
                torch.cuda.synchronize()

        t = best_of(ours, args.repeat)
        line = f"{n:3d} x 64 Si: plugin {t:.3f} s ({t / n * 1e3:.0f} ms/structure)"
        if calc is not None:

            def theirs(atoms: list = atoms) -> None:
                for a in atoms:
                    a.positions[0, 0] += 1e-6  # force a recalculation
                    a.calc = calc
                    a.get_stress()

            tc = best_of(theirs, args.repeat)
            line += f"; sevenn calculator loop {tc:.3f} s"
        print(line, flush=True)


if __name__ == "__main__":
    main()
