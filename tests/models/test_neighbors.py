"""NeighborList: exact pair sets against a brute-force reference, Verlet-skin logic,
partial rebuilds and canonical edge order."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.geometry import complete_cell

from alchemi_lit import Batch
from alchemi_lit.models import LennardJones, NeighborList
from conftest import (
    cluster_argon,
    mixed_pbc_argon,
    perturbed_argon,
    random_structure,
    random_triclinic_cell,
    rng_for,
    slab_argon,
    triclinic_argon,
)

DT = torch.float64


# ---------------------------------------------------------------------- reference
def _normalised(i: np.ndarray, j: np.ndarray, s: np.ndarray) -> list:
    """One representative ``(i, j, s0, s1, s2)`` of each unordered pair {(i, j, S),
    (j, i, -S)}, in the given order: ``i <= j``, and for an atom's own image the shift
    whose first nonzero component is positive."""
    i, j, s = np.asarray(i), np.asarray(j), np.asarray(s).reshape(-1, 3)
    first = s[np.arange(len(s)), np.argmax(s != 0, axis=1)] if len(s) else np.zeros(0)
    swap = i > j
    flip = swap | ((i == j) & (first <= 0))
    a, b, s = np.where(swap, j, i), np.where(swap, i, j), np.where(flip[:, None], -s, s)
    return list(zip(a.tolist(), b.tolist(), *s.T.tolist()))


def brute_force_pairs(pos: np.ndarray, cell: np.ndarray, pbc: np.ndarray, radius: float) -> set:
    """All unordered pairs (i, j, S) with ``|pos[j] - pos[i] + S @ cell| <= radius``.

    Enumerates every periodic image along periodic axes that can possibly be within
    ``radius`` (bound from reciprocal-vector norms and the spread of the fractional
    coordinates, so unwrapped positions are fine), including an atom's own images.
    """
    pbc = np.asarray(pbc, dtype=bool)
    nmax = np.zeros(3, dtype=int)
    if pbc.any():
        inv = np.linalg.inv(complete_cell(cell))
        frac = pos @ inv
        spread = frac.max(0) - frac.min(0)
        bound = radius * np.linalg.norm(inv, axis=0) + spread
        nmax = np.where(pbc, np.ceil(bound).astype(int) + 1, 0)
    shifts = np.array(list(itertools.product(*(range(-n, n + 1) for n in nmax))), dtype=int)
    vectors = np.array([np.asarray(s, dtype=float) @ cell for s in shifts])
    diff = pos[None, :, :] - pos[:, None, :]  # diff[i, j] = pos[j] - pos[i]
    hits = []
    for lo in range(0, len(shifts), 256):  # every shift at once, in chunks
        d = np.linalg.norm(diff[None] + vectors[lo : lo + 256, None, None, :], axis=-1)
        k, i, j = np.nonzero(d <= radius)  # d[k, i, j]: pair (i, j) at shift lo + k
        hits.append((k + lo, i, j))
    k, i, j = (np.concatenate(x) for x in zip(*hits))
    s = shifts[k]
    own = (i == j) & ~s.any(axis=1)  # an atom is not its own neighbour
    return set(_normalised(i[~own], j[~own], s[~own]))


def edges_as_pairs(batch: Batch, edges, row: int, within: float | None = None) -> list:
    """Normalised (i, j, s0, s1, s2) tuples of system ``row`` (local atom indices)."""
    lo = int(batch.ptr[row])
    sel = edges.system == row
    if within is not None:
        sel &= edges.vec.norm(dim=-1) <= within
    cell = batch.cell[row].numpy()
    inv = np.linalg.inv(complete_cell(cell))
    vec = edges.vec[sel].numpy()
    i = edges.i[sel].numpy() - lo
    j = edges.j[sel].numpy() - lo
    pos = batch.positions.numpy()
    shift = vec - (pos[j + lo] - pos[i + lo])
    s = np.rint(shift @ inv).astype(int)
    np.testing.assert_allclose(s @ cell, shift, atol=1e-9)  # shifts are lattice vectors
    return _normalised(i, j, s)


def assert_matches_reference(batch: Batch, edges, radius: float) -> None:
    for row in range(batch.num_systems):
        lo, hi = int(batch.ptr[row]), int(batch.ptr[row + 1])
        got = edges_as_pairs(batch, edges, row)
        assert len(got) == len(set(got)), f"system {row}: duplicate edges"
        ref = brute_force_pairs(
            batch.positions[lo:hi].numpy(), batch.cell[row].numpy(), batch.pbc[row].numpy(), radius
        )
        missing, extra = sorted(ref - set(got))[:5], sorted(set(got) - ref)[:5]
        assert set(got) == ref, f"system {row}: missing {missing}, extra {extra}"


# ---------------------------------------------------------------------- pair sets
def geometry_zoo() -> list:
    structures = []
    for seed in range(4):  # random triclinic cells, atoms partly outside the cell
        cell = random_triclinic_cell(rng_for(seed), (3.5, 6.0))
        structures.append(random_structure(12, cell, True, seed, outside=0.3))
    for seed in range(3):  # small cells: cutoff > cell size, many self-images
        cell = random_triclinic_cell(rng_for(100 + seed), (1.6, 2.6))
        structures.append(random_structure(1 + seed, cell, True, 100 + seed, outside=0.2))
    for seed, pbc in enumerate([(True, False, True), (False, False, True), (True, True, False)]):
        cell = random_triclinic_cell(rng_for(200 + seed), (2.5, 5.0))
        structures.append(random_structure(10, cell, pbc, 200 + seed, outside=0.2))
    structures.append(random_structure(15, None, False, 300, box=7.0))  # cluster, zero cell
    structures.append(slab_argon(1, 2, 0.2, 301))  # zero third vector, pbc (T, T, F)
    structures.append(triclinic_argon(2, 0.2, 0.1, 302))
    structures.append(cluster_argon(5.0, 0.2, 303))
    structures.append(mixed_pbc_argon((False, True, False), 1, 0.2, 304))
    return structures


@pytest.mark.parametrize(("cutoff", "skin"), [(4.0, 0.5), (2.9, 0.0), (5.5, 1.0)])
def test_pairs_equal_brute_force(cutoff: float, skin: float) -> None:
    batch = Batch.from_atoms(geometry_zoo(), dtype=DT, validate=False)
    nl = NeighborList(cutoff, skin)
    edges = nl(batch)
    assert edges.cutoff == cutoff
    assert nl.num_builds == batch.num_systems
    assert_matches_reference(batch, edges, cutoff + skin)


def test_small_cell_sees_own_images_many_times() -> None:
    cell = np.array([[1.5, 0.0, 0.0], [0.4, 1.7, 0.0], [-0.3, 0.2, 1.6]])
    atoms = random_structure(1, cell, True, 7)
    batch = Batch.from_atoms([atoms], dtype=DT, validate=False)
    edges = NeighborList(4.0, 0.0)(batch)
    # a single atom: every edge is a self-image, and more than the 13 (half of the
    # 26) images of the first shell: the 4 Å sphere spans several cells
    assert bool((edges.i == edges.j).all())
    assert len(edges.i) > 25
    assert bool((edges.vec.norm(dim=-1) > 1.0).all())
    assert_matches_reference(batch, edges, 4.0)


def test_edge_vectors_and_directed() -> None:
    batch = Batch.from_atoms(perturbed_argon(2, 1, 0.2, seed=3), dtype=DT)
    nl = NeighborList(5.0, 0.5)
    edges = nl(batch)
    pairs = {(row, *t) for row in range(2) for t in edges_as_pairs(batch, edges, row)}
    assert len(pairs) == len(edges.i)
    both = edges.directed()
    n = len(edges.i)
    assert len(both.i) == 2 * n
    assert torch.equal(both.i[n:], edges.j) and torch.equal(both.j[n:], edges.i)
    assert torch.equal(both.vec[n:], -edges.vec)
    assert torch.equal(both.system[:n], both.system[n:])
    # vec = r_j - r_i + lattice shift, and edges never cross systems
    assert torch.equal(batch.system_idx[edges.i], edges.system)
    assert torch.equal(batch.system_idx[edges.j], edges.system)


def test_bad_parameters() -> None:
    with pytest.raises(ValueError, match="cutoff"):
        NeighborList(0.0)
    with pytest.raises(ValueError, match="skin"):
        NeighborList(3.0, -0.1)


# ---------------------------------------------------------------------- skin logic
def _batch(n: int = 3, seed: int = 0) -> Batch:
    return Batch.from_atoms(perturbed_argon(n, 2, 0.1, seed=seed), dtype=DT)


@pytest.mark.parametrize(("factor", "rebuilt"), [(1 - 1e-6, False), (1 + 1e-6, True)])
@pytest.mark.parametrize("direction", [(1.0, 0.0, 0.0), (0.6, -0.48, 0.64)])
def test_rebuild_threshold_is_half_skin(factor: float, rebuilt: bool, direction) -> None:
    skin = 1.0
    batch = _batch()
    nl = NeighborList(4.0, skin)
    nl(batch)
    assert nl.num_builds == 3
    atom = int(batch.ptr[1]) + 5  # an atom of system 1
    step = torch.tensor(direction, dtype=DT)
    step = step / step.norm() * (0.5 * skin * factor)
    batch.positions[atom] += step
    assert nl.needs_rebuild(batch).tolist() == [False, rebuilt, False]
    nl(batch)
    assert nl.num_builds == 3 + int(rebuilt)
    assert not bool(nl.needs_rebuild(batch).any())


def test_displacement_is_measured_from_last_build() -> None:
    """Many small moves add up: the reference is the last build, not the last call."""
    batch = _batch()
    nl = NeighborList(4.0, 1.0)
    nl(batch)
    atom = int(batch.ptr[2])
    for _ in range(4):
        batch.positions[atom, 0] += 0.15
        nl(batch)
    assert nl.num_builds == 3 + 1  # 0.6 > 0.5 after the 4th move; only system 2
    batch.positions[atom, 0] += 0.15  # 0.15 from the new reference: no rebuild
    nl(batch)
    assert nl.num_builds == 4


def _deform(batch: Batch, row: int, m: torch.Tensor) -> None:
    """Cell and positions of system ``row`` times ``m`` (fractional coordinates kept)."""
    lo, hi = batch.ptr[row : row + 2].tolist()
    batch.positions[lo:hi] = batch.positions[lo:hi] @ m
    batch.cell[row] = batch.cell[row] @ m


@pytest.mark.parametrize(("factor", "rebuilt"), [(1 + 1e-6, False), (1 - 1e-6, True)])
def test_a_cell_deformed_within_the_skin_keeps_its_list(factor: float, rebuilt: bool) -> None:
    """A homogeneous compression by ``s`` brings pairs at ``cutoff + skin`` to ``s (cutoff +
    skin)``: the list holds until that reaches the cutoff (NPT and cell relaxations would
    otherwise rebuild every step); a shear counts by its smallest singular value."""
    cutoff, skin = 4.0, 1.0
    batch = _batch()
    nl = NeighborList(cutoff, skin)
    nl(batch)
    s = cutoff / (cutoff + skin) * factor
    shear = torch.tensor([[1.0, 0.0, 0.0], [0.3, 1.0, 0.0], [0.0, 0.0, 1.0]], dtype=DT)
    u, _, vh = torch.linalg.svd(shear)
    _deform(batch, 1, u @ torch.diag(torch.tensor([1.05, 1.02, s], dtype=DT)) @ vh)
    _deform(batch, 2, torch.eye(3, dtype=DT) * 1.03)  # expanded: never a reason
    assert nl.needs_rebuild(batch).tolist() == [False, rebuilt, False]
    nl(batch)
    assert nl.num_builds == 3 + int(rebuilt)
    edges = nl(batch)
    for row in range(batch.num_systems):  # every pair within the cutoff is listed
        lo, hi = batch.ptr[row : row + 2].tolist()
        cell, pbc = batch.cell[row].numpy(), batch.pbc[row].numpy()
        within = brute_force_pairs(batch.positions[lo:hi].numpy(), cell, pbc, cutoff)
        assert within <= set(edges_as_pairs(batch, edges, row)), row


def test_a_kept_list_in_a_new_cell_gives_what_a_fresh_one_gives_bit_for_bit() -> None:
    """Kept edges get their periodic shifts in the new cell as a build computes them, and
    edges beyond the cutoff add exact zeros: energy, forces and stress equal a fresh
    list's to the bit, whatever the rebuild history (resumes and batches rely on it)."""
    batch = Batch.from_atoms([triclinic_argon(2, seed=3), *perturbed_argon(2, 2, 0.1, seed=4)])
    model, fresh = LennardJones(0.0104, 3.4, 5.0, skin=1.5), LennardJones(0.0104, 3.4, 5.0)
    model(batch)
    gen = torch.Generator().manual_seed(0)
    for step in range(6):
        for row in range(batch.num_systems):
            strain = 0.01 * torch.randn(3, 3, generator=gen, dtype=DT)
            _deform(batch, row, torch.eye(3, dtype=DT) + strain)
        batch.positions += 0.03 * torch.randn(batch.positions.shape, generator=gen, dtype=DT)
        ours = model(batch, compute_stress=True)
        ref = fresh(batch, compute_stress=True)
        fresh.neighbors.reset()
        for key in ("energy", "forces", "stress"):
            assert torch.equal(ours[key], ref[key]), (step, key)
    assert model.neighbors.num_builds < 3 * batch.num_systems  # mostly kept


