"""The space group through cell relaxations of 20 perturbed prototypes (EMT, FIRE on a
Frechet filter), spglib the reference: perturbed by 0.1 mÅ -- below the results table's
1 mÅ symprec, so each reads as its ideal group -- an unconstrained relaxation leaves
the group of some (wurtzite, perovskite, NiAs: the noise grows along an unstable
mode), while with FixSymmetry every system keeps every operation (its group may rise:
an atom can relax onto a higher-symmetry site).  The results table says which."""

from __future__ import annotations

import pytest
from prototypes import perturbed, prototypes
from test_symmetry import keeps_operations

import alchemi_lit as al
from alchemi_lit.core.symmetry import fix_symmetry
from alchemi_lit.integrators import FIRE
from alchemi_lit.models import EMT


def relax_both(systems):
    """(free results, constrained results) of the same perturbed structures."""
    def run(s):
        stage = FIRE(fmax=0.01, max_steps=1000, cell="frechet")
        return al.Simulator(model=EMT(), stages=stage, precision="64").run(s)

    return run(systems), run(fix_symmetry(systems, symprec=0.01)), systems


def check(free, fixed, systems, broken_at_least: int) -> None:
    ft, ct = free.to_pandas(), fixed.to_pandas()
    assert ft.converged.all() and ct.converged.all()
    assert (ft.spacegroup_initial == ct.spacegroup_initial).all()
    assert set(ct.symmetry) <= {"kept", "raised"}
    for before, after in zip(fix_symmetry(systems, symprec=0.01), fixed.to_atoms()):
        assert keeps_operations(before, after), before.get_chemical_formula()
    assert (ft.symmetry == "broken").sum() >= broken_at_least, ft[["formula", "symmetry"]]


def test_fixsymmetry_keeps_what_a_free_relaxation_breaks() -> None:
    """Fast sibling of the slow test: NiAs-type NiAl, P6_3/mmc, broken to P2_1/m without
    the constraint, kept with it."""
    free, fixed, systems = relax_both(perturbed(prototypes())[14:15])
    check(free, fixed, systems, 1)
    assert free.to_pandas().spacegroup_final.tolist() == [11]


@pytest.mark.slow
def test_twenty_prototypes_keep_their_space_group() -> None:
    free, fixed, systems = relax_both(perturbed(prototypes()))
    check(free, fixed, systems, 3)
