"""workflows.order: the orderings of a partially occupied crystal -- as many as an
exhaustive enumeration finds (pymatgen's StructureMatcher over every assignment of the
species to the sites), ranked by the model's relaxed energy as ASE ranks them relaxing
each one alone (EMT, to 1e-6 eV) -- and the bad requests refused before any run."""

from __future__ import annotations

import itertools
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
from ase.calculators.emt import EMT as AseEMT
from ase.optimize import BFGS

from alchemi_lit.core.errors import ConfigError, StructureError
from alchemi_lit.integrators import FIRE
from alchemi_lit.models import EMT
from alchemi_lit.workflows import order
from alchemi_lit.workflows.orderings import count_orderings, supercell_of

ROOT = Path(__file__).resolve().parents[2]
CIF = ROOT / "configs" / "data" / "CuAu_disordered.cif"


def disordered(occupancy: dict[str, float] | None = None, a: float = 3.8):
    """Cu0.5Au0.5 (or ``occupancy``) on the four sites of the cubic fcc cell."""
    from pymatgen.core import Lattice, Structure

    mix = occupancy or {"Cu": 0.5, "Au": 0.5}
    coords = [[0, 0, 0], [0.5, 0.5, 0], [0.5, 0, 0.5], [0, 0.5, 0.5]]
    return Structure(Lattice.cubic(a), [mix] * 4, coords)


def exhaustive_distinct(structure, species: list[str | None]) -> int:
    """Symmetry-distinct orderings by brute force: every placement of ``species``
    (None: a vacancy) on the sites, grouped by pymatgen's StructureMatcher."""
    from pymatgen.analysis.structure_matcher import StructureMatcher
    from pymatgen.core import Structure

    found, seen = [], set()
    for perm in itertools.permutations(species):
        if perm in seen:
            continue
        seen.add(perm)
        keep = [k for k, s in enumerate(perm) if s is not None]
        found.append(Structure(structure.lattice, [perm[k] for k in keep],
                               [structure[k].frac_coords for k in keep]))  # fmt: skip
    return len(StructureMatcher().group_structures(found))


