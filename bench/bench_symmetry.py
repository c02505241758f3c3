"""Symmetry-constrained cell relaxation of 108 crystals: alchemi_lit batched vs ASE one
at a time, and what FixSymmetry costs in the step (#43).

Run (from the repository root)::

    python bench/bench_symmetry.py                  # SevenNet-0, 108 crystals, CPU
    python bench/bench_symmetry.py --device cuda    # the same on a GPU (alchemi_lit only
                                                    # on the GPU; ASE's calculator too)
    python bench/bench_symmetry.py --quick          # EMT, 6 crystals: a smoke run, seconds

Workload: the twelve crystals of ``crystals.py`` (Si, Ge, GaAs, NaCl, MgO, LiF, Cu, Al,
Ni, bcc Fe, wurtzite ZnO, rutile TiO2; primitive cells) each at nine isotropic scales
(0.96 ... 1.04 of the lattice constant) = 108 crystals, rattled by 0.002 Å from one seed,
then ASE's ``FixSymmetry(atoms, symprec=0.02)`` on each (which refines the rattle away:
both engines start from the same refined structures).  FIRE with ASE's parameters on
the Frechet cell filter, fmax 0.05 eV/Å, at most 500 steps.  ``--quick``: Cu, Al, Ni
at two scales with EMT (float64).

Engines: ASE (``ase.optimize.FIRE(FrechetCellFilter(atoms))``, FixSymmetry set, the
same model as an ASE calculator: sevenn's ``SevenNetCalculator`` or ASE's EMT), one
crystal after the other; alchemi_lit (every crystal in flight within ``--max-atoms``,
SevenNet-0 in float32 through its plugin).  ASE runs first (a run of alchemi_lit changes
this process's heap settings, alchemi_lit.core.heap).

Measured: wall time, steps, forward calls; the constraint's own time (FixSymmetry's
adjust_forces/stress/cell/positions, timed around each call, the device synchronised
before and after on a GPU) and its share of the wall time (target <= 5 %); the
space groups kept (spglib at 1e-3 Å on the final structures: the results table's
``symmetry``), and agreement of the final energies per atom between the engines.
"""

from __future__ import annotations

import argparse
import functools
import time
from typing import Any

import numpy as np
from common import environment_line, format_table, setup_threads
from crystals import NAMES, primitive

SCALES = np.linspace(0.96, 1.04, 9)
QUICK = (("Cu", "Al", "Ni"), (0.98, 1.02))


def crystal_set(names: tuple[str, ...], scales: Any, seed: int = 43) -> list[Any]:
    """Each crystal at each isotropic scale, rattled by 0.002 Å, with ASE's FixSymmetry."""
    from alchemi_lit.core.symmetry import fix_symmetry

    rng = np.random.default_rng(seed)
    out = []
    for name in names:
        for s in scales:
            atoms = primitive(name)
            atoms.set_cell(atoms.cell.array * s, scale_atoms=True)
            atoms.positions += rng.normal(0.0, 0.002, atoms.positions.shape)
            atoms.info["name"] = f"{name}@{s:.2f}"
            out.append(atoms)
    return fix_symmetry(out, symprec=0.02)


class ConstraintTimer:
    """Wall time inside the methods of a class (FixSymmetry's adjustments), summed; the
    device synchronised around each call so a GPU's queued work is counted."""

    def __init__(self, cls: type, names: tuple[str, ...], device: str) -> None:
        self.cls, self.names, self.seconds, self.calls = cls, names, 0.0, 0
        self.sync = _synchronizer(device)
        self.saved: dict[str, Any] = {}

    def __enter__(self) -> ConstraintTimer:
        for name in self.names:
            original = self.saved[name] = getattr(self.cls, name)

            @functools.wraps(original)
            def timed(*args: Any, _f: Any = original, **kwargs: Any) -> Any:
                self.sync()
                t0 = time.perf_counter()
                out = _f(*args, **kwargs)
                self.sync()
                self.seconds += time.perf_counter() - t0
                self.calls += 1
                return out

            setattr(self.cls, name, timed)
        return self

    def __exit__(self, *exc: Any) -> None:
        for name, original in self.saved.items():
            setattr(self.cls, name, original)


def _synchronizer(device: str) -> Any:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.synchronize
    return lambda: None


def run_ase(atoms: list[Any], calc: Any, fmax: float, max_steps: int, device: str) -> dict:
    from ase.constraints import FixSymmetry
    from ase.filters import FrechetCellFilter
    from ase.optimize import FIRE

    names = ("adjust_forces", "adjust_stress", "adjust_cell", "adjust_positions")
    steps, energies, finals = [], [], []
    with ConstraintTimer(FixSymmetry, names, "cpu") as timer:
        t0 = time.perf_counter()
        for a0 in atoms:
            a = a0.copy()
            a.calc = calc
            opt = FIRE(FrechetCellFilter(a), logfile=None)
            opt.run(fmax=fmax, steps=max_steps)
            steps.append(int(opt.nsteps))
            energies.append(a.get_potential_energy() / len(a))
            finals.append(a)
        wall = time.perf_counter() - t0
    return {"wall": wall, "steps": steps, "forward_calls": sum(steps) + len(steps),
            "constraint_s": timer.seconds, "energy_per_atom": energies,
            "final": finals}  # fmt: skip


