"""What batch independence by construction costs (issue #41): the same FIRE relaxation and
Langevin NVT run by two source trees -- before the change (sums as sparse CSR products
with ones, row sums as products with ones) and after it (run sums, column additions,
elementwise 3x3 products) -- interleaved, one process per run.

Run (from the repository root; the "before" tree is a git worktree of the commit
before #41)::

    git worktree add /tmp/before d1ec2f3
    python bench/bench_batch_independence.py --before /tmp/before --after . --repeats 3

Workload: bench_dynamics' (a): 64 argon crystals of 108 atoms, LJ rc 8.5 Å, skin 1 Å,
float64; FIRE to fmax 0.05 eV/Å and 200 Langevin steps, one torch thread.  Prints the
median wall time of each tree per task and the ratio after / before.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment_line, format_table

#: the timed child: prints {"FIRE relax": s, "Langevin NVT": s} for the tree on its path
CHILD = r"""
import json, time, torch
torch.set_num_threads(1)
import alchemi_lit as al
from alchemi_lit.core.state import Batch
from alchemi_lit.data import argon_crystals
from alchemi_lit.integrators import FIRE, Langevin
from alchemi_lit.models import LennardJones
atoms = argon_crystals(n_systems=64, repeat=3, noise=0.1, seed=0)
model = LennardJones(epsilon=0.0104, sigma=3.40, cutoff=8.5, skin=1.0)
def run(stages, batch):
    sim = al.Simulator(model=model, stages=stages, accelerator="cpu", precision="64", seed=0)
    t = time.perf_counter(); sim.run(batch); return time.perf_counter() - t
out = {}
run(FIRE(fmax=0.05, max_steps=20), Batch.from_atoms(atoms, dtype=torch.float64))  # warm-up
relax = Batch.from_atoms(atoms, dtype=torch.float64)
out["FIRE relax"] = run(FIRE(fmax=0.05, max_steps=500), relax)
out["Langevin NVT"] = run(Langevin(dt=2.0, temperature=60.0, friction=0.01, steps=200),
                          Batch.from_atoms(atoms, dtype=torch.float64))
print(json.dumps(out))
"""


def time_tree(tree: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-c", CHILD], env=env, cwd=tree, capture_output=True,
                         text=True, check=True)  # fmt: skip
    return json.loads(run.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", type=Path, required=True, help="source tree before #41")
    p.add_argument("--after", type=Path, default=Path("."), help="source tree after #41")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    print(f"# batch independence by construction: before vs after | {environment_line()}")
    times: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
    for _ in range(args.repeats):  # interleaved: before, after, before, after ...
        for name, tree in (("before", args.before), ("after", args.after)):
            for task, seconds in time_tree(tree.resolve()).items():
                times[name].setdefault(task, []).append(seconds)
    rows = []
    for task in times["before"]:
        b, a = (statistics.median(times[k][task]) for k in ("before", "after"))
        rows.append([task, f"{b:.3f}", f"{a:.3f}", f"{a / b:.2f}x"])
    print(format_table(["task", "before #41 (s)", "after #41 (s)", "after / before"], rows,
                       title="Batch independence by construction: cost"))  # fmt: skip


if __name__ == "__main__":
    main()
