"""Elastic tensors and phonons of 20 materials: alchemi_lit's batched workflows vs an ASE
calculator with phonopy, one material at a time (and matcalc, where it is installed).

Run (from the repository root)::

    python bench/bench_properties.py                    # EMT, 20 materials
    python bench/bench_properties.py --model sevennet   # SevenNet-0 (its plugin), float32
    python bench/bench_properties.py --quick            # smoke run: 3 materials, small cells
    python bench/bench_properties.py --json out.json
    python bench/bench_properties.py --repeats 1        # one run per engine (default 3)
    python bench/bench_properties.py --device cuda --model sevennet  # on a GPU (issue #28)
    bash bench/setup_matcalc.sh && /tmp/alchemi_bench_venvs/matcalc/bin/python \
        bench/bench_properties.py                       # with matcalc's rows (its own venv)

Workload: 20 crystals EMT covers (the seven fcc metals, L1_2, L1_0 and B2 alloys),
relaxed (cell and atoms) with alchemi_lit before anything is timed.  Elastic: the six
Voigt strains at ±0.5 % and ±1 %, atoms relaxed in each strained cell with FIRE to
``--fmax`` (24 strained cells per material).  Phonons: phonopy's displacements
(0.01 Å) in supercells at least twice the model's cutoff thick (``--supercell``), force
constants, a ``--mesh``, the DOS and the free energy at 300 K (no band path: the same
phonopy work in alchemi_lit and ASE; matcalc does its own).

Engines: alchemi_lit (``workflows.elastic`` and ``workflows.phonons``: every strained
cell / displaced supercell of every material in one batched run, within
``--max-atoms``); ASE (the model's ASE calculator, ``ase.optimize.FIRE``, phonopy),
one material after the other; matcalc (``ElasticityCalc``, ``PhononCalc``) when
importable.  alchemi_lit runs in this process after the relaxation, as a user's
script would; the others each in a fresh process (an alchemi_lit run changes its
process's glibc heap thresholds, alchemi_lit.core.heap); ``--repeats`` runs of each,
interleaved, the median reported.
Measured: wall time, the time inside the model (the ASE calculator's ``calculate``;
alchemi_lit's run), model calls (forward calls of the
batched run; calculator calls), and the agreement of C_ij and of the free energy.
phonopy's own set-up (symmetry of each supercell) is paid by every engine alike and
dominates phonons with a cheap model: hence the model-time column.

``--device cuda``: alchemi_lit's relaxation and workflows run with
``accelerator="cuda"`` and SevenNet's ASE calculator on the same GPU (ASE's EMT is numpy:
it stays on the CPU); the device is synchronised around every timed section, and each
fresh ASE / matcalc process makes one untimed calculator call first (CUDA context and
first kernels, which alchemi_lit's process paid in the relaxation).  phonopy's work stays
on the CPU: alchemi_lit's in ``workers="auto"`` processes (one per usable core, at most
one per material), the others in their own process.  ``scripts/gpu_properties.sh``
runs it on a GPU machine without network.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np
from common import environment_line, format_table, gate_arguments, gate_from, setup_threads

STRAINS = (-0.01, -0.005, 0.005, 0.01)
VOIGT = ((0, 0), (1, 1), (2, 2), (1, 2), (0, 2), (0, 1))


def workload(n: int, model: Any, device: str = "cpu") -> list[Any]:
    """``n`` of the 20 crystals, relaxed with ``model`` (LBFGS with a Frechet cell filter)."""
    from ase import Atoms
    from ase.build import bulk

    import alchemi_lit as al
    from alchemi_lit.integrators import LBFGS, CellFilter

    fcc = {"Al": 4.05, "Ni": 3.52, "Cu": 3.61, "Pd": 3.89, "Ag": 4.09, "Pt": 3.92, "Au": 4.08}
    out = [bulk(e, "fcc", a=a) for e, a in fcc.items()]
    l12 = [("Au", "Cu"), ("Al", "Ni"), ("Al", "Pt"), ("Pt", "Ni"), ("Ag", "Pd"), ("Au", "Ag")]
    for b, a_ in l12:  # A3B: B at the corner, A on the faces
        a = (3 * fcc[a_] + fcc[b]) / 4  # Vegard's law
        out.append(Atoms(f"{b}{a_}3", cell=[a, a, a], pbc=True, scaled_positions=[
            [0, 0, 0], [0, 0.5, 0.5], [0.5, 0, 0.5], [0.5, 0.5, 0]]))  # fmt: skip
    for x, y in (("Cu", "Au"), ("Ni", "Pt"), ("Pd", "Ag"), ("Cu", "Pt")):  # L1_0 AB
        a = (fcc[x] + fcc[y]) / 2
        out.append(Atoms(f"{x}{y}", cell=[a / 2**0.5, a / 2**0.5, a], pbc=True,
                         scaled_positions=[[0, 0, 0], [0.5, 0.5, 0.5]]))  # fmt: skip
    for x, y in (("Ni", "Al"), ("Cu", "Pd"), ("Ag", "Au")):  # B2
        a = (fcc[x] + fcc[y]) / 2 / 2 ** (1 / 3)  # the fcc volume per atom
        out.append(Atoms(f"{x}{y}", cell=[a, a, a], pbc=True,
                         scaled_positions=[[0, 0, 0], [0.5, 0.5, 0.5]]))  # fmt: skip
    relax = LBFGS(fmax=1e-4, max_steps=1000, cell=CellFilter())
    relaxed = al.Simulator(model, relax, precision="64", accelerator=device).run(out[:n])
    return [Atoms(a.numbers, a.positions, cell=a.cell, pbc=True) for a in relaxed]


def make_model(name: str) -> Any:
    if name == "emt":
        from alchemi_lit.models import EMT

        return EMT()
    from alchemi_lit_sevenn import SevenNet

    return SevenNet("sevennet-0")


def ase_calculator(name: str, device: str = "cpu") -> Any:
    """The model's ASE calculator; SevenNet's on ``device``, ASE's EMT (numpy) on the CPU."""
    if name == "emt":
        from ase.calculators.emt import EMT

        return EMT()
    from sevenn.calculator import SevenNetCalculator

    return SevenNetCalculator("7net-0", device=device)