def test_new_batch_triggers_full_rebuild() -> None:
    batch = _batch()
    nl = NeighborList(4.0, 1.0)
    nl(batch)
    nl(batch)
    assert nl.num_builds == 3
    clone = batch.clone()  # same numbers, new layout
    assert nl.needs_rebuild(clone).all()
    nl(clone)
    assert nl.num_builds == 6
    sub = clone.select([2, 0])
    edges = nl(sub)
    assert nl.num_builds == 8
    assert_matches_reference(sub, edges, 5.0)
    nl.reset()
    nl(sub)
    assert nl.num_builds == 10


def test_non_finite_positions_force_rebuild() -> None:
    batch = _batch()
    nl = NeighborList(4.0, 1.0)
    nl(batch)
    batch.positions[int(batch.ptr[1])] = float("nan")
    assert nl.needs_rebuild(batch).tolist() == [False, True, False]


def _moved(batch: Batch, seed: int, moves: dict[int, float]) -> None:
    """Displace every atom of system ``row`` by a random vector of norm ``< moves[row]``."""
    g = torch.Generator().manual_seed(seed)
    for row, scale in moves.items():
        lo, hi = int(batch.ptr[row]), int(batch.ptr[row + 1])
        d = torch.randn((hi - lo, 3), generator=g, dtype=DT)
        d = d / d.norm(dim=-1, keepdim=True) * torch.rand((hi - lo, 1), generator=g, dtype=DT)
        batch.positions[lo:hi] += scale * d


