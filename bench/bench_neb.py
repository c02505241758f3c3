"""Batched nudged elastic bands vs ASE's NEB one band after another (issue #27, part 6).

Run (from the repository root)::

    python bench/bench_neb.py                  # 32 bands x 7 images (EMT), then SevenNet
    python bench/bench_neb.py --quick          # smoke run: 4 bands x 5 images, 20 steps, 1 repeat
    python bench/bench_neb.py --cases emt --repeats 5 --json out.json

Workload: adatom hops (an Au, Cu, Ag or Al adatom between hollow sites) and vacancy hops
(a top-layer neighbour into the vacancy) on fcc(100) slabs of Al and Cu, 2x2x3 and
3x3x3, the bottom layer fixed; endpoints relaxed (alchemi_lit FIRE, fmax 0.01, not
timed), 7 images by ASE's IDPP (``make_band``).  The SevenNet case: the first 8 of those
bands (``--quick``: 1) with SevenNet-0 (the ``alchemi_lit_sevenn`` plugin and sevenn's
``SevenNetCalculator``), skipped when the plugin is not installed.

Engines, each run in a fresh process (an alchemi_lit run leaves the process's glibc heap
thresholds changed, which would slow an ASE run after it): alchemi_lit,
``FIRE(band=NEB(climb=True, method="improvedtangent"))``, every band in flight
(``SizeAwareSampler`` within ``--max-atoms``); ASE, ``NEB(images, climb=True,
method="improvedtangent")`` + ``ase.optimize.FIRE`` for each band in turn, one
calculator per image.  Both: fmax 0.05 eV/Å, at most ``--max-steps`` steps, float64
(SevenNet: float32 in alchemi_lit, as its network runs).  Measured: wall time (median
of ``--repeats``), model calls (alchemi_lit: batched forwards; ASE: image evaluations,
``(steps + 1)(n - 2) + 2`` per band), steps per band, and the largest difference of
the raw and fitted (NEBTools) barriers between the engines.  Printed: the ratios.
"""

from __future__ import annotations

import argparse
import json
import pickle
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

SLABS = [("Al", (2, 2, 3)), ("Cu", (2, 2, 3)), ("Al", (3, 3, 3)), ("Cu", (3, 3, 3))]
ADATOMS = {"Al": ["Au", "Al", "Cu", "Ag"], "Cu": ["Cu", "Au", "Ag", "Al"]}


def endpoints(kind: str, metal: str, size: tuple, species: str, along: int) -> tuple:
    from ase.build import add_adsorbate, fcc100
    from ase.constraints import FixAtoms

    slab = fcc100(metal, size=size, vacuum=5.0)
    if kind == "adatom":
        add_adsorbate(slab, species, 1.7, "hollow")
        mover, target = len(slab) - 1, None
    else:  # vacancy: remove a top-layer atom, its neighbour along x or y hops in
        top = [a.index for a in slab if a.tag == 1]
        gone, mover = top[0], top[1 if along == 0 else size[0]]
        target = slab.positions[gone].copy()
        del slab[gone]
        mover -= 1 if mover > gone else 0
    slab.set_constraint(FixAtoms(mask=[a.tag == size[2] for a in slab]))
    final = slab.copy()
    if target is None:
        final.positions[mover, along] += slab.cell[along, along] / size[along]
    else:
        final.positions[mover] = target
    return slab, final


