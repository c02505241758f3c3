"""FixSymmetry in and out of a batch (core/symmetry.py): ASE's constraint read into the
batch and written back onto result Atoms, with fixed atoms when they are whole orbits,
bad input refused before any run naming the system, and the space-group columns of the
results table (spglib as the reference)."""

from __future__ import annotations

import numpy as np
import pytest
from ase import Atoms
from ase.build import bulk
from ase.constraints import FixAtoms, FixBondLengths, FixCartesian, FixSymmetry, Hookean

from alchemi_lit import Batch
from alchemi_lit.core.errors import StructureError
from alchemi_lit.core.symmetry import MAX_OPERATIONS, fix_symmetry, symbol, verdict


def test_fix_symmetry_round_trips_through_a_batch() -> None:
    (atoms,) = fix_symmetry(bulk("Cu", "hcp", a=2.6, c=4.3), symprec=0.01)
    free = bulk("Au", cubic=True)
    (out, back) = Batch.from_atoms([atoms, free]).to_atoms(results=False)
    (c,), d = atoms.constraints, out.constraints[0]
    assert isinstance(d, FixSymmetry) and not back.constraints
    assert np.array_equal(c.rotations, d.rotations)
    assert np.array_equal(np.array(c.symm_map), np.array(d.symm_map))
    assert np.abs((c.translations - d.translations + 0.5) % 1 - 0.5).max() < 1e-10
    assert d.symprec == c.symprec and d.do_adjust_cell and d.do_adjust_positions
    assert np.array_equal(out.positions, atoms.positions)  # written back, not refined again


def _error(atoms) -> str:
    with pytest.raises(StructureError) as info:
        Batch.from_atoms(atoms)
    return str(info.value)


def test_bad_input_is_refused_before_the_run_naming_the_system() -> None:
    good = fix_symmetry(bulk("Cu"))[0]
    moved = fix_symmetry(bulk("Cu", "hcp", a=2.6, c=4.3))[0]
    moved.positions[0] += (0.05, 0.0, 0.0)  # after the constraint was made
    with pytest.raises(StructureError, match=r"system 0: .*symprec must be > 0 Å.*got -0.1"):
        fix_symmetry(bulk("Cu"), symprec=-0.1)
    zero = fix_symmetry(bulk("Cu"))[0]
    zero.constraints[0].symprec = 0.0
    assert "symprec must be > 0" in _error([good, zero]) and "system 1" in _error([good, zero])
    message = _error([good, moved])
    assert "system 1" in message and "not symmetric under its FixSymmetry" in message
    with pytest.raises(StructureError, match="periodic in x, y and z"):
        fix_symmetry(Atoms("Cu2", positions=[[0, 0, 0], [0, 0, 2.5]]))
    both = good.copy()  # (a tether the operations carry onto itself goes with it)
    both.set_constraint([Hookean(0, (0.0, 0.0, 0.0), k=1.0, rt=0.5), FixSymmetry(both)])
    Batch.from_atoms([both])
    both.set_constraint([Hookean(0, (0.3, 0.0, 0.0), k=1.0, rt=0.1), FixSymmetry(both)])
    message = _error([good, both])
    assert "system 1: FixSymmetry with Hookean" in message and "atom 0's tether" in message
    big = fix_symmetry(bulk("Cu") * (2, 2, 2))[0]  # 48 x 8 operations
    assert len(big.constraints[0].rotations) > MAX_OPERATIONS
    assert "relax the primitive cell" in _error([big])


def tetragonal():
    """A conventional Cu cell, tetragonal, atom 1 lifted: orbits {0, 3}, {1}, {2}."""
    atoms = bulk("Cu", "fcc", a=3.61, cubic=True)
    atoms.set_cell(atoms.cell.array @ np.diag([1.0, 1.0, 1.03]), scale_atoms=True)
    atoms.positions[1, 2] += 0.08
    return atoms