def sync(device: str) -> None:
    """Wait for the GPU's queued work (around timed sections); nothing on the CPU."""
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def describe_device(device: str) -> str:
    """``cpu``, or ``cuda (<GPU name>, <memory> GiB, CUDA <version>)``."""
    if device != "cuda":
        return device
    import torch

    props = torch.cuda.get_device_properties(0)
    return (f"cuda ({torch.cuda.get_device_name(0)}, {props.total_memory / 2**30:.0f} GiB, "
            f"CUDA {torch.version.cuda})")  # fmt: skip


def warm_up(calc: Any, atoms: Any, device: str) -> None:
    """On a GPU, one untimed calculator call in a fresh process: the CUDA context and the
    first kernels (alchemi_lit's process has paid them in the relaxation)."""
    if device != "cuda":
        return
    s = atoms.copy()
    s.calc = calc
    s.get_forces()
    s.get_stress()
    sync(device)


class Counted:
    """Counts and times ``calculate`` of one calculator instance."""

    def __init__(self, calc: Any) -> None:
        self.calc, self.calls, self.seconds = calc, 0, 0.0
        inner = calc.calculate

        def calculate(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.calls += 1
                self.seconds += time.perf_counter() - t0

        calc.calculate = calculate


def run_alchemi(mats: list[Any], a: Any) -> dict[str, Any]:
    from alchemi_lit import workflows
    from alchemi_lit.integrators import FIRE

    model, precision = make_model(a.model), "64" if a.model == "emt" else "32"
    out: dict[str, Any] = {}
    sync(a.device)
    t0 = time.perf_counter()
    el = workflows.elastic(mats, model, strains=STRAINS, relax=FIRE(fmax=a.fmax, max_steps=1000),
                           max_atoms=a.max_atoms, precision=precision,
                           accelerator=a.device)  # fmt: skip
    sync(a.device)
    out["elastic"] = _row(el, time.perf_counter() - t0)
    out["elastic"]["C"] = [el.elastic_tensor(i).tolist() for i in range(len(mats))]
    t0 = time.perf_counter()
    ph = workflows.phonons(mats, model, supercell=a.supercell, min_width=a.min_width,
                           mesh=a.mesh, band_path=None, max_atoms=a.max_atoms,
                           precision=precision, accelerator=a.device)  # fmt: skip
    sync(a.device)
    out["phonons"] = _row(ph, time.perf_counter() - t0)
    out["phonons"]["workers"] = ph.settings["workers"]
    out["phonons"]["F300"] = ph.to_pandas()["free_energy_300K"].tolist()
    out["phonons"]["supercells"] = ph.settings["supercell"]
    return out


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per work, the run of median wall time (its model time, calls and results), with
    every run's wall time beside it."""
    out: dict[str, Any] = {}
    for work in runs[0]:
        ordered = sorted(runs, key=lambda r: r[work]["wall_s"])
        out[work] = {**ordered[(len(ordered) - 1) // 2][work],
                     "walls": [r[work]["wall_s"] for r in runs]}  # fmt: skip
    return out


def _row(res: Any, wall: float) -> dict[str, Any]:
    stats = res.jobs.results.stats
    return {"wall_s": wall, "model_s": stats["wall_time_s"], "calls": stats["forward_calls"],
            "structures": len(res.jobs.jobs), "failed": len(res.failed)}  # fmt: skip


def run_ase(mats: list[Any], a: Any, supercells: list[Any]) -> dict[str, Any]:
    """One material after the other, as an ASE + phonopy user writes it."""
    from ase.optimize import FIRE
    from ase.units import GPa
    from phonopy import Phonopy
    from phonopy.structure.atoms import PhonopyAtoms

    device = "cpu" if a.model == "emt" else a.device  # ASE's EMT is numpy
    calc = ase_calculator(a.model, device)
    warm_up(calc, mats[0], device)
    counted = Counted(calc)
    out: dict[str, Any] = {"elastic": {"C": []}, "phonons": {"F300": []}}
    t0 = time.perf_counter()
    for atoms in mats:
        c = np.zeros((6, 6))
        for j, (p, q) in enumerate(VOIGT):
            sig = []
            for d in STRAINS:
                eps = np.zeros((3, 3))
                eps[p, q] = eps[q, p] = d if p == q else d / 2
                s = atoms.copy()
                s.set_cell(s.cell[:] @ (np.eye(3) + eps).T, scale_atoms=True)
                s.calc = counted.calc
                FIRE(s, logfile=None).run(fmax=a.fmax, steps=1000)
                sig.append(s.get_stress(voigt=True))
            c[:, j] = np.polyfit(STRAINS, np.array(sig), 1)[0]
        out["elastic"]["C"].append((0.5 * (c + c.T) / GPa).tolist())
    sync(device)
    out["elastic"].update(wall_s=time.perf_counter() - t0, model_s=counted.seconds,
                          calls=counted.calls, structures=24 * len(mats))  # fmt: skip
    counted.calls, counted.seconds, structures = 0, 0.0, 0
    t0 = time.perf_counter()
    for atoms, m in zip(mats, supercells):
        unit = PhonopyAtoms(symbols=atoms.get_chemical_symbols(), cell=atoms.cell[:],
                            scaled_positions=atoms.get_scaled_positions(),
                            masses=atoms.get_masses())  # fmt: skip
        ph = Phonopy(unit, supercell_matrix=m, primitive_matrix="auto")
        ph.generate_displacements(distance=0.01)
        forces = []
        for sc in ph.supercells_with_displacements:
            s = atoms.__class__(sc.symbols, cell=sc.cell, scaled_positions=sc.scaled_positions,
                                pbc=True)  # fmt: skip
            s.calc = counted.calc
            forces.append(s.get_forces())
            structures += 1
        ph.forces = forces
        ph.produce_force_constants()
        ph.run_mesh(a.mesh)
        ph.run_total_dos()  # as the workflow does
        ph.run_thermal_properties(temperatures=[300.0], exclude_gamma_acoustic=True)
        out["phonons"]["F300"].append(float(ph.thermal_properties.free_energy[0]) / 96.485332123)
    sync(device)
    out["phonons"].update(wall_s=time.perf_counter() - t0, model_s=counted.seconds,
                          calls=counted.calls, structures=structures)  # fmt: skip
    return out


def run_matcalc(mats: list[Any], a: Any, supercells: list[Any]) -> dict[str, Any]:
    """matcalc's ElasticityCalc and PhononCalc with the same calculator (its own choices
    of fit and thermal sums; compared for time, its numbers only roughly)."""
    from ase.units import GPa
    from matcalc import ElasticityCalc, PhononCalc
    from pymatgen.io.ase import AseAtomsAdaptor

    device = "cpu" if a.model == "emt" else a.device  # ASE's EMT is numpy
    model_calc = ase_calculator(a.model, device)
    warm_up(model_calc, mats[0], device)
    counted = Counted(model_calc)
    out: dict[str, Any] = {}
    calc = ElasticityCalc(counted.calc, norm_strains=STRAINS, shear_strains=STRAINS, fmax=a.fmax,
                          relax_structure=False, relax_deformed_structures=True)  # fmt: skip
    t0 = time.perf_counter()
    cs = [np.asarray(calc.calc(AseAtomsAdaptor.get_structure(m))["elastic_tensor"].voigt) / GPa
          for m in mats]  # fmt: skip
    sync(device)
    out["elastic"] = {
        "wall_s": time.perf_counter() - t0,
        "model_s": counted.seconds,
        "calls": counted.calls,
        "structures": None,
        "C": [c.tolist() for c in cs],
    }
    counted.calls, counted.seconds = 0, 0.0
    t0 = time.perf_counter()
    for m, sc in zip(mats, supercells):
        PhononCalc(counted.calc, atom_disp=0.01, supercell_matrix=sc, relax_structure=False,
                   write_phonon=False).calc(AseAtomsAdaptor.get_structure(m))  # fmt: skip
    sync(device)
    out["phonons"] = {
        "wall_s": time.perf_counter() - t0,
        "model_s": counted.seconds,
        "calls": counted.calls,
        "structures": None,
    }
    return out


def _in_fresh_process(fn_name: str, mats: list[Any], a: Any, supercells: Any) -> dict[str, Any]:
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_child, args=(fn_name, mats, vars(a), supercells, send))
    p.start()
    send.close()
    got = receive.recv()
    p.join()
    if isinstance(got, BaseException):
        raise got
    return got


def _child(fn_name: str, mats: list[Any], a: dict[str, Any], supercells: Any, send: Any) -> None:
    try:
        setup_threads(a["threads"])
        send.send(globals()[fn_name](mats, argparse.Namespace(**a), supercells))
    except BaseException as exc:
        send.send(exc)
    finally:
        send.close()


def main() -> int:
    started = time.perf_counter()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=["emt", "sevennet"], default="emt")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="alchemi_lit's accelerator and SevenNet's ASE calculator's device "
                        "(ASE's EMT is numpy: CPU); phonopy's work is on the CPU")  # fmt: skip
    p.add_argument("--materials", type=int, default=20)
    p.add_argument("--supercell", default="auto", help="'auto' (2 x cutoff thick) or an int")
    p.add_argument("--mesh", type=float, default=50.0, help="phonopy mesh length (Å)")
    p.add_argument("--fmax", type=float, default=0.01, help="ionic relaxation of strained cells")
    p.add_argument("--max-atoms", type=int, default=None,
                   help="alchemi_lit's batch budget (default: the workflows' own)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=None,
                   help="interleaved runs per engine, the median reported (default 3; --quick 1)")
    p.add_argument("--engines", nargs="+", default=["alchemi_lit", "ase", "matcalc"])
    p.add_argument("--quick", action="store_true", help="smoke run: 3 materials, small cells")
    p.add_argument("--deadline", type=float, default=None,
                   help="s since the start: begin no repeat that the slowest one so far "
                        "would carry past it (the medians of those done are reported)")  # fmt: skip
    p.add_argument("--json", default=None)
    gate_arguments(p)
    a = p.parse_args()
    a.min_width = None
    if a.quick:
        a.materials, a.supercell, a.min_width, a.mesh, a.no_wait = 3, 2, 0.0, 10.0, True
    a.supercell = a.supercell if a.supercell == "auto" else int(a.supercell)
    a.repeats = a.repeats or (1 if a.quick else 3)
    setup_threads(a.threads)
    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda, but torch sees no CUDA device (--device cpu runs on the CPU)")
    gate = gate_from(a)
    print(environment_line())
    device = describe_device(a.device)
    print(f"# device: {device}")
    if a.device == "cuda" and a.model == "emt":
        print("# --model emt on cuda: alchemi_lit's EMT on the GPU, ASE's EMT (numpy) on the CPU")
    if a.quick:
        print("# SMOKE RUN (--quick): checks that every engine runs; its timings mean nothing")
    mats = workload(a.materials, make_model(a.model), a.device)
    import importlib.util

    engines = [("alchemi_lit", "run_alchemi")]
    engines += [("ASE + phonopy", "run_ase")] if "ase" in a.engines else []
    if "matcalc" in a.engines and importlib.util.find_spec("matcalc") is None:
        print("# matcalc is not installed: its rows are left out (pip install matcalc)")
    elif "matcalc" in a.engines:
        engines.append(("matcalc", "run_matcalc"))
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in engines}
    supercells = None  # alchemi_lit's choice, the same in every engine
    rounds: list[float] = []
    for k in range(a.repeats):  # interleaved
        late = rounds and time.perf_counter() - started + max(rounds) > (a.deadline or np.inf)
        if late:
            print(f"# --deadline {a.deadline:g} s: stopped after {k} of {a.repeats} repeats")
            a.repeats = k
            break
        t_round = time.perf_counter()
        for name, fn in engines:
            gate.wait(name)
            if name == "alchemi_lit":  # here, after the relaxation, as a user's script runs
                runs[name].append(run_alchemi(mats, a))
            else:
                runs[name].append(_in_fresh_process(fn, mats, a, supercells))
            if supercells is None:
                supercells = runs[name][-1]["phonons"]["supercells"]
            if a.json:  # what is measured so far, should a time limit stop the rest
                with open(a.json, "w") as f:
                    json.dump({"args": vars(a), "device": device, "partial_runs": runs}, f,
                              indent=1)  # fmt: skip
        rounds.append(time.perf_counter() - t_round)
    results = {name: median_run(r) for name, r in runs.items()}
    rows = []
    for work in ("elastic", "phonons"):
        ase_wall = results.get("ASE + phonopy", {}).get(work, {}).get("wall_s")
        for engine, res in results.items():
            r = res[work]
            speedup = f"{ase_wall / r['wall_s']:.2f}x" if ase_wall else "-"
            structures = r["structures"] if r["structures"] is not None else "-"
            wall, model_s = f"{r['wall_s']:.2f}", f"{r['model_s']:.2f}"
            if len(r["walls"]) > 1:
                wall += " (" + " / ".join(f"{w:.2f}" for w in r["walls"]) + ")"
            rows.append([work, engine, wall, model_s, r["calls"], structures, speedup])
    print(f"# {len(mats)} materials, model {a.model}, supercell {a.supercell}, mesh {a.mesh}")
    print(format_table(["work", "engine", f"wall s (median of {a.repeats})", "model s",
                        "model calls", "structures", "vs ASE"], rows))  # fmt: skip
    ref = results.get("ASE + phonopy")
    if ref is not None:
        mine = results["alchemi_lit"]
        dc = np.abs(np.asarray(mine["elastic"]["C"]) - np.asarray(ref["elastic"]["C"])).max()
        df = np.abs(np.asarray(mine["phonons"]["F300"]) - np.asarray(ref["phonons"]["F300"])).max()
        print(
            f"# agreement with ASE + phonopy: max |dC_ij| {dc:.2e} GPa, max |dF(300 K)| {df:.2e} eV"
        )
    print(f"# {gate.status_line()}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "device": device, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