def test_partial_rebuild_equals_fresh_build() -> None:
    structures = [
        *perturbed_argon(2, 2, 0.1, seed=5),
        triclinic_argon(2, 0.1, 0.08, seed=6),
        mixed_pbc_argon((True, False, True), 2, 0.1, seed=7),
        slab_argon(2, 2, 0.1, seed=8),
        cluster_argon(5.5, 0.1, seed=9),
    ]
    batch = Batch.from_atoms(structures, dtype=DT)
    cutoff, skin = 5.0, 1.0
    nl = NeighborList(cutoff, skin)
    nl(batch)
    builds = nl.num_builds
    for step in range(4):
        # systems 0, 2, 4 move beyond skin/2 (rebuilt); 1, 3, 5 stay within it
        _moved(batch, step, {0: 0.9, 1: 0.3, 2: 0.9, 3: 0.3, 4: 0.9, 5: 0.3})
        batch.positions[int(batch.ptr[0])] += torch.tensor([0.6, 0.0, 0.0], dtype=DT)
        batch.positions[int(batch.ptr[2])] += torch.tensor([0.0, 0.6, 0.0], dtype=DT)
        batch.positions[int(batch.ptr[4])] += torch.tensor([0.0, 0.0, 0.6], dtype=DT)
        need = nl.needs_rebuild(batch)
        edges = nl(batch)
        assert nl.num_builds == builds + int(need.sum())
        builds = nl.num_builds
        fresh = NeighborList(cutoff, skin)(batch)
        # every pair within the cutoff is present, as the same ordered arrays
        ka = edges.vec.norm(dim=-1) <= cutoff
        kb = fresh.vec.norm(dim=-1) <= cutoff
        assert torch.equal(edges.i[ka], fresh.i[kb])
        assert torch.equal(edges.j[ka], fresh.j[kb])
        assert torch.equal(edges.system[ka], fresh.system[kb])
        assert torch.equal(edges.vec[ka], fresh.vec[kb])
        # the stored list stays sorted by (i, j) (then by integer cell shift)
        keys = list(zip(edges.i.tolist(), edges.j.tolist()))
        assert keys == sorted(keys)
        # the CPU reduction aids describe the spliced list
        assert torch.equal(edges.atom_counts, torch.bincount(edges.i, minlength=batch.num_atoms))
        assert torch.equal(
            edges.system_counts, torch.bincount(edges.system, minlength=batch.num_systems)
        )
        assert torch.equal(edges.j_flat.view(-1, 3)[:, 2], 3 * edges.j + 2)
    assert builds > batch.num_systems  # some partial rebuilds actually happened


