"""Neighbour-list builds: why alchemi_lit builds its list with vesin.

Run (from the repository root; ~2-3 minutes on 2 CPU cores)::

    python bench/bench_neighbors.py

(``--device cpu|cuda`` compares the accelerator path's builders instead: the batched cell
list against one vesin-torch call per system, ``bench/device_neighbors.py``.)

Workloads (float64, half lists within radius 9.5 Å = the LJ benchmark's rc 8.5 Å +
1 Å skin): the LJ benchmark's batch (64 perturbed fcc argon crystals of 108 atoms,
15.8 Å cubic cells, so the radius exceeds half the cell) and a scaling series of
single periodic argon crystals (fcc a = 5.26 Å, noise 0.1 Å) of 500, 2 048, 10 976,
48 668 and 97 556 atoms.  Builders:

* ``alchemi_lit``: :class:`alchemi_lit.models.NeighborList` from scratch (``reset()``
  then a call): pairs from vesin, or, for periodic cells narrower than twice the
  radius, from its vectorised all-pairs path (vesin's pairs to the bit: checked here
  on the LJ batch), canonical order, reduction aids and the edge vectors;
* ``vesin``: ``vesin.NeighborList(full_list=False, n_threads=1).compute(..., "ijS")``,
  one call per system;
* ``ASE``: ``ase.neighborlist.neighbor_list("ijS")`` (a full list; pairs = rows / 2);
* ``matscipy``: ``matscipy.neighbours.neighbour_list("ijS")`` (full list), if installed;
* ``nvalchemi-ops``: ``nvalchemiops.torch.neighbors.neighbor_list`` (``half_fill``,
  matrix format, method picked by nvalchemi) in the nvalchemi venv through
  ``_nvalchemi_worker.py``, if ``bash bench/setup_peers.sh`` made it;
* ``torch brute force``: all pairs over every needed periodic image, vectorised per
  image (a reference, small systems only).

Every builder's pair count is checked against vesin's before its timings are used.
Reported: pairs, median ms per build (first call not timed; repeats within a time
budget), µs per atom (flat = linear scaling) and speed relative to alchemi_lit.  Slow
combinations are skipped at large sizes, and the output says which.  The machine is
shared: the script waits for a quiet machine before each workload (``--max-wait``)
and prints the load; compare ratios within one run.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
from collections.abc import Callable

import numpy as np
import torch
from _nvalchemi_worker import call_worker
from common import (
    ARGON_A,
    argon_set,
    environment_line,
    format_table,
    gate_arguments,
    gate_from,
    median,
    package_version,
    setup_threads,
)

from alchemi_lit import Batch
from alchemi_lit.models import NeighborList

CUTOFF, SKIN = 8.5, 1.0
RADIUS = CUTOFF + SKIN
SIZES = (5, 8, 14, 23, 29)  # fcc repeats: 500, 2 048, 10 976, 48 668, 97 556 atoms
ASE_MAX_ATOMS = 11_000  # ASE: ~0.35 ms per atom here, so ~35 s per build at 100k atoms
BRUTE_MAX_ATOMS = 600  # the all-pairs reference is quadratic (~1 s per build at 500 atoms)


def workloads() -> list[tuple[str, list]]:
    """(label, list of ase.Atoms) per case: the LJ batch, then single crystals."""
    from ase.build import bulk

    cases = [("64 x 108 Ar (LJ batch)", argon_set(64))]
    rng = np.random.default_rng(1)
    for rep in SIZES:
        atoms = bulk("Ar", "fcc", a=ARGON_A, cubic=True).repeat(rep)
        atoms.positions += rng.normal(scale=0.1, size=atoms.positions.shape)
        cases.append((f"{len(atoms)} Ar", [atoms]))
    return cases


def timed(fn: Callable[[], object], budget: float, max_repeats: int) -> tuple[float, int]:
    """(median seconds, runs) of ``fn`` (already called once, untimed, by the caller);
    repeats stop at ``max_repeats`` or once they have taken ``budget`` s (one run at
    least)."""
    walls: list[float] = []
    while not walls or (len(walls) < max_repeats and sum(walls) < budget):
        t0 = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t0)
    return median(walls), len(walls)


# --------------------------------------------------------------------------- builders
def build_alchemi(atoms: list) -> tuple[Callable[[], object], Callable[[], int]]:
    batch = Batch.from_atoms(atoms, dtype=torch.float64)
    nl = NeighborList(CUTOFF, SKIN)

    def build() -> object:
        nl.reset()
        return nl(batch)

    return build, lambda: len(build().i)


def build_vesin(atoms: list) -> tuple[Callable[[], object], Callable[[], int]]:
    import vesin

    calc = vesin.NeighborList(cutoff=RADIUS, full_list=False, n_threads=1)
    args = [(a.positions, a.cell.array, a.pbc) for a in atoms]

    def build() -> list:
        return [calc.compute(p, c, pbc, "ijS") for p, c, pbc in args]

    return build, lambda: sum(len(x[0]) for x in build())


def build_ase(atoms: list) -> tuple[Callable[[], object], Callable[[], int]]:
    from ase.neighborlist import neighbor_list

    def build() -> list:
        return [neighbor_list("ijS", a, RADIUS) for a in atoms]

    return build, lambda: sum(len(x[0]) for x in build()) // 2


def build_matscipy(atoms: list) -> tuple[Callable[[], object], Callable[[], int]]:
    from matscipy.neighbours import neighbour_list

    def build() -> list:
        return [neighbour_list("ijS", a, RADIUS) for a in atoms]

    return build, lambda: sum(len(x[0]) for x in build()) // 2


def brute_force_half(pos: torch.Tensor, cell: torch.Tensor, pbc: list[bool], radius: float):
    """Half list (i, j, S) by testing every pair against every periodic image that can
    reach within ``radius``: (i < j) at S = 0, all (i, j) at each S > 0 (lexicographic),
    none at S < 0 -- each unordered pair (i, j, S) ~ (j, i, -S) once.  All images in
    one tensor ``[S, n, n, 3]``."""
    inv = torch.linalg.inv(cell)
    frac = pos @ inv
    spread = frac.max(0).values - frac.min(0).values
    reach = radius * inv.norm(dim=0) + spread  # |shift| needed per axis (planes spacing)
    nmax = [math.floor(float(r)) if p else 0 for r, p in zip(reach, pbc)]
    shifts = [
        s
        for s in itertools.product(*(range(-m, m + 1) for m in nmax))
        if s >= (0, 0, 0)  # the zero shift, then the positive half
    ]
    assert shifts[0] == (0, 0, 0)
    ishift = torch.tensor(shifts)
    n = len(pos)
    d = pos.unsqueeze(0) - pos.unsqueeze(1)  # d[i, j] = r_j - r_i
    d = d.unsqueeze(0) + (ishift.to(pos.dtype) @ cell)[:, None, None, :]
    mask = (d * d).sum(-1) <= radius * radius
    mask[0] &= torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)  # S = 0: i < j
    s, i, j = mask.nonzero(as_tuple=True)
    return i, j, ishift[s]


def build_brute(atoms: list) -> tuple[Callable[[], object], Callable[[], int]]:
    args = [
        (torch.from_numpy(a.positions), torch.from_numpy(a.cell.array.copy()), list(a.pbc))
        for a in atoms
    ]

    def build() -> list:
        return [brute_force_half(p, c, pbc, RADIUS) for p, c, pbc in args]

    return build, lambda: sum(len(x[0]) for x in build())


def same_edges_as_vesin(atoms: list) -> int:
    """Systems whose alchemi_lit edges (i, j, integer shift, canonical order) equal
    vesin's exactly; raises on the first that differs."""
    import vesin

    from alchemi_lit.models.pair_search import build_rows as _build_rows
    from alchemi_lit.models.pair_search import canonical_order as _canonical_order
    from alchemi_lit.models.small_cells import small_cell_plan as _small_cell_plan

    batch = Batch.from_atoms(atoms, dtype=torch.float64)
    rows = list(range(batch.num_systems))
    i, j, _cart, system, ishift = _build_rows(batch, rows, RADIUS)
    plan = _small_cell_plan(
        batch.positions.numpy(),
        batch.cell.numpy(),
        batch.pbc.numpy(),
        batch.ptr.tolist(),
        rows,
        RADIUS,
    )
    calc = vesin.NeighborList(cutoff=RADIUS, full_list=False, n_threads=1)
    ptr = batch.ptr.tolist()
    for b, a in enumerate(atoms):
        vi, vj, vs = (
            torch.from_numpy(x.astype(np.int64))
            for x in calc.compute(a.positions, a.cell.array, a.pbc, "ijS")
        )
        order = _canonical_order(vi, vj, vs, len(a))
        sel = system == b
        got = (i[sel] - ptr[b], j[sel] - ptr[b], ishift[sel])
        if not all(torch.equal(x, y[order]) for x, y in zip(got, (vi, vj, vs))):
            raise AssertionError(f"system {b}: alchemi_lit edges differ from vesin's")
    return sum(1 for x in plan if x)