@pytest.mark.parametrize("supercell, expected", [
    (None, 1), pytest.param((2, 1, 1), 7, marks=pytest.mark.slow),
])  # fmt: skip
def test_the_orderings_found_are_the_exhaustive_enumerations(supercell, expected):
    """Cu0.5Au0.5 in the cubic cell: L1_0 is its only ordering (a fact of fcc); in the
    2x1x1 supercell 70 orderings, as many distinct ones as the brute force finds."""
    cell = supercell_of(disordered(), supercell)
    n = len(cell)
    assert count_orderings(cell) == math.comb(n, n // 2)
    brute = exhaustive_distinct(cell, ["Cu"] * (n // 2) + ["Au"] * (n // 2))
    assert brute == expected
    got = order(disordered(), EMT(), supercell=supercell, relax=None, n_relax=10,
                precision="64")  # fmt: skip
    assert got.counts == [math.comb(n, n // 2)] and got.distinct == [brute]
    assert len(got.to_pandas()) == brute


def test_a_half_occupied_site_with_vacancies_is_enumerated():
    """Cu on 3/4 of the fcc sites (vacancies the rest) in the 2x1x1 cell: C(8, 6) = 28
    placements of the two vacancies, grouped as the brute force groups them."""
    cell = supercell_of(disordered({"Cu": 0.75}), (2, 1, 1))
    assert count_orderings(cell) == 28
    brute = exhaustive_distinct(cell, ["Cu"] * 6 + [None] * 2)
    got = order(disordered({"Cu": 0.75}), EMT(), supercell=(2, 1, 1), relax=None, n_relax=20,
                precision="64")  # fmt: skip
    assert got.distinct == [brute] and brute > 1
    assert set(got.to_pandas()["n_atoms"]) == {6}


@pytest.mark.slow
def test_the_ranking_is_ases_relaxing_each_ordering_alone():
    """Every distinct ordering of the 2x1x1 supercell relaxed in one batched run equals
    ASE's BFGS relaxation of it alone with ASE's EMT, to 1e-6 eV, in the same order."""
    got = order(str(CIF), EMT(), supercell=(2, 1, 1), n_relax=10, precision="64",
                relax=FIRE(fmax=1e-5, max_steps=3000))  # fmt: skip
    table = got.to_pandas()
    assert table["converged"].all() and list(table["rank"]) == list(range(7))
    reference = []
    for job in got.jobs.jobs:  # the unrelaxed orderings the run started from
        atoms = job.atoms.copy()
        atoms.calc = AseEMT()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            BFGS(atoms, logfile=None).run(fmax=1e-5, steps=3000)
        reference.append(atoms.get_potential_energy())
    per_atom = sorted(e / 8 for e in reference)
    np.testing.assert_allclose(table["energy_per_atom"], per_atom, rtol=0, atol=1e-6 / 8)
    np.testing.assert_allclose(table["energy"], np.sort(reference), rtol=0, atol=1e-6)
    assert got.best(0).get_potential_energy() == pytest.approx(min(reference), abs=1e-6)


@pytest.mark.slow
def test_sampling_anneals_with_swap_mc_and_finds_the_ground_state():
    """The 2x2x1 supercell (12870 orderings) is sampled: random orderings annealed by
    SwapMC in one run; the best found is at least as low as the enumerated ground state
    of the 2x1x1 supercell, whose orderings the 2x2x1 holds too."""
    sampled = order(str(CIF), EMT(), supercell=(2, 2, 1), max_enumerate=100, n_samples=6,
                    anneal=(1000.0, 300.0), anneal_steps=40, n_relax=2, relax=None,
                    precision="64")  # fmt: skip
    assert sampled.sampled == [True] and sampled.counts == [12870]
    enumerated = order(str(CIF), EMT(), supercell=(2, 1, 1), relax=None, n_relax=1,
                       precision="64")  # fmt: skip
    best = sampled.to_pandas()["energy_per_atom"].min()
    assert best <= enumerated.to_pandas()["energy_per_atom"].min() + 1e-9


def test_bad_requests_are_refused_before_any_run(tmp_path):
    from pymatgen.core import Lattice, Structure

    ordered = Structure(Lattice.cubic(3.6), ["Cu"] * 4,
                        [[0, 0, 0], [0.5, 0.5, 0], [0.5, 0, 0.5], [0, 0.5, 0.5]])  # fmt: skip
    with pytest.raises(StructureError, match="fully ordered"):
        order(ordered, EMT())
    over = tmp_path / "over.cif"
    over.write_text(CIF.read_text().replace("Au1 Au 0 0 0 0.5", "Au1 Au 0 0 0 0.7"))
    with pytest.raises(StructureError, match=r"site 0 \(Cu 0.5 \+ Au 0.7\).*summing to 1.2 > 1"):
        order(str(over), EMT())
    with pytest.raises(ConfigError, match=r"12870 orderings .* more than max_enumerate=2000"):
        order(str(CIF), EMT(), supercell=(2, 2, 1), method="enumerate")
    with pytest.raises(ConfigError, match=r"whole atoms.*supercell with 5x as many sites"):
        order(disordered({"Cu": 0.3, "Au": 0.7}), EMT())  # 4 sites x 0.3 = 1.2 Cu
    with pytest.raises(ConfigError, match="n_relax must be an integer >= 1"):
        order(str(CIF), EMT(), n_relax=0)
    with pytest.raises(ConfigError, match="method must be"):
        order(str(CIF), EMT(), method="anneal")


def test_run_still_refuses_the_cif_and_points_to_order():
    from alchemi_lit.data import read_structures

    with pytest.raises(StructureError, match=r"partially occupied.*alchemi-lit order"):
        read_structures(CIF)