def test_partial_rebuild_forces_are_bitwise_identical() -> None:
    """Edges beyond the cutoff add exact zeros: Verlet history does not change sums."""
    batch = Batch.from_atoms(perturbed_argon(4, 2, 0.1, seed=11), dtype=DT)
    model = LennardJones(epsilon=0.0104, sigma=3.4, cutoff=6.0, skin=1.0)
    model(batch)
    for step in range(3):
        _moved(batch, 50 + step, {0: 0.45, 1: 1.2, 2: 0.2, 3: 0.45})
        out = model(batch)
        fresh = LennardJones(epsilon=0.0104, sigma=3.4, cutoff=6.0, skin=1.0)(batch)
        for key in ("energy", "forces", "stress"):
            assert torch.equal(out[key], fresh[key]), key


# ---------------------------------------------------------------------- kept lists
def _edges_equal_a_fresh_lists(batch: Batch, edges, cutoff: float) -> None:
    """The edges within ``cutoff`` are a fresh list's, as the same ordered arrays."""
    fresh = NeighborList(cutoff, 0.0)(batch)
    ka, kb = edges.vec.norm(dim=-1) <= cutoff, fresh.vec.norm(dim=-1) <= cutoff
    for name in ("i", "j", "system", "vec"):
        assert torch.equal(getattr(edges, name)[ka], getattr(fresh, name)[kb]), name


