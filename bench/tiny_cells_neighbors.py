"""Neighbour lists of many tiny periodic cells on the CPU: the per-system path (vesin's
pairs by an all-pairs test per cell) against the batched builder (models.cell_list),
64 copies of each cell, EMT's cutoff, min of 5.  Sets where pair_search routes tiny
cells (BENCHMARKS.md, "Neighbour lists of many tiny cells").

    python bench/tiny_cells_neighbors.py
"""

from __future__ import annotations

import time

import numpy as np
import torch
from ase.build import bulk

from alchemi_lit.core.state import Batch
from alchemi_lit.models import EMT, pair_search
from alchemi_lit.models.cell_list import batched_pairs
from alchemi_lit.models.small_cells import small_cell_plan

COPIES, REPEATS = 64, 5


def best_ms(fn, *args) -> float:
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t0)
    return min(times) * 1e3 / COPIES


def main() -> None:
    torch.set_num_threads(1)
    radius = float(EMT().cutoff)
    pair_search._TINY_MIN_SYSTEMS = 10**9  # the per-system path for every cell
    fcc = bulk("Cu", "fcc", a=3.61)
    cubic = bulk("Cu", "fcc", a=3.61, cubic=True)
    cases = {"fcc primitive, 1 atom": fcc, "fcc cubic, 4 atoms": cubic,
             "8 atoms": cubic * (2, 1, 1), "16 atoms": cubic * (2, 2, 1),
             "27 atoms": fcc * (3, 3, 3)}  # fmt: skip
    print("cell | candidates | per-system ms/cell | batched ms/cell")
    for name, atoms in cases.items():
        batch = Batch.from_atoms([atoms] * COPIES, dtype=torch.float64)
        rows = list(range(batch.num_systems))
        nmax = small_cell_plan(batch.positions.numpy(), batch.cell.numpy(), batch.pbc.numpy(),
                               batch.ptr.tolist(), [0], radius)[0]  # fmt: skip
        n = len(atoms)
        candidates = n * (n + 1) / 2 * np.prod([2 * x + 1 for x in nmax])
        loop = best_ms(pair_search.build_rows, batch, rows, radius)
        batched = best_ms(batched_pairs, batch, radius)
        print(f"{name} | {candidates:,.0f} | {loop:.2f} | {batched:.2f}")


if __name__ == "__main__":
    main()
