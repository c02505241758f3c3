"""SevenNet-0 relaxation of 24 real crystals: alchemi_lit vs TorchSim 0.6 vs ASE (#17, #18).

Run (from the repository root; TorchSim needs its venv: ``bash bench/setup_torchsim.sh``)::

    python bench/bench_mlip_relax.py                 # positions only (#18), 3 repeats
    python bench/bench_mlip_relax.py --cell          # cell + positions, Frechet filter (#17)
    python bench/bench_mlip_relax.py --quick         # smoke run: 4 crystals, 1 repeat
    python bench/bench_mlip_relax.py --engines alchemi_lit ase --json out.json

Workload (``crystals.py``): Si, Ge, GaAs, NaCl, MgO, LiF, Cu, Al, Ni, bcc Fe, wurtzite
ZnO and rutile TiO2, each as its primitive cell and a 2x2x2 supercell (24 structures,
234 atoms), strained +-3 % with a shear of up to 1 % and rattled by 0.05 Å, seeded.
SevenNet-0 (weights from the sevenn wheel) in float32 in every engine (its network
only runs in float32; alchemi_lit and TorchSim keep positions in float32 too, ASE in
float64).  FIRE with ASE's parameters (dt 0.1, dtmax 1.0, maxstep 0.2) in every engine,
fmax 0.05 eV/Å, at most 500 steps; with ``--cell`` the Frechet cell filter and
convergence on atomic and cell forces (alchemi_lit: FIRE(cell=...) where this
alchemi_lit has it, else LBFGS -- the output says which).

Engines: alchemi_lit (one forward for every system in flight, systems refilled from a
``SizeAwareSampler`` within ``--max-atoms``, default the smallest budget that holds the
largest system and half the set's atoms); TorchSim 0.6 (``ts.optimize`` with its
``InFlightAutoBatcher`` within the same atom budget, which swaps systems every 5 steps;
sevenn's own TorchSim wrapper) in a Python 3.12 venv driven through
``_torchsim_worker.py``; ASE one structure after the other with sevenn's
``SevenNetCalculator``.  Before timing, the three engines' energies, forces and stress
on the initial structures are compared (they must agree to float32 round-off).

Measured per engine, median over ``--repeats`` runs interleaved engine by engine (the
order rotates each repeat; a warm-up run first): wall time, forward calls, atoms
through the network (counted on SevenNet's own ``AtomGraphSequential.forward`` in
every engine), atoms needed (sum of n_atoms x (s + 1), s the step at which the system
first met the criterion: the least any engine could evaluate), occupancy (mean atoms
per forward / the atom budget), steps per system, the wall time spent outside the
engine's model call (its framework), and the model call's time per atom through the
network (the same network in every engine: a difference there is the wrapper's or the
torch build's, not the framework's -- TorchSim's venv runs a CUDA build of torch 2.13 on
the CPU, see setup_torchsim.sh).  Then agreement of the final structures between
engines: energy per atom and, with ``--cell``, cell lengths.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np
from common import environment_line, format_table, gate_arguments, gate_from, median, setup_threads
from crystals import crystal_set, quick_set
from mlip_engines import AlchemiEngine, AseEngine, TorchSimEngine, cell_relax_stage

ENGINES = ("alchemi_lit", "torchsim", "ase")
#: float32 SevenNet in three wrappings: energies (eV/atom), forces (eV/Å), stress (eV/Å^3)
TOLERANCE = {"energy": 2e-5, "forces": 2e-4, "stress": 2e-5}


def build_engines(names: list[str], atoms: list[Any], threads: int) -> tuple[list[Any], list[str]]:
    engines, notes = [], []
    for name in names:
        try:
            if name == "alchemi_lit":
                engines.append(AlchemiEngine(atoms))
            elif name == "ase":
                engines.append(AseEngine(atoms))
            else:
                eng = TorchSimEngine(atoms, threads)
                engines.append(eng)
                v = eng.info["versions"]
                nl_note = ""
                if "nvalchemi-toolkit-ops" in v:
                    nl_note = (
                        f", nvalchemi-toolkit-ops {v['nvalchemi-toolkit-ops']} (neighbour list)"
                    )
                notes.append(
                    f"{eng.name} in {eng.info['python']} venv: torch {v['torch']} "
                    f"({eng.info['threads']} threads), sevenn {v['sevenn']}, numpy {v['numpy']}"
                    + nl_note
                )
        except Exception as exc:  # a missing peer is reported, not fatal
            notes.append(f"{name}: skipped -- {type(exc).__name__}: {str(exc).splitlines()[0]}")
    return engines, notes


def check_same_model(engines: list[Any], sizes: np.ndarray) -> list[str]:
    """Every engine's energy/forces/stress on the initial set against the first's."""
    ref_name, ref = engines[0].name, engines[0].evaluate()
    lines = []
    for eng in engines[1:]:
        got = eng.evaluate()
        de = np.abs(np.array(got["energy"]) - np.array(ref["energy"])) / sizes
        df = np.abs(np.array(got["forces"]) - np.array(ref["forces"]))
        ds = np.abs(np.array(got["stress"]) - np.array(ref["stress"]))
        errs = {"energy": de.max(), "forces": df.max(), "stress": ds.max()}
        line = (
            f"initial set, {eng.name} vs {ref_name}: max |dE| {errs['energy']:.1e} eV/atom, "
            f"|dF| {errs['forces']:.1e} eV/Å, |dstress| {errs['stress']:.1e} eV/Å^3"
        )
        bad = [k for k, v in errs.items() if not v <= TOLERANCE[k]]
        if bad:
            raise SystemExit(f"engines disagree before any step ({', '.join(bad)}): {line}")
        lines.append(line)
    return lines


def summarise(runs: list[dict[str, Any]], sizes: np.ndarray, budget: int | None) -> dict[str, Any]:
    """Medians over repeats of one engine's runs, and its counts (those of the last run:
    the counts of a deterministic engine do not change between repeats)."""
    last = runs[-1]
    walls = [r["wall"] for r in runs]
    steps = np.array(last["steps"])
    first = np.array(last["first_met"])
    needed = float((sizes * (np.where(first >= 0, first, steps) + 1)).sum())
    per_call = np.array(last["atoms_per_call"], dtype=float)
    return {
        "wall": median(walls),
        "walls": walls,
        "outside_model": median([(r["wall"] - r["model_s"]) / r["wall"] for r in runs]),
        "model_ms_per_atom": median([1e3 * r["model_s"] / r["atoms_through"] for r in runs]),
        "forward_calls": last["forward_calls"],
        "atoms_through": last["atoms_through"],
        "edges_through": last["edges_through"],
        "atoms_needed": needed,
        "occupancy": float(per_call.mean() / budget) if budget and len(per_call) else None,
        "steps": steps,
        "first_met": first,
        "converged": int(np.sum(last["converged"])),
        "energy": np.array(last["energy"]),
        "cells": np.array(last["cells"]),
        "counts_stable": all(r["atoms_through"] == last["atoms_through"] for r in runs),
    }


HEADERS = (
    "engine", "wall s", "range", "forward calls", "atoms through", "atoms needed",
    "through/needed", "occupancy", "steps mean/max", "outside model", "model ms/atom",
    "converged", "this / alchemi_lit time",
)  # fmt: skip


def table_row(name: str, s: dict[str, Any], summary: dict[str, Any], n: int) -> tuple:
    occ = "n/a (1 system/call)" if s["occupancy"] is None else f"{s['occupancy']:.0%}"
    ref = summary.get("alchemi_lit")
    return (
        name,
        f"{s['wall']:.2f}",
        f"{min(s['walls']):.2f}-{max(s['walls']):.2f}",
        s["forward_calls"],
        f"{s['atoms_through']:,}",
        f"{s['atoms_needed']:,.0f}",
        f"{s['atoms_through'] / s['atoms_needed']:.3f}",
        occ,
        f"{s['steps'].mean():.1f}/{s['steps'].max()}",
        f"{s['outside_model']:.1%}",
        f"{s['model_ms_per_atom']:.2f}",
        f"{s['converged']}/{n}",
        f"{s['wall'] / ref['wall']:.2f}x" if ref else "",
    )


def per_system_table(summary: dict[str, Any], atoms: list[Any]) -> tuple[list[str], list]:
    names = list(summary)
    ref = summary[names[0]]
    sizes = np.array([len(a) for a in atoms], dtype=float)
    rows = []
    for k, a in enumerate(atoms):
        row: list[Any] = [a.info["name"], len(a)]
        for name in names:
            s = summary[name]
            first, taken = int(s["first_met"][k]), int(s["steps"][k])
            extra = f" ({taken})" if taken > first else ""
            row.append(str(taken if first < 0 else first) + extra)
        for name in names[1:]:
            row.append(f"{(summary[name]['energy'][k] - ref['energy'][k]) / sizes[k]:+.1e}")
        rows.append(row)
    headers = ["system", "atoms", *(f"steps {n}" for n in names)]
    headers += [f"dE {n}" for n in names[1:]]
    return headers, rows


def agreement(a: dict[str, Any], b: dict[str, Any], sizes: np.ndarray, cell: bool) -> str:
    de = np.abs(a["energy"] - b["energy"]) / sizes
    text = f"max |dE| {de.max():.1e} eV/atom (system {int(de.argmax())})"
    if cell:
        la = np.linalg.norm(a["cells"], axis=-1)
        lb = np.linalg.norm(b["cells"], axis=-1)
        da = np.abs(la - lb).max(axis=-1)
        text += f", max |da| {da.max():.1e} Å (system {int(da.argmax())})"
    same = int(np.sum(a["first_met"] == b["first_met"]))
    return text + f", same step count for {same}/{len(sizes)} systems"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cell", action="store_true", help="relax cells too (Frechet filter, #17)")
    p.add_argument("--quick", action="store_true", help="smoke run: 4 crystals, 1 repeat, no wait")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--fmax", type=float, default=0.05)
    p.add_argument("--max-steps", type=int, default=500)
    p.add_argument("--max-atoms", type=int, default=None, help="atom budget of a batch")
    p.add_argument("--engines", nargs="*", choices=ENGINES, default=list(ENGINES))
    p.add_argument("--json", default=None, help="also write every run's numbers here")
    gate_arguments(p)
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.no_wait = 1, True

    setup_threads(args.threads)
    gate = gate_from(args)
    atoms = quick_set() if args.quick else crystal_set()
    sizes = np.array([len(a) for a in atoms], dtype=float)
    budget = args.max_atoms or int(max(sizes.max(), sizes.sum() // 2))
    task = "cell + positions" if args.cell else "positions only"
    stage_label = cell_relax_stage(args.fmax, 1)[1] if args.cell else "FIRE (ASE's)"
    print(f"# SevenNet-0 relax ({task}), fmax {args.fmax} eV/Å, <= {args.max_steps} steps")
    print(
        f"# {len(atoms)} crystals, {int(sizes.sum())} atoms, atom budget {budget}, float32 | "
        f"alchemi_lit: {stage_label} | {environment_line()}"
    )
    if args.quick:
        print("# SMOKE RUN (--quick): checks that every engine runs; its timings mean nothing")

    engines, notes = build_engines(args.engines, atoms, args.threads)
    if not engines:
        raise SystemExit("no engine could be built: " + "; ".join(notes))
    try:
        if len(engines) > 1:
            notes += check_same_model(engines, sizes)
        params = {"cell": args.cell, "fmax": args.fmax, "max_atoms": budget}
        for eng in engines:  # warm-up: imports, kernels, first-call allocations
            eng.relax(max_steps=3, systems=2, **params)
        runs: dict[str, list[dict[str, Any]]] = {e.name: [] for e in engines}
        for r in range(args.repeats):
            k = r % len(engines)
            for eng in engines[k:] + engines[:k]:
                gate.wait(eng.name)
                runs[eng.name].append(eng.relax(max_steps=args.max_steps, **params))
                print(
                    f"  repeat {r + 1}: {eng.name} {runs[eng.name][-1]['wall']:.2f} s", flush=True
                )
    finally:
        for eng in engines:
            getattr(eng, "close", lambda: None)()

    summary = {
        name: summarise(rs, sizes, None if name.startswith("ASE") else budget)
        for name, rs in runs.items()
    }
    fastest_peer = min((s["wall"] for n, s in summary.items() if n != "alchemi_lit"), default=None)
    print()
    print(format_table(HEADERS, [table_row(n, s, summary, len(atoms)) for n, s in summary.items()]))
    print()
    print("Per system: the step at which each engine first met the criterion (steps taken, where")
    print("more), and the final energy per atom against the first engine's (eV/atom):")
    print(format_table(*per_system_table(summary, atoms)))
    print()
    names = list(summary)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            notes.append(f"{a} vs {b}: {agreement(summary[a], summary[b], sizes, args.cell)}")
    if "alchemi_lit" in summary:
        al = summary["alchemi_lit"]
        ts = next((s for n, s in summary.items() if n.startswith("TorchSim")), None)
        ratio = al["atoms_through"] / al["atoms_needed"]
        notes.append(
            f"alchemi_lit atoms through / needed: {ratio:.3f} (target <= 1.05); outside the "
            f"model call: {al['outside_model']:.1%} (target <= 3 %)"
        )
        if ts is not None:
            notes.append(
                f"forward calls: alchemi_lit {al['forward_calls']}, TorchSim "
                f"{ts['forward_calls']} (target: fewer than TorchSim)"
            )
        if fastest_peer is not None:
            notes.append(
                f"fastest peer / alchemi_lit wall time: {fastest_peer / al['wall']:.2f}x "
                f"(targets: >= 1.0 for #17, >= 1.25 for #18)"
            )
    for name, s in summary.items():
        if not s["counts_stable"]:
            notes.append(f"{name}: atoms through the model changed between repeats")
    for note in notes:
        print(f"* {note}")
    print(f"* {gate.status_line()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "budget": budget, "runs": runs}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