def test_a_cell_strained_and_restored_gets_its_shifts_back() -> None:
    """The kept edges' periodic shifts are recomputed when the cell differs from the one
    they were last computed in, not the one the list was built in: a cell strained and
    then restored (a barostat's step undone, a finite-difference stress) gets the
    restored cell's shifts back (compared with the build's cell, it kept the strained
    cell's)."""
    batch = _batch()
    nl = NeighborList(4.0, 1.0)
    nl(batch)
    saved = batch.clone()
    strain = torch.tensor([[1.0, 0.3, 0.0], [0.0, -1.0, 0.0], [0.0, 0.0, 2.0]], dtype=DT)
    _deform(batch, 1, torch.eye(3, dtype=DT) + 0.01 * strain)
    _edges_equal_a_fresh_lists(batch, nl(batch), 4.0)
    batch.cell, batch.positions = saved.cell.clone(), saved.positions.clone()
    _edges_equal_a_fresh_lists(batch, nl(batch), 4.0)
    assert nl.num_builds == batch.num_systems  # (kept throughout)


def _keep_rows(nl: NeighborList, batch: Batch, rows: list[int]) -> Batch:
    """The batch of ``rows`` of ``batch`` (in that order), the list carried over to it."""
    kept = batch.select(rows)
    nl.remap(batch.ptr, torch.tensor(rows), kept)
    return kept


def test_a_remap_keeps_the_moves_since_the_last_build() -> None:
    """Systems leaving (``remap``): a kept system's moves still count from its last
    build, not from the remap -- 0.4 A before it and 0.2 A after it exceed the 0.5 A
    half skin (a remap that took the current positions for the reference kept the list)."""
    batch = _batch()
    nl = NeighborList(4.0, 1.0)
    nl(batch)
    batch.positions[int(batch.ptr[2]) + 4, 0] += 0.4
    nl(batch)
    kept = _keep_rows(nl, batch, [0, 2])
    kept.positions[int(kept.ptr[1]) + 4, 0] += 0.2
    assert nl.needs_rebuild(kept).tolist() == [False, True]
    edges = nl(kept)
    assert nl.num_builds == 3 + 1
    assert_matches_reference(kept, edges, 5.0)


def test_a_cell_changed_before_a_remap_gets_its_shifts_in_the_new_cell() -> None:
    """A barostat changes the cell after a step's forces, and systems may leave at the
    bookkeeping that follows (``remap``): the kept systems' shifts are still those of
    the last call's cell and are recomputed in the new one at the next call (a remap
    that took them for the new cell's kept the old ones); forces equal a fresh list's."""
    structures = [*perturbed_argon(2, 2, 0.1, seed=12), triclinic_argon(2, seed=13)]
    batch = Batch.from_atoms(structures, dtype=DT)
    model = LennardJones(0.0104, 3.4, 5.0, skin=1.0)
    model(batch)
    _deform(batch, 2, torch.eye(3, dtype=DT) * 0.995)
    kept = _keep_rows(model.neighbors, batch, [0, 2])
    ours = model(kept, compute_stress=True)
    fresh = LennardJones(0.0104, 3.4, 5.0, skin=1.0)(kept, compute_stress=True)
    for key in ("energy", "forces", "stress"):
        assert torch.equal(ours[key], fresh[key]), key
    assert model.neighbors.num_builds == 3  # (kept)


