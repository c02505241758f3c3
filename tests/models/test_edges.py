"""Edges and their canonical order, checked against NumPy; small periodic cells'
pairs against ASE's neighbor_list at the edge of the list's radius."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from alchemi_lit.models.edges import canonical_order


def _random_edges(seed: int, n: int = 7, count: int = 300) -> tuple[torch.Tensor, ...]:
    """Edges with many ties in i and in j (few atoms, many shifts), as small cells have."""
    rng = np.random.default_rng(seed)
    i = torch.from_numpy(rng.integers(0, n, count))
    j = torch.from_numpy(rng.integers(0, n, count))
    ishift = torch.from_numpy(rng.integers(-3, 4, (count, 3)))
    return i, j, ishift


@pytest.mark.parametrize("n", [7, 2**31])
def test_canonical_order_sorts_by_i_then_j_then_shift(n: int) -> None:
    """The canonical order is lexicographic in (i, j, s0, s1, s2), NumPy's ``lexsort``
    of the same keys, whether the keys fit one int64 (n = 7) or the atom count makes the
    combined key overflow and the chained stable sorts take over (n = 2^31: n^2 7^3 >
    2^62; only the count is large, the atom indices stay small)."""
    i, j, ishift = _random_edges(seed=3)
    keys = (ishift[:, 2], ishift[:, 1], ishift[:, 0], j, i)
    want = np.lexsort(tuple(k.numpy() for k in keys))
    got = canonical_order(i, j, ishift, n)
    sorted_rows = torch.stack([i, j, *ishift.T], 1)
    # unique keys are not guaranteed here (repeated edges): compare the sorted rows
    assert torch.equal(sorted_rows[got], sorted_rows[torch.from_numpy(want)])


def _pairs_by_ase(atoms, radius: float) -> set:
    from ase.neighborlist import neighbor_list

    i, j, s = neighbor_list("ijS", atoms, radius)
    return {(a, b, *map(int, t)) for a, b, t in zip(i.tolist(), j.tolist(), s)}


def _pairs_of(edges, batch, row: int) -> set:
    """Both directions (i, j, S) of system ``row``'s edges, local indices; S from vec."""
    lo = int(batch.ptr[row])
    sel = edges.system == row
    i, j = edges.i[sel].numpy() - lo, edges.j[sel].numpy() - lo
    pos, cell = batch.positions[lo : int(batch.ptr[row + 1])].numpy(), batch.cell[row].numpy()
    s = np.rint((edges.vec[sel].numpy() - (pos[j] - pos[i])) @ np.linalg.inv(cell)).astype(int)
    out = {(a, b, *t) for a, b, t in zip(i.tolist(), j.tolist(), s.tolist())}
    return out | {(b, a, *(-x for x in t)) for a, b, *t in out}


def test_small_cell_pairs_just_inside_the_radius_are_found_as_by_ase() -> None:
    """Small periodic cells (narrower than the list's radius: every pair has many
    images) are searched all-pairs, screened in float32 before the exact float64 test.
    float32 rounds a squared distance of ~36 Å^2 by up to ~4e-6 Å^2, more than a pair
    1e-7 Å inside the radius 6 Å lies below it (2 · 6 · 1e-7 = 1.2e-6 Å^2): without a
    margin on the screen such pairs are lost (measured: 25 dimers in 40, each alone).  Each Ar dimer
    here is (radius - 1e-7) Å apart in a random direction, in a 3-5.5 Å orthorhombic
    cell; the pairs (i, j, image) must be ASE's ``neighbor_list``'s, which tests in
    float64 (|error| ~1e-14 Å^2, far below the 1.2e-6 Å^2 gap to the radius)."""
    from ase import Atoms

    from alchemi_lit import Batch
    from alchemi_lit.models import NeighborList

    cutoff, skin = 5.0, 1.0
    radius = cutoff + skin
    rng = np.random.default_rng(0)
    systems = []
    for _ in range(40):
        length = rng.uniform(3.0, 5.5)
        cell = np.diag(length * np.array([1.0, *rng.uniform(0.9, 1.1, 2)]))
        direction = rng.normal(size=3)
        direction /= np.linalg.norm(direction)
        start = rng.uniform(0, 1, 3) @ cell
        ends = [start, start + direction * (radius - 1e-7)]
        systems.append(Atoms("Ar2", positions=ends, cell=cell, pbc=True))
    batch = Batch.from_atoms(systems, dtype=torch.float64, validate=False)
    edges = NeighborList(cutoff, skin)(batch)  # (8 or more tiny cells: one batched pass)
    for row, atoms in enumerate(systems):
        want = _pairs_by_ase(atoms, radius)
        assert _pairs_of(edges, batch, row) == want, f"dimer {row} in a batch"
        alone = Batch.from_atoms([atoms], dtype=torch.float64, validate=False)
        assert _pairs_of(NeighborList(cutoff, skin)(alone), alone, 0) == want, f"dimer {row}"