def workload(n_bands: int, n_images: int) -> list[list[Any]]:
    """``n_bands`` bands of ``n_images`` images (endpoints relaxed), as lists of Atoms."""
    import alchemi_lit as al
    from alchemi_lit.integrators import FIRE
    from alchemi_lit.models import EMT
    from alchemi_lit.workflows import make_band

    specs = []
    for k in range(n_bands):
        metal, size = SLABS[k % len(SLABS)]
        kind = "adatom" if k % 2 == 0 else "vacancy"
        specs.append((kind, metal, size, ADATOMS[metal][(k // 2) % 4], (k // 4) % 2))
    ends = [a for s in specs for a in endpoints(*s)]
    relaxer = al.Simulator(model=EMT(), stages=FIRE(fmax=0.01, max_steps=1000), precision="64")
    relaxed = relaxer.run(ends).to_atoms()
    for a, r in zip(ends, relaxed):
        a.positions = r.positions
    return [make_band(ends[2 * k], ends[2 * k + 1], n_images, "idpp", path_id=k)
            for k in range(n_bands)]  # fmt: skip


def run_alchemi(bands: list, model_name: str, fmax: float, steps: int, max_atoms: int) -> dict:
    import alchemi_lit as al
    from alchemi_lit.data import SizeAwareSampler
    from alchemi_lit.integrators import FIRE, NEB
    from alchemi_lit.workflows import band_results

    if model_name == "emt":
        from alchemi_lit.models import EMT

        model, precision = EMT(), "64"
    else:
        from alchemi_lit_sevenn import SevenNet

        model, precision = SevenNet("sevennet-0"), "32"
    stage = FIRE(fmax=fmax, max_steps=steps, band=NEB(climb=True, method="improvedtangent"))
    sim = al.Simulator(model=model, stages=stage, precision=precision, seed=0)
    data = [img for band in bands for img in band]
    start = time.perf_counter()
    res = sim.run(SizeAwareSampler(data, max_atoms=max_atoms))
    wall = time.perf_counter() - start
    out = band_results(res)
    return {
        "wall": wall, "calls": int(res.stats["forward_calls"]),
        "steps": [b.steps for b in out], "raw": [b.forward_barrier for b in out],
        "fit": [b.fitted_barrier for b in out],
    }  # fmt: skip


def run_ase(bands: list, model_name: str, fmax: float, steps: int) -> dict:
    from ase.mep import NEB, NEBTools
    from ase.optimize import FIRE

    def calculator() -> Any:
        if model_name == "emt":
            from ase.calculators.emt import EMT

            return EMT()
        from sevenn.calculator import SevenNetCalculator

        return SevenNetCalculator("7net-0", device="cpu")

    start, calls, out = time.perf_counter(), 0, {"steps": [], "raw": [], "fit": []}
    for band in bands:
        images = [img.copy() for img in band]
        for img in images:
            img.calc = calculator()
        neb = NEB(images, k=0.1, climb=True, method="improvedtangent")
        opt = FIRE(neb, logfile=None)
        opt.run(fmax=fmax, steps=steps)
        calls += (opt.nsteps + 1) * (len(images) - 2) + 2
        out["steps"].append(opt.nsteps)
        out["raw"].append(NEBTools(images).get_barrier(fit=False)[0])
        out["fit"].append(NEBTools(images).get_barrier(fit=True)[0])
    return {"wall": time.perf_counter() - start, "calls": calls, **out}


def worker(args: argparse.Namespace) -> None:
    """One engine run in this (fresh) process; the result as JSON on the last line."""
    warnings.simplefilter("ignore")
    import torch

    torch.set_num_threads(args.threads)
    with open(args.workload, "rb") as f:
        bands = pickle.load(f)
    if args.worker == "alchemi_lit":
        out = run_alchemi(bands, args.model, args.fmax, args.max_steps, args.max_atoms)
    else:
        out = run_ase(bands, args.model, args.fmax, args.max_steps)
    print(json.dumps(out))


def call(engine: str, path: Path, model: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--worker", engine, "--workload", str(path),
           "--model", model, "--fmax", str(args.fmax), "--max-steps", str(args.max_steps),
           "--max-atoms", str(args.max_atoms), "--threads", str(args.threads)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{engine} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench_case(name: str, bands: list, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bands.pkl"
        path.write_bytes(pickle.dumps(bands))
        runs: dict[str, list[dict]] = {"alchemi_lit": [], "ase": []}
        for r in range(args.repeats):  # interleaved, the order rotating
            for engine in (["alchemi_lit", "ase"] if r % 2 == 0 else ["ase", "alchemi_lit"]):
                runs[engine].append(call(engine, path, name, args))
    ours, ase = runs["alchemi_lit"][0], runs["ase"][0]
    wall = {e: float(np.median([x["wall"] for x in v])) for e, v in runs.items()}
    row = {
        "case": name, "bands": len(bands), "images": len(bands[0]),
        "wall_alchemi_lit": wall["alchemi_lit"], "wall_ase": wall["ase"],
        "speedup": wall["ase"] / wall["alchemi_lit"],
        "calls_alchemi_lit": ours["calls"], "calls_ase": ase["calls"],
        "steps_equal": ours["steps"] == ase["steps"],
        "max_raw_barrier_diff": float(np.max(np.abs(np.subtract(ours["raw"], ase["raw"])))),
        "max_fit_barrier_diff": float(np.max(np.abs(np.subtract(ours["fit"], ase["fit"])))),
    }  # fmt: skip
    print(
        f"{name}: {row['bands']} bands x {row['images']} images | wall alchemi_lit "
        f"{row['wall_alchemi_lit']:.2f} s, ASE {row['wall_ase']:.2f} s -> {row['speedup']:.2f}x | "
        f"model calls {row['calls_alchemi_lit']} vs {row['calls_ase']} | steps equal "
        f"{row['steps_equal']} | barrier diff raw {row['max_raw_barrier_diff']:.2e} eV, fitted "
        f"{row['max_fit_barrier_diff']:.2e} eV"
    )
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="4 bands x 5 images, 20 steps, 1 repeat")
    p.add_argument("--cases", nargs="+", default=["emt", "sevennet"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--fmax", type=float, default=0.05)
    p.add_argument("--max-steps", type=int, default=500)
    p.add_argument("--max-atoms", type=int, default=4000)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path)
    p.add_argument("--worker", choices=["alchemi_lit", "ase"], help=argparse.SUPPRESS)
    p.add_argument("--workload", help=argparse.SUPPRESS)
    p.add_argument("--model", default="emt", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    n_bands, n_images = (4, 5) if args.quick else (32, 7)
    if args.quick:
        args.repeats, args.max_steps = 1, 20
    rows = []
    for case in args.cases:
        if case == "sevennet":
            try:
                import alchemi_lit_sevenn  # noqa: F401
            except ImportError:
                print("sevennet: skipped (pip install -e plugins/alchemi_lit_sevenn)")
                continue
            bands = workload(min(n_bands, 8), n_images)
            if args.quick:
                bands = bands[:1]
        else:
            bands = workload(n_bands, n_images)
        rows.append(bench_case(case, bands, args))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
