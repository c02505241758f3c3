"""What could make SevenNet-0 relaxations cheaper on a CPU (issue #18's wall-time target)?

The positions-only benchmark (bench_mlip_relax.py) already sends exactly the atoms the
relaxations need through the network, and the network is 99.8 % of the wall time, so
what is left is the cost of one network call per atom.  This probe measures the three
levers a framework has over that cost, on the benchmark's own crystals:

* ``--batch-size`` (the default): the time to evaluate the whole set once, one structure
  per call (what ASE does) against batches of at most 16 ... 234 atoms;
* ``--compile``: ``torch.compile(dynamic=True)`` of the network: its first call (the
  compilation), its cost per call afterwards, and a whole relaxation eager vs compiled;
* ``--replicas``: two single-thread replicas over static shards of the data
  (``strategy="replicas"``) against one two-thread process, and how the greedy
  atom-balanced shards split the work actually done (atoms x steps);
* ``--slim-heap``: the two levers alchemi_lit now applies by default -- e3nn's code
  slimmed (``SevenNet(slim_graphs=True)``, :mod:`alchemi_lit.models.fx_slim`) and freed
  memory kept in the heap during a run (:mod:`alchemi_lit.core.heap`) -- alone and together,
  for batches of <= 117 atoms, one structure per call, and sevenn's own ASE calculator
  (what the ASE engine would gain from the same two changes);
* ``--heap-runs``: whole relaxations in fresh processes with the heap kept and with
  glibc's own behaviour (``Simulator(reuse_cpu_memory=False)``): in one process the
  first run's settings would outlive it.

Run alone on a quiet machine: ``python bench/probe_sevennet_levers.py [--batch-size]
[--compile] [--replicas]``.  Figures go to BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np
import torch
from common import gate_arguments, gate_from
from crystals import crystal_set

REPEATS = 3


def per_call(model: Any, batch: Any, repeats: int = REPEATS) -> float:
    """Median seconds of ``repeats`` calls after one warm-up call."""
    model(batch)  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        model(batch)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def groups_within(atoms: list[Any], budget: int) -> list[list[Any]]:
    """The set cut into consecutive batches of at most ``budget`` atoms (a structure
    larger than the budget goes alone), as a sampler would fill them."""
    out: list[list[Any]] = [[]]
    for a in atoms:
        if out[-1] and sum(len(b) for b in out[-1]) + len(a) > budget:
            out.append([])
        out[-1].append(a)
    return out


def probe_batch_size(atoms: list[Any], gate: Any) -> None:
    """Seconds to evaluate the whole set once (energies, forces, stress) with batches of
    at most B atoms: the same structures and the same work for every B, so the totals
    compare directly.  Rounds of every B in turn, so slow spells of a shared machine
    hit all of them; the median over rounds is printed."""
    from alchemi_lit_sevenn import SevenNet

    import alchemi_lit as al

    model = SevenNet()
    budgets = (1, 16, 32, 64, 117, 234)
    batches = {
        b: [al.Batch.from_atoms(g, dtype=torch.float32) for g in groups_within(atoms, b)]
        for b in budgets
    }
    seconds: dict[int, list[float]] = {b: [] for b in budgets}
    for _ in range(REPEATS):
        gate.wait("batch sizes")
        for b in budgets:
            seconds[b].append(sum(per_call(model, batch, 1) for batch in batches[b]))
    for b, values in seconds.items():
        label = "one structure per call" if b == 1 else f"batches of <= {b} atoms"
        print(f"{label:24s} ({len(batches[b]):2d} calls) {statistics.median(values):6.2f} s, "
              f"{1e3 * statistics.median(values) / 234:5.2f} ms/atom "
              f"(runs {', '.join(f'{v:.2f}' for v in values)})")  # fmt: skip


def probe_compile(atoms: list[Any], gate: Any) -> None:
    from alchemi_lit_sevenn import SevenNet

    import alchemi_lit as al

    chosen = groups_within(atoms, 117)[0]
    label = f"{sum(len(a) for a in chosen)} atoms"
    model = SevenNet()
    batch = al.Batch.from_atoms(chosen, dtype=torch.float32)
    gate.wait("eager")
    eager = per_call(model, batch)
    model.net = torch.compile(model.net, dynamic=True)
    t0 = time.perf_counter()
    model(batch)
    first = time.perf_counter() - t0
    compiled = per_call(model, batch)
    print(f"compile ({label}): eager {eager:.3f} s/call, compiled {compiled:.3f} s/call "
          f"({eager / compiled:.2f}x), first compiled call {first:.0f} s")  # fmt: skip


def probe_slim_heap(atoms: list[Any], gate: Any) -> None:
    """Seconds to evaluate the set once (energies and forces) for every combination of
    {sevenn's graphs, slimmed} x {glibc's heap, kept heap}, in rounds."""
    import warnings

    from alchemi_lit_sevenn import SevenNet
    from alchemi_lit_sevenn.model import _e3nn_import_guard

    import alchemi_lit as al
    from alchemi_lit.core.heap import kept_heap
    from alchemi_lit.models.fx_slim import slim_graph_modules

    with _e3nn_import_guard(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sevenn.calculator import SevenNetCalculator

        calculators = {slim: SevenNetCalculator("7net-0", device="cpu") for slim in (0, 1)}
    slim_graph_modules(calculators[1].model)
    models = {slim: SevenNet(compute_stress=False, slim_graphs=bool(slim)) for slim in (0, 1)}
    batches = {
        "batches of <= 117 atoms": [al.Batch.from_atoms(g, dtype=torch.float32)
                                    for g in groups_within(atoms, 117)],
        "one structure per call": [al.Batch.from_atoms([a], dtype=torch.float32) for a in atoms],
    }  # fmt: skip

    def ase_once(slim: int) -> None:
        calc = calculators[slim]
        for a in atoms:
            a = a.copy()
            calc.reset()
            a.calc = calc
            a.get_forces()

    def ours_once(slim: int, label: str) -> None:
        for batch in batches[label]:
            models[slim](batch)

    runs = {("SevenNetCalculator (ASE)", slim): (lambda s=slim: ase_once(s)) for slim in (0, 1)}
    for label in batches:
        for slim in (0, 1):
            runs[(f"alchemi_lit, {label}", slim)] = lambda s=slim, b=label: ours_once(s, b)
    seconds: dict[tuple[str, int, int], list[float]] = {}
    for fn in runs.values():
        fn()  # warm-up
    for _ in range(REPEATS):
        gate.wait("slim/heap")
        for (label, slim), fn in runs.items():
            for heap in (0, 1):
                with kept_heap(bool(heap)):
                    t0 = time.perf_counter()
                    fn()
                    seconds.setdefault((label, slim, heap), []).append(time.perf_counter() - t0)
    for label in dict.fromkeys(label for label, _ in runs):
        base = statistics.median(seconds[(label, 0, 0)])
        cells = []
        for slim, heap in ((0, 0), (1, 0), (0, 1), (1, 1)):
            t = statistics.median(seconds[(label, slim, heap)])
            cells.append(f"{t:5.2f} s ({base / t:.2f}x)")
        print(f"{label:40s} " + " | ".join(cells))
    print("columns: as shipped by sevenn | slimmed | kept heap | both; median of rounds")


def relax_once(devices: int, compiled: bool = False, reuse: bool = True) -> None:
    """One SevenNet-0 FIRE relaxation of the set; rank 0 prints a JSON line.  Run in its
    own process (``--relax N``): every rank of a replicas run re-executes this script."""
    import json

    from alchemi_lit_sevenn import SevenNet

    import alchemi_lit as al
    from alchemi_lit.data import SizeAwareSampler
    from alchemi_lit.integrators import FIRE
    from alchemi_lit.strategies.distributed import shard

    atoms = crystal_set()
    kwargs = {"strategy": "replicas", "devices": devices} if devices > 1 else {}
    model = SevenNet()
    if compiled:
        model.net = torch.compile(model.net, dynamic=True)
    sim = al.Simulator(model=model, stages=FIRE(fmax=0.05, max_steps=500), precision="32",
                       accelerator="cpu", seed=0, reuse_cpu_memory=reuse, **kwargs)  # fmt: skip
    t0 = time.perf_counter()
    res = sim.run(SizeAwareSampler(atoms, max_atoms=117 // devices))
    wall = time.perf_counter() - t0
    if not sim.is_global_zero:
        return
    sizes = np.array([len(a) for a in atoms])
    ids = res.system_id.numpy()
    work = dict(zip(ids.tolist(), (sizes[ids] * (res.steps.numpy() + 1)).tolist()))
    sampler = SizeAwareSampler(atoms, max_atoms=58)
    split = [sum(work[int(i)] for i in shard(sampler, 2, p).system_ids) for p in range(2)]
    print("RESULT " + json.dumps({"devices": devices, "wall": wall, "split": split}))


def compare_relaxations(gate: Any, variants: dict[str, list[str]]) -> list[int]:
    """Whole relaxations of the set, one per variant in turn (fresh processes, start-up
    included: a user pays it too), ``REPEATS`` rounds; prints medians, returns the
    greedy two-shard split of the work."""
    import json
    import subprocess
    import sys

    walls: dict[str, list[float]] = {label: [] for label in variants}
    split: list[int] = []
    for _ in range(REPEATS):
        for label, flags in variants.items():
            gate.wait(label)
            t0 = time.perf_counter()
            out = subprocess.run([sys.executable, __file__, *flags],
                                 capture_output=True, text=True, check=True).stdout  # fmt: skip
            line = next(x for x in out.splitlines() if x.startswith("RESULT "))
            walls[label].append(time.perf_counter() - t0)
            split = json.loads(line[len("RESULT ") :])["split"]
    for label, values in walls.items():
        print(f"{label}: {statistics.median(values):.1f} s "
              f"(runs {', '.join(f'{v:.1f}' for v in values)}, start-up included)")  # fmt: skip
    return split


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", action="store_true", help="time batch budgets")
    parser.add_argument("--compile", action="store_true", help="time torch.compile (minutes)")
    parser.add_argument("--replicas", action="store_true", help="time 2 replicas vs 1 process")
    parser.add_argument("--slim-heap", action="store_true", help="time slim graphs, kept heap")
    parser.add_argument("--relax", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--compiled", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--glibc-heap", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--heap-runs", action="store_true", help="relaxations, kept heap vs glibc's heap"
    )
    gate_arguments(parser)
    args = parser.parse_args()
    if args.relax:
        relax_once(args.relax, args.compiled, reuse=not args.glibc_heap)
        return
    gate = gate_from(args)
    atoms = crystal_set()
    chosen = args.compile or args.replicas or args.slim_heap or args.heap_runs
    if args.batch_size or not chosen:
        probe_batch_size(atoms, gate)
    if args.compile:
        probe_compile(atoms, gate)
        variants = {
            "relax, eager": ["--relax", "1"],
            "relax, compiled": ["--relax", "1", "--compiled"],
        }
        compare_relaxations(gate, variants)
    if args.slim_heap:
        probe_slim_heap(atoms, gate)
    if args.heap_runs:
        variants = {
            "relax, kept heap": ["--relax", "1"],
            "relax, glibc's heap": ["--relax", "1", "--glibc-heap"],
        }
        compare_relaxations(gate, variants)
    if args.replicas:
        variants = {
            "1 process x 2 threads": ["--relax", "1"],
            "2 replicas x 1 thread": ["--relax", "2"],
        }
        split = compare_relaxations(gate, variants)
        print(f"atom-steps per greedy shard: {split} of {sum(split)}")


if __name__ == "__main__":
    main()