# --------------------------------------------------------------------------- nvalchemi
def run_nvalchemi(cases: list[tuple[str, list]], threads: int, max_neighbors: list[int]):
    """One worker run over all cases: ({label: (seconds, runs, pairs, method)}, notes)."""
    arrays: dict[str, np.ndarray] = {}
    params_cases = []
    for k, ((label, atoms), width) in enumerate(zip(cases, max_neighbors)):
        arrays[f"{k}_positions"] = np.concatenate([a.positions for a in atoms])
        arrays[f"{k}_cells"] = np.stack([a.cell.array for a in atoms])
        arrays[f"{k}_pbc"] = np.stack([a.pbc for a in atoms])
        arrays[f"{k}_ptr"] = np.cumsum([0] + [len(a) for a in atoms])
        params_cases.append(
            {"name": label, "radius": RADIUS, "repeats": 7, "budget_s": 2.0, "max_neighbors": width}
        )
    params = {"task": "neighbors", "threads": threads, "cases": params_cases}
    res, why = call_worker(arrays, params, timeout=600)
    if res is None:
        return {}, [f"nvalchemi-toolkit-ops: {why}"]
    out = {}
    notes = []
    for case in res["cases"]:
        if "error" in case:
            notes.append(f"nvalchemi-ops on {case['name']}: failed: {case['error']}")
            continue
        out[case["name"]] = (
            median(case["walls"]),
            len(case["walls"]),
            case["pairs"],
            case["method"],
        )
    v = res["versions"]
    notes.append(
        f"nvalchemi-toolkit-ops {v.get('nvalchemi-toolkit-ops')} (warp {v.get('warp-lang')}, "
        f"torch {v.get('torch')}) in its venv: half list in its matrix format, width = the "
        "largest full-list row (it sizes the matrix); first call per case not timed "
        "(Warp compiles on first use)"
    )
    return out, notes