def run_alchemi(
    atoms: list[Any], model: Any, precision: str, fmax: float, max_steps: int, device: str,
    max_atoms: int,
) -> dict:  # fmt: skip
    import alchemi_lit as al
    from alchemi_lit.core.symmetrize import FixSymmetryKind
    from alchemi_lit.data import SizeAwareSampler
    from alchemi_lit.integrators import FIRE

    names = ("adjust_forces", "adjust_stress", "adjust_cell", "adjust_positions")
    sim = al.Simulator(model=model, stages=FIRE(fmax=fmax, max_steps=max_steps, cell="frechet"),
                       precision=precision, accelerator=device, seed=0)  # fmt: skip
    with ConstraintTimer(FixSymmetryKind, names, device) as timer:
        t0 = time.perf_counter()
        res = sim.run(SizeAwareSampler(atoms, max_atoms=max_atoms))
        wall = time.perf_counter() - t0
    table = res.to_pandas()
    return {"wall": wall, "steps": res.steps.tolist(),
            "forward_calls": int(res.stats.get("forward_calls", -1)),
            "constraint_s": timer.seconds,
            "energy_per_atom": table.energy_per_atom.tolist(), "table": table,
            "final": res.to_atoms()}  # fmt: skip


def kept(initial: list[Any], final: list[Any]) -> int:
    """How many final structures have every operation of their initial one (spglib at
    1e-3 Å)."""
    from ase.spacegroup.symmetrize import check_symmetry

    count = 0
    for a, b in zip(initial, final):
        have = {r.tobytes() for r in check_symmetry(b, 1e-3).rotations.astype(np.int64)}
        want = check_symmetry(a, 1e-3).rotations.astype(np.int64)
        count += all(r.tobytes() in have for r in want)
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="EMT, 6 crystals (seconds)")
    parser.add_argument("--device", default="cpu", help="alchemi_lit's accelerator (cpu, cuda)")
    parser.add_argument("--max-atoms", type=int, default=512, help="alchemi_lit's atom budget")
    parser.add_argument("--fmax", type=float, default=0.05)
    parser.add_argument("--max-steps", type=int, default=500)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    setup_threads(args.threads)
    names, scales = QUICK if args.quick else (NAMES, SCALES)
    atoms = crystal_set(names, scales)
    if args.quick:
        from ase.calculators.emt import EMT as AseEMT

        from alchemi_lit.models import EMT

        model, calc, precision, label = EMT(), AseEMT(), "64", "EMT (float64)"
    else:
        from alchemi_lit_sevenn import SevenNet
        from sevenn.calculator import SevenNetCalculator

        model, precision, label = SevenNet("sevennet-0"), "32", "SevenNet-0 (float32)"
        calc = SevenNetCalculator("7net-0", device=args.device)
    n_atoms = sum(len(a) for a in atoms)
    print(f"{len(atoms)} crystals, {n_atoms} atoms; {label}; {environment_line()}")
    ase = run_ase(atoms, calc, args.fmax, args.max_steps, args.device)
    ours = run_alchemi(
        atoms, model, precision, args.fmax, args.max_steps, args.device, args.max_atoms
    )
    rows = []
    for name, r in (("ASE (serial)", ase), (f"alchemi_lit ({args.device})", ours)):
        rows.append([
            name, len(atoms), f"{r['wall']:.2f}", f"{np.mean(r['steps']):.1f}",
            r["forward_calls"], f"{len(atoms) / r['wall']:.2f}", f"{r['constraint_s']:.3f}",
            f"{100 * r['constraint_s'] / r['wall']:.1f}", f"{kept(atoms, r['final'])}/{len(atoms)}",
        ])  # fmt: skip
    headers = ["engine", "crystals", "wall s", "steps/crystal", "forward calls",
               "crystals/s", "FixSymmetry s", "FixSymmetry %", "group kept"]  # fmt: skip
    print(format_table(headers, rows, f"FixSymmetry cell relaxation, {label}"))
    diff = np.abs(np.array(ase["energy_per_atom"]) - np.array(ours["energy_per_atom"]))
    verdicts = ours["table"].symmetry.value_counts().to_dict()
    agreement = [[f"{diff.max():.2e}", f"{np.median(diff):.2e}", str(verdicts)]]
    print(format_table(["max |dE/atom| eV", "median |dE/atom| eV", "results table symmetry"],
                       agreement, "Agreement of the final structures"))  # fmt: skip
    print(f"speed-up {ase['wall'] / ours['wall']:.1f}x")


if __name__ == "__main__":
    main()