def test_a_remap_that_reorders_systems_keeps_the_canonical_order() -> None:
    """``remap`` takes the new rows in any order: kept systems moved to other rows get
    their edges sorted again, so that forces (summed per atom along the sorted edges on
    CPU) equal a fresh list's to the bit."""
    structures = [*perturbed_argon(2, 2, 0.1, seed=17), triclinic_argon(2, seed=18)]
    batch = Batch.from_atoms(structures, dtype=DT)
    model = LennardJones(0.0104, 3.4, 5.0, skin=1.0)
    model(batch)
    kept = _keep_rows(model.neighbors, batch, [2, 0])
    ours = model(kept, compute_stress=True)
    fresh = LennardJones(0.0104, 3.4, 5.0, skin=1.0)(kept, compute_stress=True)
    for key in ("energy", "forces", "stress"):
        assert torch.equal(ours[key], fresh[key]), key
    i = model.neighbors._i
    assert bool((i[1:] >= i[:-1]).all()) and model.neighbors.num_builds == 3


def _pair_set(i, j, shift) -> set[tuple[int, int, int, int, int]]:
    """Unordered pairs with their cell shift, oriented canonically."""
    out = set()
    for a, b, s in zip(i.tolist(), j.tolist(), shift.tolist()):
        if (a, b) > (b, a) or (a == b and tuple(s) < (0, 0, 0)):
            a, b, s = b, a, [-x for x in s]
        out.add((a, b, *s))
    return out


def test_device_builder_matches_cpu_builder() -> None:
    """The vesin-torch path (what GPU batches use) finds the same pairs as the CPU path.

    It runs on CPU tensors here; on a GPU the same code runs on CUDA tensors
    (``test_lennard_jones_on_cuda_matches_cpu`` below, skipped without one).
    """
    from alchemi_lit.models.pair_search import build_rows as _build_rows
    from alchemi_lit.models.pair_search import build_rows_on_device as _build_rows_on_device

    rng = np.random.default_rng(5)
    systems = []
    for k, pbc in enumerate(([True] * 3, [True, False, True], [False] * 3, [True, True, False])):
        cell = np.diag([5.0, 6.0, 7.0]) + rng.normal(0, 0.6, (3, 3))
        pos = rng.uniform(0, 1, (12 + k, 3)) @ cell
        systems.append(Atoms("Ar" * (12 + k), positions=pos, cell=cell, pbc=pbc))
    batch = Batch.from_atoms(systems, dtype=DT, validate=False)
    rows = list(range(batch.num_systems))
    for radius in (3.0, 7.5):
        i, j, _, system, ishift = _build_rows(batch, rows, radius)
        di, dj, _, dsystem, dishift = _build_rows_on_device(batch, rows, radius)
        for b in rows:
            m, dm = system == b, dsystem == b
            assert _pair_set(di[dm], dj[dm], dishift[dm]) == _pair_set(i[m], j[m], ishift[m])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_lennard_jones_on_cuda_matches_cpu() -> None:
    batch = Batch.from_atoms(perturbed_argon(4, 2, 0.1, seed=3), dtype=DT)
    model = LennardJones(epsilon=0.0104, sigma=3.4, cutoff=6.0, skin=1.0)
    ref = model(batch)
    out = LennardJones(epsilon=0.0104, sigma=3.4, cutoff=6.0, skin=1.0)(batch.to("cuda"))
    for key in ("energy", "forces", "stress"):
        torch.testing.assert_close(out[key].cpu(), ref[key], atol=1e-10, rtol=0)