# --------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--budget", type=float, default=1.5, help="timed seconds per builder and case")
    p.add_argument("--max-repeats", type=int, default=9)
    p.add_argument(
        "--skip", nargs="*", default=[], choices=["ase", "matscipy", "nvalchemi", "brute"]
    )
    p.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        help="compare the accelerator path's builders on this device instead "
        "(per-system vesin-torch vs the batched cell list; see device_neighbors.py)",
    )
    p.add_argument("--quick", action="store_true", help="with --device: a smoke run")
    p.add_argument(
        "--per-system-max",
        type=int,
        default=1_024,
        help="with --device: time the per-system builder up to this many systems",
    )
    gate_arguments(p)
    p.set_defaults(max_wait=120.0)
    args = p.parse_args(argv)
    setup_threads(args.threads)
    if args.device is not None:
        from device_neighbors import main as device_main

        return device_main(args)
    gate = gate_from(args)
    t_start = time.perf_counter()
    print(
        f"# neighbour-list builds, half list within {RADIUS} Å (rc {CUTOFF} + skin {SKIN}), float64"
    )
    print(f"# {environment_line()}; matscipy {package_version('matscipy') or 'not installed'}")

    cases = workloads()
    builders: list[tuple[str, Callable]] = [("alchemi_lit", build_alchemi), ("vesin", build_vesin)]
    if "ase" not in args.skip:
        builders.append(("ASE", build_ase))
    if "matscipy" not in args.skip:
        try:
            import matscipy.neighbours  # noqa: F401
        except ImportError:
            print("# matscipy: not installed (pip install matscipy), skipped")
        else:
            builders.append(("matscipy", build_matscipy))
    if "brute" not in args.skip:
        builders.append(("torch brute force", build_brute))

    results: dict[str, dict[str, tuple[float, int, int]]] = {}
    vesin_pairs: dict[str, int] = {}
    widths: list[int] = []
    skipped: list[str] = []
    checks: list[str] = []
    for label, atoms in cases:
        n_atoms = sum(len(a) for a in atoms)
        biggest = max(len(a) for a in atoms)
        gate.wait(label)
        results[label] = {}
        for name, make in builders:
            if name == "ASE" and biggest > ASE_MAX_ATOMS:
                skipped.append(f"ASE on {label} (~{0.35e-3 * n_atoms:.0f} s per build)")
                continue
            if name == "torch brute force" and biggest > BRUTE_MAX_ATOMS:
                skipped.append(f"torch brute force on {label} (quadratic)")
                continue
            build, count = make(atoms)
            pairs = count()  # also the untimed first call
            if name == "vesin":
                vesin_pairs[label] = pairs
                widths.append(_full_row_max(atoms))
            ref = vesin_pairs.get(label)
            if ref is not None and pairs != ref:
                print(f"!! {name} on {label}: {pairs} pairs, vesin {ref}: not timed")
                results[label][name] = (float("nan"), 0, pairs)
                continue
            slow = name == "ASE" and n_atoms > 5_000  # seconds per build: one timed run
            t, runs = timed(build, 0.0 if slow else args.budget, args.max_repeats)
            results[label][name] = (t, runs, pairs)
            print(f"  {label:<24} {name:<18} {t * 1e3:9.1f} ms  ({runs} runs)", flush=True)
        assert results[label]["alchemi_lit"][2] == vesin_pairs[label], "alchemi_lit pairs != vesin"
        if len(atoms) > 1:
            small = same_edges_as_vesin(atoms)
            checks.append(
                f"{label}: alchemi_lit's edges equal vesin's exactly (i, j, shift, order) in "
                f"all {len(atoms)} systems, {small} of them built by its all-pairs path"
            )

    notes: list[str] = []
    if "nvalchemi" not in args.skip:
        gate.wait("nvalchemi-ops (all cases, in a subprocess)")
        nv, nv_notes = run_nvalchemi(cases, args.threads, widths)
        notes += nv_notes
        for label, (t, runs, pairs, method) in nv.items():
            ok = pairs == vesin_pairs[label]
            if not ok:
                notes.append(
                    f"nvalchemi-ops on {label}: {pairs} pairs != vesin {vesin_pairs[label]}"
                )
            results[label][f"nvalchemi-ops ({method})"] = (t if ok else float("nan"), runs, pairs)

    rows = []
    for label, atoms in cases:
        n_atoms = sum(len(a) for a in atoms)
        t_ours = results[label]["alchemi_lit"][0]
        for name, (t, runs, pairs) in results[label].items():
            rows.append(
                (
                    label,
                    name,
                    f"{pairs:,}",
                    f"{t * 1e3:.1f}",
                    f"{t / n_atoms * 1e6:.2f}",
                    f"{t_ours / t:.2f}x" if t == t else "-",
                    runs,
                )
            )
    print()
    print(
        format_table(
            ["workload", "builder", "pairs", "ms/build", "µs/atom", "speed vs alchemi_lit", "runs"],
            rows,
        )
    )
    print()
    print(
        "* pairs: every builder's count equals vesin's (checked before timing; "
        "full lists counted as rows / 2)"
    )
    for note in checks + notes:
        print(f"* {note}")
    for s in skipped:
        print(f"* skipped: {s}")
    print(
        f"* threads: alchemi_lit's torch ops use {args.threads} (vesin-built systems of a batch "
        "may be split over a second Python thread); vesin, ASE and matscipy run on one; "
        "nvalchemi-ops' Warp CPU kernels as nvalchemi runs them"
    )
    print(f"* {gate.status_line()}")
    print(f"* total {time.perf_counter() - t_start:.0f} s")
    return 0


def _full_row_max(atoms: list) -> int:
    """Largest full-list row (neighbours of one atom), rounded up to 16: the matrix
    width nvalchemi-ops is given."""
    import vesin

    calc = vesin.NeighborList(cutoff=RADIUS, full_list=True, n_threads=1)
    widest = 0
    for a in atoms:
        i = calc.compute(a.positions, a.cell.array, a.pbc, "i")[0]
        widest = max(widest, int(np.bincount(i.astype(np.int64), minlength=len(a)).max()))
    return 16 * math.ceil(widest / 16)


if __name__ == "__main__":
    sys.exit(main())
