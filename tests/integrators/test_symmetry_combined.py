"""FixSymmetry with every other constraint kind (#43) against ASE, in float64.

The rule (core/symmetry_invariance.py): a constraint set goes with FixSymmetry when
every symmetry operation maps it onto itself.  Invariant examples of each kind on two
chiral EMT crystals with orbits free in x, y and z (P4: every operation keeps z, Cu and
Au; P4_2 1 2: in-plane 2-fold axes flip z) -- FixCartesian z / x+y on whole orbits,
FixedPlane and FixedLine along z (and -z), FixCom (polar, two masses), rigid bonds,
springs and pulls on a whole orbit of pairs, tethers to points and planes the
operations carry onto each other -- relax with BFGS and FIRE (on a Frechet cell filter
too, except the space-fixed tethers) step for step as ASE's optimizers on
``[FixSymmetry, <kind>]`` AND ``[<kind>, FixSymmetry]`` (to 1e-8 Å; ASE's two orders
agree with each other as closely), keep their space group and differ from FixSymmetry
alone (the constraint acts).  A non-invariant example of each kind is refused before
the run naming the system, the atoms and the operation; ``fix_symmetry`` and
``data.constraints`` take the same combinations; a batch mixing them with a free system
equals each alone, bit for bit, on the CPU's, the accelerator's and the CUDA-graph
paths."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from ase import Atoms
from ase.constraints import (
    ExternalForce,
    FixBondLengths,
    FixCartesian,
    FixCom,
    FixedLine,
    FixedPlane,
    FixSymmetry,
    Hookean,
)
from symmetry_cases import chiral_cu16
from test_cell_filter import ExactFrechet
from test_quasi_newton import ASE_OPTIMIZERS, run
from test_symmetry import batch_equals_each_alone, keeps_operations, lj

import alchemi_lit as al
from alchemi_lit import Batch
from alchemi_lit.core.errors import ConfigError, StructureError
from alchemi_lit.core.symmetry import fix_symmetry
from alchemi_lit.integrators import BFGS, FIRE
from alchemi_lit.models import EMT
from conftest import AseEMT

STEPS = 20
#: P4's general orbit, the other general orbit, and a ring of nearest-neighbour pairs
#: that is one orbit of pairs (in-plane, shorter than half the cell: one minimum image)
GENERAL, OTHER, RING = [1, 2, 5, 10], [6, 9, 13, 14], [(1, 2), (1, 10), (2, 5), (5, 10)]
#: P4_2 1 2's general orbit
EIGHT = [1, 2, 5, 6, 9, 10, 13, 14]
F, T = False, True


def _lengths(atoms: Atoms, pairs) -> list[float]:
    return [atoms.get_distance(a, b, mic=True) for a, b in pairs]


def _ring_unwrapped(atoms: Atoms) -> list:
    """The ring's atoms as their images nearest P4's 4-fold axis through the origin, so
    the pulls' separations (ASE takes no minimum image) rotate onto each other."""
    for i in GENERAL:
        frac = atoms.cell.scaled_positions(atoms.positions[i : i + 1])[0]
        atoms.positions[i] -= np.round(frac[:2]) @ atoms.cell.array[:2]
    return [ExternalForce(a, b, 0.3) for a, b in RING]


#: name -> (polar crystal, cell filter allowed, the kinds for the refined structure)
CASES: dict[str, tuple[bool, bool, Callable[[Atoms], list]]] = {
    "FixCartesian": (T, T, lambda a: [FixCartesian(GENERAL, mask=(F, F, T)),
                                      FixCartesian(OTHER, mask=(T, T, F))]),
    "FixedLine+FixedPlane": (T, T, lambda a: [FixedLine(GENERAL, (0, 0, 1)),
                                              FixedPlane(OTHER, (0, 0, 1))]),
    "FixedPlane (z -> -z)": (F, T, lambda a: [FixedPlane(EIGHT, (0, 0, -1)),
                                              FixCartesian([3, 7, 11, 15], mask=(F, F, T))]),
    "FixCom": (T, T, lambda a: [FixCom()]),
    "FixBondLengths": (T, T, lambda a: [FixBondLengths(RING, bondlengths=[
        0.97 * d for d in _lengths(a, RING)])]),
    "Hookean": (T, T, lambda a: [Hookean(i, j, k=3.0, rt=0.97 * d)
                                 for (i, j), d in zip(RING, _lengths(a, RING))]),
    "Hookean tethers": (T, F, lambda a: [
        *(Hookean(i, a.positions[i] + (0.0, 0.0, 0.15), k=2.0, rt=0.05) for i in OTHER),
        *(Hookean(i, (0.0, 0.0, 1.0, 0.03 - a.positions[i, 2]), k=3.0) for i in [3, 7, 11, 15]),
    ]),
    "ExternalForce": (T, T, _ring_unwrapped),
}  # fmt: skip


