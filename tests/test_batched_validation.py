"""Validating many structures at once says exactly what checking them one by one says.

``validate_structures`` runs the cheap checks over every structure's arrays together
and re-checks alone only what they flag; these tests hold its errors, warnings and
their order to ``validate_atoms`` of each structure in turn, over every kind of bad
input, and its batched cell heights to ``periodic_heights`` bit for bit.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from ase import Atoms
from ase.build import bulk, molecule
from ase.constraints import FixAtoms, FixScaled

from alchemi_lit.core.batched_validation import _heights, validate_structures
from alchemi_lit.core.errors import StructureError
from alchemi_lit.core.geometry import periodic_heights
from alchemi_lit.core.validation import validate_atoms


def cases() -> list[Atoms]:
    """Good structures of every shape and one of each bad kind, mixed."""
    rng = np.random.default_rng(7)
    cu = bulk("Cu", "fcc", a=3.6)
    out = [cu, bulk("Cu", "fcc", a=3.6, cubic=True), molecule("H2O")]
    slab = bulk("Al", "fcc", a=4.05, cubic=True).repeat((2, 2, 1))
    slab.pbc = (True, True, False)
    out.append(slab)
    big = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(3)  # past the small-cell search
    big.rattle(0.05, seed=1)
    out.append(big)
    nan_pos = cu.copy()
    nan_pos.positions[0, 1] = np.nan
    nan_mom = cu.repeat(2)
    nan_mom.set_momenta(rng.normal(size=(8, 3)))
    nan_mom.arrays["momenta"][5, 2] = np.inf
    zero_mass = cu.repeat(2)
    zero_mass.set_masses([63.5] * 7 + [0.0])
    heavy = cu.repeat(2)
    heavy.set_masses(rng.uniform(1, 100, 8))  # explicit masses: fine
    nan_cell = cu.copy()
    nan_cell.cell[2, 2] = np.nan
    flat = Atoms("Cu2", positions=[[0, 0, 0], [1, 1, 0]], cell=[[3, 0, 0], [0, 3, 0], [3, 3, 0]],
                 pbc=True)  # fmt: skip
    fixed = cu.repeat(2)
    fixed.set_constraint(FixAtoms([0, 3]))
    bonded = molecule("H2O")
    bonded.set_constraint(FixScaled(0, mask=(True, False, False)))  # (not supported)
    twice = Atoms("Cu2", positions=[[0, 0, 0], [0, 0, 3.0]], cell=np.eye(3) * 3.0, pbc=True)
    close = Atoms("Ar2", positions=[[0, 0, 0], [0.3, 0, 0]], cell=np.eye(3) * 6.0, pbc=True)
    thin = Atoms("Cu", cell=[[0.1, 0, 0], [0, 3, 0], [0, 0, 3]], pbc=True)
    skewed = [
        Atoms("CuAu", scaled_positions=rng.uniform(size=(2, 3)), pbc=True,
              cell=np.eye(3) * 2.7 + rng.normal(0, 0.5, (3, 3)))
        for _ in range(6)
    ]  # fmt: skip
    no_element = Atoms(numbers=[29, 500], positions=[[0, 0, 0], [1.8, 0, 0]], cell=np.eye(3) * 3.6,
                       pbc=True)  # fmt: skip
    out += [nan_pos, nan_mom, zero_mass, heavy, Atoms(), nan_cell, flat, fixed, bonded]
    out.append(no_element)
    out += [twice, close, thin, *skewed, cu.copy()]
    return out


def one_by_one(structures, ids) -> tuple[list[tuple[int, str]], list[str]]:
    errors = []
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for k, (atoms, sid) in enumerate(zip(structures, ids)):
            try:
                validate_atoms(atoms, k, 0.5, sid)
            except StructureError as exc:
                errors.append((k, str(exc)))
    return errors, [str(w.message) for w in seen]


@pytest.mark.parametrize("ids", ["default", "own"])
def test_many_at_once_say_what_one_by_one_says(ids) -> None:
    structures = cases()
    sids = (
        [None] * len(structures)
        if ids == "default"
        else [100 + 3 * k for k in range(len(structures))]
    )
    errors: list[tuple[int, str]] = []
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        validate_structures(structures, sids, 0.5, errors=errors)
    expected_errors, expected_warnings = one_by_one(structures, sids)
    assert errors == expected_errors
    assert [str(w.message) for w in seen] == expected_warnings
    assert len(errors) == 9 and len(expected_warnings) >= 2  # every bad kind was there
    with pytest.raises(StructureError) as first:  # without errors=: the first one raises
        validate_structures(structures, sids, 0.5)
    assert str(first.value) == expected_errors[0][1]


def test_batched_heights_are_periodic_heights_bit_for_bit() -> None:
    """Bit for bit although two implementations: both are the same IEEE multiplies,
    adds, one division and one square root in the same order, each correctly rounded on
    every processor (numpy fuses no separate ufuncs), and thresholds on the heights
    must decide alike in both paths."""
    rng = np.random.default_rng(3)
    cells = rng.normal(0, 2, (200, 3, 3)) + np.eye(3) * rng.uniform(1, 8, (200, 1, 1))
    cells[:5, 2] = cells[:5, 0] + cells[:5, 1]  # singular: left to periodic_heights
    pbc = np.ones((200, 3), bool)
    pbc[150:] = rng.uniform(size=(50, 3)) < 0.6
    got = _heights(cells, pbc, np.ones(200, bool))[0]
    for k in range(200):
        np.testing.assert_array_equal(got[k], periodic_heights(cells[k], pbc[k]), str(k))