def test_small_cell_path_reproduces_vesin_bit_for_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small periodic cells are built by an all-pairs torch path instead of vesin
    (faster where vesin's cell list degenerates to one bin).  It must give exactly
    vesin's edges: same pairs, orientation, order, shifts and edge-vector bits, on
    random triclinic cells with unwrapped positions and atoms seeing their own images."""
    from alchemi_lit.models import pair_search, small_cells

    rng = np.random.default_rng(11)
    systems = []
    for _ in range(24):
        length = rng.uniform(2.5, 9.0)
        cell = np.diag(rng.uniform(0.7, 1.3, 3) * length) + rng.normal(0, 0.2 * length, (3, 3))
        if abs(np.linalg.det(cell)) < 0.1 * length**3:
            cell = np.eye(3) * length
        frac = rng.uniform(-0.3, 1.3, (int(rng.integers(1, 40)), 3))
        systems.append(Atoms(f"Ar{len(frac)}", positions=frac @ cell, cell=cell, pbc=True))
    systems.append(Atoms("Ar4", positions=rng.uniform(0, 5, (4, 3)), cell=[5, 5, 5], pbc=False))
    batch = Batch.from_atoms(systems, dtype=DT, validate=False)
    rows = list(range(batch.num_systems))
    radius = 6.5
    pos = batch.positions.numpy()
    plan = small_cells.small_cell_plan(
        pos, batch.cell.numpy(), batch.pbc.numpy(), batch.ptr.tolist(), rows, radius
    )
    used = sum(p is not None and p != () for p in plan)
    assert 5 <= used < len(rows), f"the small-cell path took {used} of {len(rows)} systems"
    mixed = pair_search.build_rows(batch, rows, radius)
    monkeypatch.setattr(small_cells, "_SMALL_CELL_MAX_CANDIDATES", -1)  # vesin for all
    assert all(
        p is None
        for p in small_cells.small_cell_plan(
            pos, batch.cell.numpy(), batch.pbc.numpy(), batch.ptr.tolist(), rows, radius
        )
    )
    by_vesin = pair_search.build_rows(batch, rows, radius)
    for got, want in zip(mixed, by_vesin):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got, want)
    edges = NeighborList(cutoff=radius, skin=0.0)(batch)
    assert_matches_reference(batch, edges, radius)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_molecule_path_reproduces_vesin_bit_for_bit(monkeypatch: pytest.MonkeyPatch, dtype) -> None:
    """Small non-periodic systems are searched by one vectorised all-pairs test instead
    of a vesin call each; the edges must be vesin's exactly (pairs, orientation, order,
    shifts), and so must the pair counts of edge budgets and the closest pair that
    structure validation reports."""
    from alchemi_lit.core import geometry
    from alchemi_lit.core.geometry import closest_pair as _closest_pair
    from alchemi_lit.models import neighbors, pair_search

    rng = np.random.default_rng(23)
    systems = []
    for k in range(30):
        n = int(rng.integers(1, 60))  # beyond the all-pairs limit too
        pos = rng.uniform(0, (n * rng.uniform(10, 60)) ** (1 / 3), (n, 3))
        cell = np.zeros((3, 3)) if k % 2 else np.eye(3) * 4.0  # a box but no pbc
        systems.append(Atoms(f"Ar{n}", positions=pos, cell=cell, pbc=False))
    systems.append(perturbed_argon(1, 2, 0.1, seed=1)[0])  # a periodic one: vesin
    batch = Batch.from_atoms(systems, dtype=dtype, validate=False)
    rows = list(range(batch.num_systems))
    radius = 5.5
    fast = pair_search.build_rows(batch, rows, radius)
    counts = [neighbors.count_pairs(a.positions, a.cell.array, a.pbc, radius) for a in systems]
    closest = [_closest_pair(a.positions, a.cell.array, a.pbc, 2.5) for a in systems]
    monkeypatch.setattr(geometry, "_ALL_PAIRS_MAX_ATOMS", 0)  # vesin for all
    by_vesin = pair_search.build_rows(batch, rows, radius)
    for got, want in zip(fast, by_vesin):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got, want)
    assert counts == [
        neighbors.count_pairs(a.positions, a.cell.array, a.pbc, radius) for a in systems
    ]
    for got, a in zip(closest, systems):
        want = _closest_pair(a.positions, a.cell.array, a.pbc, 2.5)
        assert (got is None) == (want is None)
        if got is not None:
            assert got[1:] == want[1:] and got[0] == pytest.approx(want[0], rel=1e-15)
    assert sum(len(a) <= 48 for a in systems) >= 15  # the fast path took most of them


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_many_tiny_cells_in_one_batched_pass_reproduce_vesin_bit_for_bit(
    monkeypatch: pytest.MonkeyPatch, dtype
) -> None:
    """Strained copies of 1-4 atom cells (an elastic tensor's jobs) are built in one
    batched pass instead of ~0.5 ms of set-up each; beside larger small cells, a
    molecule and a crystal vesin builds, the edges must be vesin's exactly."""
    from alchemi_lit.models import pair_search, small_cells

    rng = np.random.default_rng(5)
    systems = []
    for k in range(20):
        a = rng.uniform(2.4, 4.2)
        cell = a * (np.eye(3) + rng.normal(0, 0.08, (3, 3)))
        frac = rng.uniform(-0.2, 1.2, (1 + k % 4, 3))
        systems.append(Atoms(f"Ar{len(frac)}", positions=frac @ cell, cell=cell, pbc=True))
    systems.insert(7, Atoms("Ar27", positions=rng.uniform(0, 7, (27, 3)), cell=[7, 7.5, 8],
                            pbc=True))  # fmt: skip
    systems.insert(3, Atoms("Ar4", positions=rng.uniform(0, 4, (4, 3)), cell=[5, 5, 5], pbc=False))
    systems.append(Atoms("Ar300", positions=rng.uniform(0, 22, (300, 3)), cell=[22] * 3, pbc=True))
    batch = Batch.from_atoms(systems, dtype=dtype, validate=False)
    rows, radius = list(range(batch.num_systems)), 5.0
    taken = []
    monkeypatch.setattr(pair_search, "_batched_parts", _recording(pair_search, taken))
    routed = pair_search.build_rows(batch, rows, radius)
    assert len(taken) == 1 and len(taken[0]) >= pair_search._TINY_MIN_SYSTEMS
    monkeypatch.setattr(pair_search, "_TINY_MIN_SYSTEMS", 10**9)  # one by one
    one_by_one = pair_search.build_rows(batch, rows, radius)
    monkeypatch.setattr(small_cells, "_SMALL_CELL_MAX_CANDIDATES", -1)  # vesin for all
    by_vesin = pair_search.build_rows(batch, rows, radius)
    for got, alone, want in zip(routed, one_by_one, by_vesin):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got, want) and torch.equal(alone, want)