def combined(name: str, first: bool = True, kinds: bool = True) -> Atoms:
    """The case's crystal refined by FixSymmetry with its kinds (``first``: FixSymmetry
    first in ASE's list; ``kinds=False``: FixSymmetry alone, the positions as with)."""
    polar, _, make = CASES[name]
    atoms = chiral_cu16(polar)
    sym = FixSymmetry(atoms, symprec=1e-3)  # (refines)
    made = make(atoms)
    atoms.set_constraint(([sym, *made] if first else [*made, sym]) if kinds else sym)
    return atoms


def ase_trajectory(atoms: Atoms, optimizer, cell: bool) -> list[tuple[np.ndarray, np.ndarray]]:
    """Positions and cell after every step of ASE's optimizer (on ``ExactFrechet``:
    ASE's filter up to a constant that cancels, see test_cell_filter)."""
    atoms = atoms.copy()
    atoms.calc = AseEMT()
    opt = ASE_OPTIMIZERS[optimizer](ExactFrechet(atoms) if cell else atoms, logfile=None)
    out = []
    for n, _ in enumerate(opt.irun(fmax=1e-5, steps=STEPS)):
        if n >= 1:
            out.append((atoms.positions.copy(), atoms.cell.array.copy()))
    return out


def _deviation(a, b) -> float:
    assert len(a) == len(b) >= 8, (len(a), len(b))
    return max(max(np.abs(p - q).max(), np.abs(c - d).max()) for (p, c), (q, d) in zip(a, b))


@pytest.mark.parametrize(
    ("optimizer", "cell"),
    [pytest.param(BFGS, "frechet", marks=pytest.mark.slow),
     pytest.param(FIRE, "frechet", marks=pytest.mark.slow), (BFGS, None), (FIRE, None)],
)  # fmt: skip  (with the cell filter ASE's two orders are the slow part: the slow tier;
#                 the mixed batch below runs the filter in the fast tier)
def test_invariant_sets_relax_as_ase_in_either_order(optimizer, cell) -> None:
    names = [n for n, (_, cell_ok, _) in CASES.items() if cell is None or cell_ok]
    systems = [combined(n) for n in names]
    res, rec = run(systems, optimizer(fmax=1e-5, max_steps=STEPS, cell=cell), EMT())
    alone, _ = run([combined(n, kinds=False) for n in names],
                   optimizer(fmax=1e-5, max_steps=STEPS, cell=cell), EMT())  # fmt: skip
    worst = 0.0
    for k, name in enumerate(names):
        ours = list(zip(rec.trajectory(k, "positions"), rec.trajectory(k, "cell")))
        first = ase_trajectory(systems[k], optimizer, cell is not None)
        second = ase_trajectory(combined(name, first=False), optimizer, cell is not None)
        for dev in (_deviation(ours, first), _deviation(first, second)):
            assert dev < 1e-8, (name, dev)
            worst = max(worst, dev)
        assert int(res.steps[k]) == len(first)
    for name, before, after, free in zip(names, systems, res.to_atoms(), alone.to_atoms()):
        assert keeps_operations(before, after), name
        if name == "FixCom":  # (it acts on a zero mode, the drift along the polar axis: small)
            com = [
                a.cell.scaled_positions(a.get_center_of_mass()[None])[0]
                for a in (before, after, free)
            ]  # (fractional: a cell filter carries it)
            assert np.abs(com[1] - com[0]).max() < 1e-12
            assert np.abs(com[2] - com[0]).max() > 1e-9
        else:
            assert np.abs(after.positions - free.positions).max() > 1e-3, name  # (it acts)
        assert [type(c).__name__ for c in after.constraints][-1] == "FixSymmetry"
    print(f"{optimizer.__name__}, cell={cell}: worst deviation {worst:.1e} Å")


