"""FixSymmetry in and out of a batch (core/symmetry.py): ASE's constraint read into the
batch and written back onto result Atoms, bad input refused before any run naming the
system, and the space-group columns of the results table (spglib as the reference)."""

from __future__ import annotations

import numpy as np
import pytest
from ase import Atoms
from ase.build import bulk
from ase.constraints import FixAtoms, FixSymmetry

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
    both = good.copy()
    both.set_constraint([FixAtoms([0]), FixSymmetry(both)])
    assert "FixSymmetry together with ['FixAtoms']" in _error([both])
    big = fix_symmetry(bulk("Cu") * (2, 2, 2))[0]  # 48 x 8 operations
    assert len(big.constraints[0].rotations) > MAX_OPERATIONS
    assert "relax the primitive cell" in _error([big])


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