def _recording(module, taken):
    inner = module._batched_parts

    def batched_parts(batch, rows, radius):
        taken.append(list(rows))
        return inner(batch, rows, radius)

    return batched_parts


def test_two_threads_build_the_edges_of_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """With more than one torch thread, the systems vesin builds are cut into two runs of
    rows, one of them built in a worker thread: the edges are a single thread's, bit for
    bit, for all rows and for some (a one-thread CI never takes this path)."""
    from alchemi_lit.core import geometry
    from alchemi_lit.models import pair_search, small_cells

    monkeypatch.setattr(small_cells, "_SMALL_CELL_MAX_CANDIDATES", -1)  # vesin for all
    monkeypatch.setattr(geometry, "_ALL_PAIRS_MAX_ATOMS", 0)
    structures = [*perturbed_argon(2, 2, 0.1, seed=14), triclinic_argon(2, 0.1, 0.05, seed=15),
                  *perturbed_argon(2, 3, 0.1, seed=16)]  # fmt: skip
    batch = Batch.from_atoms(structures, dtype=DT)
    splits = []
    split_rows = pair_search._split_rows
    monkeypatch.setattr(pair_search, "_THREADED_MIN_ATOMS", 0)
    monkeypatch.setattr(pair_search, "_split_rows", lambda *a: splits.append(a) or split_rows(*a))
    for rows in (list(range(batch.num_systems)), [1, 2, 4]):
        monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
        want = pair_search.build_rows(batch, rows, 5.0)
        assert not splits
        monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
        got = pair_search.build_rows(batch, rows, 5.0)
        assert len(splits) == 1 and splits.pop()[0] == rows
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and torch.equal(g, w)


def test_batch_pair_counts_count_each_systems_pairs() -> None:
    """``batch_pair_counts`` (the edge budgets of a pipeline's transfers) counts each
    system's pairs with its own cell and periodicity: a batch mixing periodic, slab and
    molecule systems gives the pairs of a list built with no skin, per system."""
    from alchemi_lit.models.neighbors import batch_pair_counts

    structures = [cluster_argon(5.0, 0.1, seed=21), slab_argon(2, 2, 0.1, seed=19),
                  *perturbed_argon(1, 2, 0.1, seed=20),
                  mixed_pbc_argon((True, False, True), 2, 0.1, seed=22)]  # fmt: skip
    batch = Batch.from_atoms(structures, dtype=DT)
    edges = NeighborList(5.0, 0.0)(batch)
    want = torch.bincount(edges.system, minlength=batch.num_systems).tolist()
    assert batch_pair_counts(batch, 5.0) == want
    assert len(set(want)) == len(want)  # (the systems' periodicities count)
