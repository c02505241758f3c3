"""Neighbour lists of many tiny periodic cells on the CPU: the per-system path (vesin's
pairs by an all-pairs test per cell) against the batched builder (models.cell_list),
64 copies of each cell, EMT's cutoff.  Sets where pair_search routes tiny cells.

    python bench/tiny_cells_neighbors.py
"""

import time, torch, numpy as np
from ase.build import bulk
from alchemi_lit.core.state import Batch
from alchemi_lit.models.pair_search import build_rows
from alchemi_lit.models.cell_list import batched_pairs
from alchemi_lit.models.small_cells import small_cell_plan
r=5.876798323827276
from alchemi_lit.models import pair_search; pair_search._TINY_MIN_SYSTEMS = 10**9
cases={"1 prim":bulk("Cu","fcc",a=3.61),"4 cubic":bulk("Cu","fcc",a=3.61,cubic=True),"8":bulk("Cu","fcc",a=3.61,cubic=True)*(2,1,1),"16":bulk("Cu","fcc",a=3.61,cubic=True)*(2,2,1),"27 prim3":bulk("Cu","fcc",a=3.61)*(3,3,3)}
for name, at in cases.items():
    bb = Batch.from_atoms([at]*64, dtype=torch.float64)
    plan = small_cell_plan(bb.positions.numpy(), bb.cell.numpy(), bb.pbc.numpy(), bb.ptr.tolist(), [0], r)
    ts1=[];ts2=[]
    for rep in range(5):
        t=time.perf_counter(); a=build_rows(bb, list(range(bb.num_systems)), r); ts1.append(time.perf_counter()-t)
        t=time.perf_counter(); c=batched_pairs(bb, r); ts2.append(time.perf_counter()-t)
    n=len(at); nmax=plan[0]
    cand = n*(n+1)/2*np.prod([2*x+1 for x in nmax]) if nmax else None
    print(name, nmax, cand, f"loop {min(ts1)*1e3/64:.3f} ms/sys batched {min(ts2)*1e3/64:.3f} ms/sys")