def test_a_small_cell_pair_exactly_at_the_radius_is_left_out_as_by_ase() -> None:
    """The list holds pairs strictly within its radius, like ASE's ``neighbor_list`` and
    vesin (which builds larger cells: a pair must not change with the path).  In a
    4 x 4.5 x 5 Å cell, atoms 2 Å apart along x have an image exactly 6.0 Å away (all
    numbers exact in binary: r2 = 36.0), the radius 5 + 1 Å."""
    from ase import Atoms

    from alchemi_lit import Batch
    from alchemi_lit.models import NeighborList

    atoms = Atoms("Ar2", positions=[[0, 0, 0], [2.0, 0, 0]], cell=[4.0, 4.5, 5.0], pbc=True)
    batch = Batch.from_atoms([atoms], dtype=torch.float64, validate=False)
    edges = NeighborList(5.0, 1.0)(batch)
    assert (0, 1, 1, 0, 0) not in _pairs_by_ase(atoms, 6.0)
    assert _pairs_of(edges, batch, 0) == _pairs_by_ase(atoms, 6.0)


def test_a_non_finite_first_atom_costs_only_its_own_system_its_edges() -> None:
    """A system with a non-finite position gets no edges (NaNGuard quarantines it); the
    systems before it keep theirs.  Two small cells (each narrower than the radius), the
    second with NaN in its *first* atom -- the boundary where a row lookup of the bad
    atom can land on the previous system: the first system's energy and forces are
    ASE's LennardJones's (float64, to round-off: 1e-10 eV and eV/Å)."""
    from ase import Atoms
    from ase.calculators.lj import LennardJones as AseLJ

    from alchemi_lit import Batch
    from alchemi_lit.models import LennardJones

    rng = np.random.default_rng(4)
    cell = np.diag([4.2, 4.5, 4.8])
    good = Atoms("Ar2", positions=rng.uniform(0, 4, (2, 3)), cell=cell, pbc=True)
    bad = Atoms("Ar2", positions=rng.uniform(0, 4, (2, 3)), cell=cell, pbc=True)
    bad.positions[0, 1] = np.nan
    batch = Batch.from_atoms([good, bad], dtype=torch.float64, validate=False)
    out = LennardJones(epsilon=0.0104, sigma=3.4, cutoff=6.0, skin=1.0)(batch)
    ref = good.copy()
    ref.calc = AseLJ(epsilon=0.0104, sigma=3.4, rc=6.0)
    assert abs(float(out["energy"][0]) - ref.get_potential_energy()) < 1e-10
    np.testing.assert_allclose(out["forces"][:2].numpy(), ref.get_forces(), rtol=0, atol=1e-10)


def test_strongly_sheared_cells_on_the_accelerator_path_have_ases_pairs() -> None:
    """The accelerator's batched cell list bins each cell by the distances between its
    lattice planes (1 / |column of the inverse cell|); in a strongly sheared cell these
    are far shorter than the cell vectors, and binning by anything longer searches too
    few bins and loses pairs.  Twelve 4-11-atom cells with shears up to 1.2 times their
    edge, on CPU through ``accelerator_path``, against ASE's ``neighbor_list`` (float64;
    random positions put no pair within round-off of the 5 Å radius)."""
    from ase import Atoms

    from alchemi_lit import Batch
    from alchemi_lit.models import NeighborList
    from alchemi_lit.testing import accelerator_path

    rng = np.random.default_rng(0)
    systems = []
    for _ in range(12):
        length = rng.uniform(5, 9)
        cell = length * (np.eye(3) + np.triu(rng.uniform(-1.2, 1.2, (3, 3)), 1))
        frac = rng.uniform(0, 1, (int(rng.integers(4, 12)), 3))
        systems.append(Atoms(f"Ar{len(frac)}", positions=frac @ cell, cell=cell, pbc=True))
    batch = Batch.from_atoms(systems, dtype=torch.float64, validate=False)
    with accelerator_path():
        edges = NeighborList(4.0, 1.0)(batch)
    for row, atoms in enumerate(systems):
        assert _pairs_of(edges, batch, row) == _pairs_by_ase(atoms, 5.0), f"cell {row}"


@pytest.mark.parametrize("path", ["cpu", "accelerator"])
def test_a_non_finite_periodic_cell_vector_costs_only_its_own_system_its_edges(path) -> None:
    """A system whose periodic cell holds a NaN (positions finite: a cell filter's step
    that diverged) gets no edges, on either path, and NaNGuard quarantines it; the
    other systems keep ASE's ``neighbor_list`` pairs.  On the CPU the small-cell
    planner must mark it as not finite (``()``): handed to vesin, such a cell stops the
    process with a floating-point exception (SIGFPE), every other system with it."""
    import contextlib

    from alchemi_lit import Batch
    from alchemi_lit.models import NeighborList, small_cells
    from alchemi_lit.testing import accelerator_path
    from conftest import perturbed_argon

    systems = perturbed_argon(3, 2, 0.05, seed=8)
    batch = Batch.from_atoms(systems, dtype=torch.float64)
    batch.cell[1, 0, 1] = float("nan")  # (NaN in place of a 0: nan_to_num would hide it)
    if path == "cpu":
        plan = small_cells.small_cell_plan(
            batch.positions.numpy(), batch.cell.numpy(), batch.pbc.numpy(),
            batch.ptr.tolist(), [0, 1, 2], 6.0,
        )  # fmt: skip
        assert plan[1] == ()
    with accelerator_path() if path == "accelerator" else contextlib.nullcontext():
        edges = NeighborList(5.0, 1.0)(batch)
    assert not bool((edges.system == 1).any())
    for row in (0, 2):
        assert _pairs_of(edges, batch, row) == _pairs_by_ase(systems[row], 6.0), f"system {row}"