def test_constraints_hold_as_the_kinds_alone_leave_them() -> None:
    """What each kind fixes is fixed: z of the z-masked orbit (fractional: a cell filter
    carries it), the rigid bonds' lengths, the centre of mass (no cell filter)."""
    names = ["FixCartesian", "FixBondLengths", "FixCom"]
    systems = [combined(n) for n in names]
    res, _ = run(systems, FIRE(fmax=1e-5, max_steps=STEPS, cell="frechet"), EMT())
    cart, bonds, _ = res.to_atoms()
    frac = [a.cell.scaled_positions(a.positions) for a in (systems[0], cart)]
    assert np.abs(frac[1][GENERAL, 2] - frac[0][GENERAL, 2]).max() < 1e-12
    want = 0.97 * np.array(_lengths(systems[1], RING))
    assert np.abs(np.array(_lengths(bonds, RING)) - want).max() < 1e-10
    res, _ = run(systems[2:], BFGS(fmax=1e-5, max_steps=STEPS), EMT())
    (com,) = res.to_atoms()
    moved = np.abs(com.positions - systems[2].positions).max()
    assert np.abs(com.get_center_of_mass() - systems[2].get_center_of_mass()).max() < 1e-12
    assert moved > 1e-2


def _refused(atoms: Atoms, *words: str) -> None:
    free = chiral_cu16()
    with pytest.raises(StructureError) as err:
        Batch.from_atoms([free, atoms], system_ids=[0, 7])
    for w in ("system 1 (system_id 7): FixSymmetry with", "or drop FixSymmetry", *words):
        assert w in str(err.value), (w, str(err.value))


def _with(polar: bool, make: Callable[[Atoms], list]) -> Atoms:
    atoms = chiral_cu16(polar)
    sym = FixSymmetry(atoms, symprec=1e-3)
    atoms.set_constraint([sym, *make(atoms)])
    return atoms


NOT_INVARIANT = {
    "FixCartesian of x": (T, lambda a: [FixCartesian(GENERAL, mask=(T, F, F))],
                          ["atom 1 (FixCartesian of x) onto atom 10, where it would be "
                           "FixCartesian of y, but atom 10 is FixCartesian of x",
                           "operation 1 (fractional rotation [[0, -1, 0], [1, 0, 0]",
                           "atom 1's orbit is [1, 2, 5, 10]"]),
    "half an orbit": (T, lambda a: [FixCartesian([1, 2], mask=(F, F, T))],
                      ["onto atom 10, where it would be FixCartesian of z, but atom 10 is free"]),
    "FixedPlane": (T, lambda a: [FixedPlane(GENERAL, (0, 1, 0))],
                   ["would be FixedPlane with normal (-1, 0, 0)"]),
    "FixedLine": (T, lambda a: [FixedLine(GENERAL, (1, 1, 0))],
                  ["FixedLine along (0.7071, 0.7071, 0)"]),
    "FixCom": (T, lambda a: [a.set_masses(np.where(np.arange(16) == 2, 70.0, a.get_masses())),
                             FixCom()][1:],
               ["equal masses within each symmetry orbit", "atom 2 (mass 70)",
                "give the orbit [1, 2, 5, 10] one mass"]),
    "FixBondLengths": (T, lambda a: [FixBondLengths([(1, 2)])],
                       ["carries the rigid bond (1, 2) (length 2.55", "which have no such link",
                        "the orbit of (1, 2) is [(1, 2), (1, 10), (2, 5), (5, 10)]"]),
    "bond lengths": (T, lambda a: [FixBondLengths(RING, bondlengths=[2.5, 2.5, 2.5, 2.6])],
                     ["onto atoms", "length 2.6 Å"]),
    "Hookean k": (T, lambda a: [Hookean(i, j, k=1.0 + (i == 5), rt=2.0) for i, j in RING],
                  ["k 1 eV/Å², rt 2 Å", "k 2 eV/Å²"]),
    "Hookean point": (T, lambda a: [Hookean(i, a.positions[i] + (0.2, 0, 0), k=2.0, rt=0.0)
                                    for i in GENERAL],
                      ["atom 1's tether to point", "onto atom 10 as a tether to"]),
    "Hookean plane": (F, lambda a: [Hookean(i, (0, 0, 1, 0.03 - a.positions[i, 2]), k=2.0)
                                    for i in EIGHT],
                      ["spring to plane (0, 0, 1,", "as a spring to the plane (0, 0, -1,"]),
    "ExternalForce": (T, lambda a: [ExternalForce(a, b, 0.3) for a, b in RING],
                      ["the image pair", "lie in different periodic cells"]),
}  # fmt: skip


