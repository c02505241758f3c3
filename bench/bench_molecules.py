"""Workload (d): thousands of small molecules relaxed at once, against the peers.

Run (from the repository root; ~2 minutes on 2 CPU cores with the peers)::

    python bench/bench_molecules.py
    python bench/bench_molecules.py --systems 5000 --no-peers

Screening often means many small, non-periodic structures, where what a framework
costs per *system* (building its neighbour list, validating it, moving it in and out
of the batch) matters more than its per-atom speed.  Workload: ``--systems`` (2 000)
argon clusters of 2-30 atoms (the atoms of an fcc crystal nearest its centre,
Gaussian noise of 0.3 Å, seed 0; no cell, no periodicity), Lennard-Jones ε = 0.0104 eV,
σ = 3.40 Å, rc = 8.5 Å, float64, 2 torch threads.  FIRE with ASE's parameters, fmax
0.05 eV/Å, at most 500 steps:

* alchemi_lit: ``FIRE`` through ``SizeAwareSampler(max_atoms=20 000)`` (inflight; all
  systems fit at once), results in memory.
* TorchSim: ``ts.optimize`` with ``fire(md_flavor="ase_fire")`` on one state holding
  every system (its ``LennardJonesModel``, forces halved as in ``bench_dynamics.py``:
  its 0.3.x forces are 2x too large; checked against ASE first).
* ASE: ``FIRE`` one system at a time on the first ``--ase-systems`` (100), scaled to
  all; the step counts of those systems are compared with alchemi_lit's (the same
  algorithm, step for step).

nvalchemi-toolkit is left out here: its CPU path runs Warp kernels in a separate
environment (``bench_dynamics.py`` compares it on crystals); this workload is about
per-system framework cost.  Reported: wall time, systems/s, atom-steps/s (Σ atoms x
the steps each system took, ASE-algorithm counts), and ratios to alchemi_lit.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import numpy as np
import torch
from common import (
    ARGON_A,
    ARGON_LJ,
    environment_line,
    format_table,
    gate_arguments,
    gate_from,
    median,
    package_version,
    setup_threads,
    torchsim_fire,
    torchsim_force_error,
    torchsim_lj,
)

FMAX, MAX_STEPS, NOISE = 0.05, 500, 0.3
DT = torch.float64


def argon_clusters(n_systems: int, min_atoms: int = 2, max_atoms: int = 30, seed: int = 0):
    """``n_systems`` non-periodic argon clusters: the ``n`` atoms of an fcc crystal
    nearest its centre (``n`` uniform in [min_atoms, max_atoms]), with Gaussian noise."""
    from ase.build import bulk

    rng = np.random.default_rng(seed)
    base = bulk("Ar", "fcc", a=ARGON_A, cubic=True).repeat(4)
    order = np.argsort(np.linalg.norm(base.positions - base.positions.mean(0), axis=1))
    out = []
    for _ in range(n_systems):
        n = int(rng.integers(min_atoms, max_atoms + 1))
        atoms = base[order[:n]]
        atoms.positions += rng.normal(scale=NOISE, size=(n, 3))
        atoms.pbc = False
        atoms.cell = np.zeros((3, 3))
        out.append(atoms)
    return out


def run_alchemi(clusters: list[Any]) -> tuple[float, np.ndarray]:
    import alchemi_lit as al
    from alchemi_lit.data import SizeAwareSampler
    from alchemi_lit.integrators import FIRE
    from alchemi_lit.models import LennardJones

    sim = al.Simulator(
        model=LennardJones(**ARGON_LJ),
        stages=FIRE(fmax=FMAX, max_steps=MAX_STEPS),
        precision="64",
    )
    t0 = time.perf_counter()
    res = sim.run(SizeAwareSampler(clusters, max_atoms=20_000))
    wall = time.perf_counter() - t0
    assert len(res) == len(clusters) and bool(res.converged.all()), "alchemi_lit lost systems"
    return wall, res.steps.numpy()


def run_torchsim(clusters: list[Any]) -> tuple[float, str]:
    model = torchsim_lj(DT)
    err = torchsim_force_error(model, clusters[:3], DT)
    assert err < 1e-8, f"halved TorchSim forces differ from ASE by {err}"
    t0 = time.perf_counter()
    torchsim_fire(clusters, model, DT, FMAX, MAX_STEPS)
    wall = time.perf_counter() - t0
    version = package_version("torch-sim-atomistic")
    return wall, f"TorchSim {version}: forces halved, match ASE to {err:.0e} eV/Å"


def run_ase(clusters: list[Any]) -> tuple[float, list[int]]:
    """Seconds for ``clusters`` one at a time, and each one's FIRE steps."""
    from ase.calculators.lj import LennardJones as AseLJ
    from ase.optimize import FIRE as AseFIRE

    steps = []
    t0 = time.perf_counter()
    for a in clusters:
        a = a.copy()
        a.calc = AseLJ(epsilon=ARGON_LJ["epsilon"], sigma=ARGON_LJ["sigma"], rc=ARGON_LJ["cutoff"])
        opt = AseFIRE(a, logfile=None)
        opt.run(fmax=FMAX, steps=MAX_STEPS)
        steps.append(opt.nsteps)
    return time.perf_counter() - t0, steps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--systems", type=int, default=2000)
    p.add_argument("--ase-systems", type=int, default=100, help="ASE runs these, scaled")
    p.add_argument("--repeats", type=int, default=3, help="alchemi_lit runs (median)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-peers", action="store_true")
    gate_arguments(p)
    args = p.parse_args(argv)
    setup_threads(args.threads)
    gate = gate_from(args)
    print(f"# many small molecules | {environment_line()}", flush=True)
    clusters = argon_clusters(args.systems)
    sizes = np.asarray([len(a) for a in clusters])
    run_alchemi(argon_clusters(50, seed=1))  # warm-up (imports, first allocations)
    gate.wait("alchemi_lit")
    runs = [run_alchemi(clusters) for _ in range(args.repeats)]
    wall = median([w for w, _ in runs])
    steps = runs[0][1]
    atom_steps = float((sizes * steps).sum())
    rows = [("alchemi_lit", wall, args.systems, "")]
    notes = [f"{args.systems} clusters, {sizes.sum()} atoms, FIRE steps mean {steps.mean():.1f}"]
    if not args.no_peers:
        k = min(args.ase_systems, args.systems)
        gate.wait("ASE")
        ase_wall, ase_steps = run_ase(clusters[:k])
        same = ase_steps == steps[:k].tolist()
        notes.append(
            f"ASE steps {'equal' if same else 'DIFFER from'} alchemi_lit's on its {k} systems"
        )
        rows.append(
            ("ASE (one at a time)", ase_wall * args.systems / k, args.systems, f"scaled from {k}")
        )
        if package_version("torch-sim-atomistic"):
            gate.wait("TorchSim")
            ts_wall, note = run_torchsim(clusters)
            rows.append(("TorchSim (one state)", ts_wall, args.systems, ""))
            notes.append(note)
        else:
            notes.append("TorchSim not installed (pip install torch-sim-atomistic): skipped")
    table = format_table(
        ["framework", "wall s", "systems/s", "atom-steps/s", "x alchemi_lit time", "note"],
        [
            (name, f"{w:.2f}", f"{n / w:,.0f}", f"{atom_steps / w:,.0f}", f"{w / wall:.1f}x", note)
            for name, w, n, note in rows
        ],
    )
    print("\n" + table)
    print()
    for note in notes:
        print(f"* {note}")
    print(f"* {gate.status_line()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
