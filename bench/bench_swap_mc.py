"""Swap Monte Carlo of many Cu-Au cells: alchemi_lit's batched SwapMC against ASE one
system at a time and TorchSim's swap MC.

Run (from the repository root)::

    python bench/bench_swap_mc.py                      # 256 cells, EMT: alchemi_lit vs ASE
    python bench/bench_swap_mc.py --sevennet           # + SevenNet-0: alchemi_lit vs TorchSim
    python bench/bench_swap_mc.py --quick              # seconds: the code path, no figures

Workload: ``--cells`` (256) random Cu16Au16 cells (2x2x2 conventional fcc, a = 3.85 Å,
rattled 0.02 Å), ``--steps`` swap attempts per cell at ``--temperature`` (800 K).
Engines, each timed after an untimed warm-up, attempts per second = cells x steps / s:

* **alchemi_lit, EMT**: ``SwapMC`` with every cell in flight, one batched EMT forward a
  step (float64, CPU);
* **ASE, EMT**: a hand-written Metropolis loop over ``ase.calculators.emt.EMT``, one cell
  at a time (``--ase-cells`` of them: ASE's rate does not depend on how many);
* with ``--sevennet``, **alchemi_lit, SevenNet-0** (the ``alchemi_lit_sevenn`` plugin,
  float32) and **TorchSim 0.6.2, SevenNet-0** (``ts.swap_mc_step``: all cells in one
  state; its own Python 3.12 venv, ``bash bench/setup_torchsim.sh``).  ``--mlip-batch k``
  runs k cells at a time on both sides where all of them do not fit in memory (SevenNet
  on a CPU holds some MB per atom): alchemi_lit in flight (a cell done, the next joins),
  TorchSim one state of k after another.  TorchSim has no
  EMT, hence SevenNet-0 for that pair.  TorchSim swaps positions (the atoms keep their
  masses and velocities) where alchemi_lit swaps species; the energies are the same.

Checked before timing: alchemi_lit's EMT energies of the cells equal ASE's (max |ΔE|
printed), and each engine's acceptance rate is printed (the same ensemble: they should
agree within their statistical spread).  Records go to bench/results/ (bench/records.py).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment_line, format_table, setup_threads


def cells(n: int, seed: int = 0) -> list[Any]:
    from ase.build import bulk

    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        atoms = bulk("Cu", "fcc", a=3.85, cubic=True).repeat(2)
        atoms.numbers[rng.permutation(len(atoms))[: len(atoms) // 2]] = 79
        atoms.rattle(0.02, seed=seed + k)
        out.append(atoms)
    return out


def alchemi(structures: list[Any], steps: int, temperature: float, model: Any, dtype: str,
            batch: int = 0):  # fmt: skip
    """Seconds of ``steps`` batched SwapMC attempts per cell, accepted swaps (``batch``
    cells in flight at a time, inflight batching; 0: all of them in one batch)."""
    import alchemi_lit as al
    from alchemi_lit.data import SizeAwareSampler
    from alchemi_lit.integrators import SwapMC

    def run(n: int):
        plan = SwapMC(["Cu", "Au"], temperature=temperature, steps=n)
        data = structures
        if batch:
            data = SizeAwareSampler(structures, max_atoms=batch * len(structures[0]))
        return al.Simulator(model=model, stages=plan, precision=dtype, seed=1).run(data)

    run(2)  # warm-up
    t0 = time.perf_counter()
    batch = run(steps).batch
    return time.perf_counter() - t0, int(batch.mc_accepted.sum())


def ase_loop(structures: list[Any], steps: int, temperature: float, seed: int = 0):
    """The reference loop: pick a and b of unlike species, swap, EMT, Metropolis."""
    from ase.calculators.emt import EMT
    from ase.units import kB

    rng = np.random.default_rng(seed)
    accepted = 0
    t0 = time.perf_counter()
    for atoms in structures:
        atoms = atoms.copy()
        atoms.calc = EMT()
        energy = atoms.get_potential_energy()
        for _ in range(steps):
            z = atoms.numbers
            a = rng.integers(len(z))
            others = np.flatnonzero(z != z[a])
            b = others[rng.integers(len(others))]
            z = z.copy()
            z[[a, b]] = z[[b, a]]
            atoms.numbers = z
            new = atoms.get_potential_energy()
            if np.log(rng.random()) < -(new - energy) / (kB * temperature):
                energy, accepted = new, accepted + 1
            else:
                z[[a, b]] = z[[b, a]]
                atoms.numbers = z
    return time.perf_counter() - t0, accepted


def emt_agreement(structures: list[Any]) -> float:
    """max |E_alchemi - E_ASE| (eV) over the cells, EMT, float64."""
    from ase.calculators.emt import EMT as AseEMT

    import alchemi_lit as al
    from alchemi_lit.models import EMT

    ours = EMT()(al.Batch.from_atoms(structures))["energy"].numpy()
    theirs = []
    for atoms in structures:
        atoms = atoms.copy()
        atoms.calc = AseEMT()
        theirs.append(atoms.get_potential_energy())
    return float(np.abs(ours - np.array(theirs)).max())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=256)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--ase-cells", type=int, default=8)
    parser.add_argument("--temperature", type=float, default=800.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sevennet", action="store_true", help="also SevenNet-0 vs TorchSim")
    parser.add_argument("--mlip-batch", type=int, default=0,
                        help="SevenNet runs: cells in one batch (alchemi_lit, inflight) or "
                             "one state (TorchSim, states one after another); 0: all")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="seconds: 8 cells, 3 steps")
    args = parser.parse_args()
    if args.quick:
        args.cells, args.steps, args.ase_cells = 8, 3, 2
    setup_threads(args.threads)
    from alchemi_lit.models import EMT

    structures = cells(args.cells)
    print(environment_line())
    print(f"EMT check: max |E_alchemi - E_ASE| = {emt_agreement(structures[:8]):.2e} eV")
    rows = []

    def row(engine: str, model: str, n: int, seconds: float, accepted: int) -> None:
        attempts = n * args.steps
        rows.append([engine, model, n, args.steps, f"{seconds:.2f}", f"{attempts / seconds:.3g}",
                     f"{accepted / attempts:.3f}"])  # fmt: skip

    s, acc = alchemi(structures, args.steps, args.temperature, EMT(), "64")
    row("alchemi_lit (batched)", "EMT float64", args.cells, s, acc)
    s, acc = ase_loop(structures[: args.ase_cells], args.steps, args.temperature)
    row("ASE (one at a time)", "EMT float64", args.ase_cells, s, acc)
    if args.sevennet:
        sevennet_rows(structures, args, row)
    headers = ["engine", "model", "cells", "steps", "s", "attempts/s", "acceptance"]
    print(format_table(headers, rows, title=f"swap MC of Cu16Au16 cells at {args.temperature} K"))
    return 0


def sevennet_rows(structures: list[Any], args: Any, row: Any) -> None:
    """SevenNet-0: alchemi_lit's plugin and TorchSim's swap MC (its venv)."""
    from alchemi_lit_sevenn import SevenNet
    from torchsim_peer import PeerError, TorchSimPeer

    size = args.mlip_batch or len(structures)
    s, acc = alchemi(structures, args.steps, args.temperature, SevenNet("sevennet-0"), "32",
                     args.mlip_batch)  # fmt: skip
    engine = "alchemi_lit (batched)" if size >= len(structures) else f"alchemi_lit ({size} a batch)"
    row(engine, "SevenNet-0 float32", args.cells, s, acc)
    try:
        with TorchSimPeer(structures, args.threads) as peer:
            peer.call("setup", model="sevennet", threads=args.threads, dtype="float32")
            peer.call("swap_mc", steps=2, temperature=args.temperature, systems=size)  # warm-up
            seconds = accepted = 0
            for first in range(0, len(structures), size):
                res = peer.call("swap_mc", steps=args.steps, temperature=args.temperature,
                                systems=size, first=first, seed=first)  # fmt: skip
                seconds, accepted = seconds + res["seconds"], accepted + res["accepted"]
        engine = "TorchSim 0.6.2" if size >= len(structures) else f"TorchSim 0.6.2 ({size} a state)"
        row(engine, "SevenNet-0 float32", args.cells, seconds, accepted)
    except PeerError as exc:
        print(f"TorchSim skipped: {exc}")


if __name__ == "__main__":
    sys.exit(main())
