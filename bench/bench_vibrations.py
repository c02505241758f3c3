"""Vibrations and thermochemistry of 100 molecules: alchemi_lit's batched workflow
against ASE's ``Vibrations`` + ``IdealGasThermo``, one molecule at a time, same model.

Run (from the repository root)::

    python bench/bench_vibrations.py                    # EMT, 100 molecules
    python bench/bench_vibrations.py --model sevennet   # SevenNet-0 (plugin vs its ASE calculator)
    python bench/bench_vibrations.py --quick            # smoke run: 5 molecules, seconds
    python bench/bench_vibrations.py --nfree 4 --repeats 3

Workload: the molecules of ASE's g2 set made of H, C, N and O (EMT's extra elements;
81 of them), cycled with a seeded 0.02 Å rattle to ``--molecules``, relaxed with the
model (alchemi_lit's FIRE to 1e-3 eV/Å) before anything is timed: the same geometry in
both engines.  Symmetry numbers come from pymatgen once, before anything is timed, and
are given to both engines.  Per molecule: ASE's central differences
(``--delta``, ``--nfree``) of every atom, the frequencies, and G, H, S at 298.15 K and
1 bar through ``IdealGasThermo`` (imaginary true modes ignored, as
``ignore_imag_modes=True``: EMT molecules are rarely minima).

Engines: alchemi_lit (``workflows.vibrations``: every displaced geometry of every
molecule in one batched run, float64); ASE (``ase.vibrations.Vibrations`` with the
model's ASE calculator, its cache in a temporary folder, then ``IdealGasThermo``).
Measured: wall time, model calls (alchemi_lit's forward calls; the calculator's
``calculate`` calls), atoms through the model, and the agreement of the frequencies
(real modes above 50 cm^-1) and of G, the latter over the molecules whose true
vibrations (the highest 3N-6, 3N-5 linear) are all real and above 50 cm^-1: where EMT
leaves a saddle, ``IdealGasThermo`` picks near-zero rotations as "vibrations", whose
``kT ln(kT / h nu)`` entropy makes G hang on round-off (0.8 eV between two Hessians
that agree to 1e-9 eV).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment_line, format_table, gate_arguments, gate_from, setup_threads

T, P = 298.15, 1e5


def workload(n: int) -> list[Any]:
    """``n`` molecules: g2's H/C/N/O ones (two or more atoms), cycled, later copies
    rattled by 0.02 Å (seeded)."""
    from ase.collections import g2

    names = [m for m in g2.names
             if set(g2[m].get_chemical_symbols()) <= set("HCNO") and len(g2[m]) >= 2]  # fmt: skip
    out = []
    for k in range(n):
        atoms = g2[names[k % len(names)]]
        if k >= len(names):
            atoms.rattle(0.02, seed=k)
        atoms.info = {"name": names[k % len(names)]}
        out.append(atoms)
    return out


def relaxed(mols: list[Any], model: Any) -> list[Any]:
    """``mols`` relaxed by alchemi_lit (FIRE to 1e-3 eV/Å, float64), as new Atoms."""
    from ase import Atoms

    import alchemi_lit as al
    from alchemi_lit.integrators import FIRE

    out = al.Simulator(model, FIRE(fmax=1e-3, max_steps=3000), precision="64").run(mols)
    return [Atoms(a.numbers, positions=a.positions, info=dict(m.info)) for a, m in zip(out, mols)]


def well_conditioned(freqs: np.ndarray, atoms: Any) -> bool:
    """The true vibrations (IdealGasThermo's selection) all real and above 50 cm^-1."""
    from alchemi_lit.workflows.vibration_setup import is_linear

    keep = 3 * len(atoms) - (5 if is_linear(atoms) else 6)
    ordered = sorted(freqs, key=lambda f: (f**2).real)[-keep:]
    return all(abs(f.imag) == 0 and f.real > 50.0 for f in ordered)


def make_model(name: str) -> Any:
    if name == "emt":
        from alchemi_lit.models import EMT

        return EMT()
    from alchemi_lit_sevenn import SevenNet

    return SevenNet("sevennet-0")


def ase_calculator(name: str) -> Any:
    if name == "emt":
        from ase.calculators.emt import EMT

        return EMT()
    from sevenn.calculator import SevenNetCalculator

    return SevenNetCalculator("7net-0", device="cpu")


def run_alchemi(mols: list[Any], sigmas: list[int], a: Any) -> dict[str, Any]:
    from alchemi_lit import workflows

    model = make_model(a.model)
    t0 = time.perf_counter()
    res = workflows.vibrations(
        mols, model, delta=a.delta, nfree=a.nfree, symmetry_number=sigmas, temperatures=[T],
        pressures=[P], ignore_imaginary=True, force_warning=np.inf, precision="64",
    )  # fmt: skip
    wall = time.perf_counter() - t0
    g = res.thermo().set_index("material")["gibbs_energy_eV"].to_numpy()
    return {
        "wall": wall, "calls": int(res.jobs.results.stats["forward_calls"]),
        "atoms": sum(len(j.atoms) for j in res.jobs.jobs),
        "frequencies": [res.frequencies(i) for i in range(len(mols))], "G": g,
    }  # fmt: skip


def run_ase(mols: list[Any], sigmas: list[int], a: Any) -> dict[str, Any]:
    from ase.thermochemistry import IdealGasThermo
    from ase.units import Pascal
    from ase.vibrations import Vibrations

    from alchemi_lit.workflows.vibration_setup import is_linear

    calls = {"n": 0, "atoms": 0}
    freqs, gs = [], []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for i, mol in enumerate(mols):
            atoms = mol.copy()
            calc = ase_calculator(a.model)
            inner = calc.calculate

            def calculate(*args: Any, _inner: Any = inner, _n: int = len(atoms), **kw: Any) -> Any:
                calls["n"] += 1
                calls["atoms"] += _n
                return _inner(*args, **kw)

            calc.calculate = calculate
            atoms.calc = calc
            vib = Vibrations(atoms, name=f"{tmp}/v{i}", delta=a.delta, nfree=a.nfree)
            vib.run()
            freqs.append(vib.get_frequencies())
            thermo = IdealGasThermo(
                vib.get_energies(), "linear" if is_linear(atoms) else "nonlinear",
                atoms.get_potential_energy(), atoms, symmetrynumber=sigmas[i], spin=0,
                ignore_imag_modes=True,
            )  # fmt: skip
            gs.append(thermo.get_gibbs_energy(T, P * Pascal, verbose=False))
    wall = time.perf_counter() - t0
    return {"wall": wall, "calls": calls["n"], "atoms": calls["atoms"], "frequencies": freqs,
            "G": np.asarray(gs)}  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=["emt", "sevennet"], default="emt")
    p.add_argument("--molecules", type=int, default=100)
    p.add_argument("--delta", type=float, default=0.01)
    p.add_argument("--nfree", type=int, choices=[2, 4], default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=None, help="interleaved runs (default 3)")
    p.add_argument("--quick", action="store_true", help="smoke run: 5 molecules")
    gate_arguments(p)
    a = p.parse_args()
    if a.quick:
        a.molecules, a.no_wait = 5, True
    a.repeats = a.repeats or (1 if a.quick else 3)
    setup_threads(a.threads)
    import warnings

    from loguru import logger

    from alchemi_lit.workflows.vibration_setup import symmetry_number

    logger.remove()  # the workflow's INFO lines would be timed too
    warnings.filterwarnings("ignore", message=".*imag modes removed")
    gate = gate_from(a)
    print(environment_line())
    if a.quick:
        print("# SMOKE RUN (--quick): checks that both engines run; its timings mean nothing")
    mols = relaxed(workload(a.molecules), make_model(a.model))
    sigmas = [symmetry_number(m) for m in mols]
    runs: dict[str, list[dict[str, Any]]] = {"alchemi_lit": [], "ASE": []}
    for _ in range(a.repeats):
        for name, fn in (("alchemi_lit", run_alchemi), ("ASE", run_ase)):
            gate.wait(name)
            runs[name].append(fn(mols, sigmas, a))
    ours, theirs = runs["alchemi_lit"][0], runs["ASE"][0]
    df = max(
        float(np.abs(f - g)[np.abs(g) > 50].max(initial=0.0))
        for f, g in zip(ours["frequencies"], theirs["frequencies"])
    )
    good = [i for i, m in enumerate(mols) if well_conditioned(theirs["frequencies"][i], m)]
    dg = float(np.max(np.abs(ours["G"][good] - theirs["G"][good]), initial=0.0))
    ase_wall = float(np.median([r["wall"] for r in runs["ASE"]]))
    rows = []
    for name, rs in runs.items():
        wall = float(np.median([r["wall"] for r in rs]))
        rows.append([name, f"{wall:.3f}", rs[0]["calls"], rs[0]["atoms"],
                     f"{ase_wall / wall:.1f}x"])  # fmt: skip
    title = (f"vibrations + thermochemistry of {a.molecules} molecules, {a.model}, "
             f"nfree={a.nfree}, median of {a.repeats}")  # fmt: skip
    print(format_table(["engine", "wall s", "model calls", "atoms through model", "vs ASE"],
                       rows, title))  # fmt: skip
    print(f"# agreement: frequencies (real, > 50 cm^-1) to {df:.2g} cm^-1; G(298 K) to "
          f"{dg:.2g} eV over the {len(good)} molecules with every true vibration real")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