def test_fixed_atoms_go_with_fix_symmetry_only_as_whole_orbits() -> None:
    """Fixed atoms (FixAtoms, FixCartesian of x, y, z) that every operation maps onto
    fixed atoms are kept, in a batch and by ``fix_symmetry``; others are refused naming
    the system, the atoms and the orbit; other kinds go with FixSymmetry when the
    operations map them onto themselves (tests/integrators/test_symmetry_combined.py),
    else they are refused by name."""
    atoms = tetragonal()
    sym = FixSymmetry(atoms, symprec=1e-3)
    orbit = atoms.copy()
    orbit.set_constraint([sym, FixCartesian([0, 3], mask=(True, True, True))])
    (back,) = Batch.from_atoms([orbit]).to_atoms(results=False)
    assert [type(c).__name__ for c in back.constraints] == ["FixAtoms", "FixSymmetry"]
    assert sorted(back.constraints[0].index.tolist()) == [0, 3]
    half = atoms.copy()
    half.set_constraint([sym, FixAtoms([0, 1])])
    message = _error([bulk("Au", cubic=True), half])
    assert "system 1: FixSymmetry with fixed atoms needs the fixed set to be whole" in message
    assert "fixed atom(s) [0] have images [3] that are not fixed" in message
    assert "atom 0's orbit is [0, 3]" in message and "drop FixSymmetry" in message
    mixed = atoms.copy()  # (every operation of P4/mmm keeps z up to sign: accepted)
    mixed.set_constraint([sym, FixCartesian([2], mask=(False, False, True))])
    Batch.from_atoms([mixed])
    for other in (FixCartesian([2], mask=(True, False, False)), FixBondLengths([(0, 1)])):
        mixed.set_constraint([sym, other])
        assert f"FixSymmetry with {type(other).__name__} needs" in _error([mixed])

    start = tetragonal()
    start.positions[3, 0] += 0.0004  # (below symprec: refined, fixed or not)
    alone = fix_symmetry(start, symprec=1e-3)[0]
    start.set_constraint(FixAtoms([0, 3]))
    (made,) = fix_symmetry(start, symprec=1e-3)
    assert [type(c).__name__ for c in made.constraints] == ["FixAtoms", "FixSymmetry"]
    assert np.abs(made.positions - alone.positions).max() < 1e-12  # (refined as alone)
    start.set_constraint(FixAtoms([3]))
    with pytest.raises(StructureError, match=r"fixed atom\(s\) \[3\] have images \[0\]"):
        fix_symmetry(start, symprec=1e-3)
    start.set_constraint(Hookean(0, 1, k=1.0, rt=2.0))  # (kept; the batch refuses it)
    (spring,) = fix_symmetry(start, symprec=1e-3)
    with pytest.raises(StructureError, match=r"FixSymmetry with Hookean .* onto atoms \(3, 1\)"):
        Batch.from_atoms([spring])
    with pytest.raises(StructureError, match="already has a FixSymmetry"):
        fix_symmetry(made)


def test_space_group_names_and_verdicts() -> None:
    """spglib's database: symbols, and kept / broken / raised / changed by point group."""
    assert [symbol(n) for n in (160, 221, 225, 194)] == ["R3m", "Pm-3m", "Fm-3m", "P6_3/mmc"]
    assert verdict(225, 225) == "kept" and verdict(221, 160) == "broken"
    assert verdict(160, 221) == "raised" and verdict(47, 71) == "changed"  # mmm both
    assert verdict(0, 225) == ""


def test_fix_symmetry_from_a_run_config() -> None:
    """``data.constraints: [{type: FixSymmetry, symprec: ...}]`` (data/constraint_specs.py)
    refines each structure as ASE's constructor does, and the batch reads it."""
    from alchemi_lit.data.constraint_specs import apply_specs, check_specs

    specs = check_specs([{"type": "FixSymmetry", "symprec": 0.01}])
    atoms = bulk("Cu", "hcp", a=2.6, c=4.3)
    atoms.positions[1] += 0.003  # below symprec: refined away
    (c,) = apply_specs(atoms, specs).constraints
    assert isinstance(c, FixSymmetry) and len(c.rotations) == 24
    assert int(Batch.from_atoms([atoms]).symmetry_count[0]) == 24
    lifted = tetragonal()
    lifted.positions[3, 0] += 0.0004  # (below symprec: refined, fixed or not)
    alone = lifted.copy()
    FixSymmetry(alone, symprec=1e-3)  # (the reference refinement: no constraint)
    lifted.set_constraint(FixAtoms([3]))  # (as a file carries it)
    specs = check_specs([{"type": "FixAtoms", "indices": [0]},
                         {"type": "FixSymmetry", "symprec": 1e-3}])  # fmt: skip
    *_, sym = apply_specs(lifted, specs).constraints
    assert isinstance(sym, FixSymmetry)
    assert np.abs(lifted.positions - alone.positions).max() < 1e-12
    (back,) = Batch.from_atoms([lifted]).to_atoms(results=False)
    assert sorted(back.constraints[0].index.tolist()) == [0, 3]