@pytest.mark.parametrize("name", NOT_INVARIANT)
def test_sets_the_operations_do_not_map_onto_themselves_are_refused(name: str) -> None:
    polar, make, words = NOT_INVARIANT[name]
    _refused(_with(polar, make), *words)


def test_a_cell_filter_refuses_space_fixed_tethers() -> None:
    """Points and planes stay in space while the cell moves the operations' lattice."""
    sim = al.Simulator(model=lj(), stages=FIRE(fmax=1e-3, max_steps=3, cell="frechet"),
                       precision="64")  # fmt: skip
    with pytest.raises(ConfigError, match=r"system 0 carries FixSymmetry with Hookean springs to "
                       r"points or planes.*relax the positions only \(cell=None\)"):  # fmt: skip
        sim.run([combined("Hookean tethers")])


def test_fix_symmetry_and_run_configs_take_invariant_sets() -> None:
    """``fix_symmetry`` keeps the structure's other constraints (refined with them
    lifted, as alone) and ``data.constraints`` builds the same; the batch reads an
    invariant set and refuses another."""
    from alchemi_lit.data.constraint_specs import apply_specs, check_specs

    start = chiral_cu16()
    start.positions[1] += (0.0003, 0.0, 0.0)  # (below symprec: refined away)
    (alone,) = fix_symmetry(start, symprec=1e-3)
    start.set_constraint([FixCartesian(GENERAL, mask=(F, F, T)),
                          *(Hookean(i, j, k=1.0, rt=2.5) for i, j in RING)])  # fmt: skip
    (made,) = fix_symmetry(start, symprec=1e-3)
    names = [type(c).__name__ for c in made.constraints]
    assert names == ["FixCartesian", *["Hookean"] * 4, "FixSymmetry"]
    assert np.abs(made.positions - alone.positions).max() < 1e-12
    (back,) = Batch.from_atoms([made]).to_atoms(results=False)
    assert [type(c).__name__ for c in back.constraints][-1] == "FixSymmetry"
    start.set_constraint(FixedPlane(GENERAL, (1, 0, 0)))
    (made,) = fix_symmetry(start, symprec=1e-3)
    with pytest.raises(StructureError, match=r"system 0: FixSymmetry with FixedPlane .*atom 1"):
        Batch.from_atoms([made])
    spec = [{"type": "FixedLine", "indices": GENERAL, "direction": [0, 0, 1]},
            {"type": "FixSymmetry", "symprec": 1e-3}]  # fmt: skip
    atoms = apply_specs(chiral_cu16(), check_specs(spec))
    (back,) = Batch.from_atoms([atoms]).to_atoms(results=False)
    assert [type(c).__name__ for c in back.constraints] == ["FixedLine", "FixSymmetry"]
    spec[0]["direction"] = [0, 1, 0]
    with pytest.raises(StructureError, match="FixSymmetry with FixedLine"):
        Batch.from_atoms([apply_specs(chiral_cu16(), check_specs(spec))])


@pytest.mark.parametrize(
    "path", ["cpu", "accelerator", pytest.param("cuda_graphs", marks=pytest.mark.slow)]
)
@pytest.mark.parametrize("cell", ["frechet", None])
def test_mixed_batch_equals_each_alone(path: str, cell: str | None) -> None:
    """Every case and a free crystal in one batch; each relaxed alone gives the same bits
    and keeps its constraints."""
    free = chiral_cu16()
    free.rattle(0.03, seed=5)
    names = [n for n, (_, cell_ok, _) in CASES.items() if cell is None or cell_ok]
    systems = [*(combined(n) for n in names), free]

    alone = batch_equals_each_alone(
        systems, lambda: FIRE(fmax=1e-3, max_steps=5, cell=cell), path
    )
    for k, (atoms, relaxed) in enumerate(zip(systems, alone)):
        assert np.abs(relaxed.positions - atoms.positions).max() > 1e-4, k  # (it moved)
