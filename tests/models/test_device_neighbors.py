"""The accelerator path's neighbour-list builder (issue #26, part 1): one batched cell list
for every system gives vesin's edges to the bit, forces do not change, and a build's
aten operations do not grow with the number of systems.

The accelerator path is taken on CPU with ``tensor_ops.CPU_READS_FREE = False``;
tests marked ``cuda`` run the same on a GPU (skipped without one).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.build import bulk
from device_counting import count_ops

from alchemi_lit import Batch
from alchemi_lit.core import geometry, tensor_ops
from alchemi_lit.models import (
    EMT,
    LennardJones,
    Morse,
    NeighborList,
    cell_list,
    device_path,
    small_cells,
)
from alchemi_lit.models.pair_search import build_rows
from conftest import cluster_argon, mixed_structures, perturbed_argon

DT = torch.float64


def zoo(seed: int, n: int = 24) -> list[Atoms]:
    """Every kind of system a batch may hold: periodic cells (orthorhombic, triclinic,
    narrower than the radius so that atoms see several images of themselves), mixed
    periodicity, molecules with a box or a zero cell, single atoms and empty systems;
    positions partly outside the cell (unwrapped)."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        kind = k % 6
        atoms = 1 if kind == 2 else 0 if k % 11 == 5 else int(rng.integers(2, 30))
        length = rng.uniform(1.5, 11.0)
        cell = np.diag(rng.uniform(0.7, 1.3, 3) * length)
        if kind != 3:  # (kind 3: orthorhombic)
            cell += rng.normal(0, 0.25 * length, (3, 3))
        if abs(np.linalg.det(cell)) < 0.1 * length**3:
            cell = np.eye(3) * length
        pbc = [bool(x) for x in rng.integers(0, 2, 3)] if kind == 4 else [kind != 1] * 3
        pos = rng.uniform(-0.5, 1.5, (atoms, 3)) @ cell
        if kind == 1 and k % 12 == 1:
            cell = np.zeros((3, 3))  # a molecule without a cell
        out.append(Atoms(f"Ar{atoms}" if atoms else "", positions=pos, cell=cell, pbc=pbc))
    return out


@pytest.fixture
def vesin_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU builder with vesin for every system (no all-pairs shortcuts)."""
    monkeypatch.setattr(small_cells, "_SMALL_CELL_MAX_CANDIDATES", -1)
    monkeypatch.setattr(geometry, "_ALL_PAIRS_MAX_ATOMS", 0)


def assert_same_edges(got: tuple, want: tuple) -> None:
    for g, w, name in zip(got, want, ("i", "j", "shift", "system", "integer shift")):
        assert g.dtype == w.dtype and g.shape == w.shape, (name, g.shape, w.shape)
        assert torch.equal(g, w), name


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("budget", [cell_list.CANDIDATE_BUDGET, 300])
def test_batched_builder_gives_vesins_edges_in_canonical_order(
    vesin_only, monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, budget: int
) -> None:
    """Same pairs, orientation, shifts (integer and cartesian, bit for bit) and order as
    vesin, one call per system; for all systems or some rows, and with the candidates
    cut into many chunks (budget 300) as well as in one pass."""
    monkeypatch.setattr(cell_list, "CANDIDATE_BUDGET", budget)
    batch = Batch.from_atoms(zoo(1), dtype=dtype, validate=False)
    some = torch.zeros(batch.num_systems, dtype=torch.bool)
    some[1::3] = True
    for radius in (2.5, 6.0):
        want = build_rows(batch, list(range(batch.num_systems)), radius)
        assert len(want[0]) > 300 and bool((want[0] == want[1]).any())  # self-images too
        assert_same_edges(cell_list.batched_pairs(batch, radius), want)
        rows = some.nonzero().flatten().tolist()
        want = build_rows(batch, rows, radius)
        assert_same_edges(cell_list.batched_pairs(batch, radius, some), want)


def test_the_builder_is_chosen_by_whether_host_reads_are_free(monkeypatch) -> None:
    """``build_rows`` (what NeighborList rebuilds with) takes the batched builder where
    reads are not free, and gives the same edges; NeighborList's edges are the same."""
    calls: list[int] = []
    batched = cell_list.batched_pairs

    def counted(*args, **kw):
        calls.append(1)
        return batched(*args, **kw)

    monkeypatch.setattr("alchemi_lit.models.pair_search.batched_pairs", counted)
    monkeypatch.setattr("alchemi_lit.models.device_path.batched_pairs", counted)
    batch = Batch.from_atoms(zoo(2) + mixed_structures(3), dtype=DT, validate=False)
    rows = list(range(0, batch.num_systems, 2))
    cpu, cpu_edges = build_rows(batch, rows, 5.0), NeighborList(4.0, 1.0)(batch)
    assert not calls
    monkeypatch.setattr(tensor_ops, "CPU_READS_FREE", False)
    assert_same_edges(build_rows(batch, rows, 5.0), cpu)
    edges = NeighborList(4.0, 1.0)(batch)
    assert len(calls) == 2
    for name in ("i", "j", "vec", "system"):
        assert torch.equal(getattr(edges, name), getattr(cpu_edges, name)), name


def _copper_and_gold(seed: int) -> list[Atoms]:
    rng = np.random.default_rng(seed)
    out = []
    for k, (symbol, a) in enumerate([("Cu", 3.61), ("Au", 4.08), ("Cu", 3.61)]):
        atoms = bulk(symbol, "fcc", a=a, cubic=True).repeat((2, 2, 1 + k % 2))
        atoms.positions += rng.normal(scale=0.08, size=atoms.positions.shape)
        if k == 2:
            atoms.pbc = (True, False, True)
        out.append(atoms)
    return out


@pytest.mark.parametrize(
    ("make", "structures"),
    [
        (lambda: LennardJones(0.0104, 3.40, 6.0, skin=0.5), "argon"),
        (lambda: Morse(epsilon=0.3, rho0=5.0, r0=3.7, skin=0.5), "argon"),
        (lambda: EMT(), "metals"),
    ],
    ids=["lj", "morse", "emt"],
)
def test_forces_through_the_accelerator_path_equal_the_cpu_paths(
    monkeypatch, make, structures
) -> None:
    """Energy, forces and stress are the CPU path's to rounding: the edges and their
    order are the same, and the accelerator's index_add sums the same edge terms as the
    CPU's CSR products in another order -- reordering n terms moves a sum by at most
    (n - 1) eps sum|term|, below 1e-12 of the largest value for the < 100 terms here."""
    if structures == "argon":
        atoms = [*perturbed_argon(2, 2, 0.1, 5), cluster_argon(5.0, 0.1, 6), *mixed_structures(7)]
    else:
        atoms = _copper_and_gold(8)
    batch = Batch.from_atoms(atoms, dtype=DT)
    want = make()(batch, compute_stress=True)
    monkeypatch.setattr(tensor_ops, "CPU_READS_FREE", False)
    got = make()(batch, compute_stress=True)
    for key in ("energy", "forces", "stress"):
        scale = float(want[key].abs().max())
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=1e-12 * scale, msg=key)


def _argon_batch(n_systems: int) -> Batch:
    return Batch.from_atoms(perturbed_argon(n_systems, 2, 0.1, seed=n_systems), dtype=DT)


def test_a_builds_operations_do_not_grow_with_the_number_of_systems(monkeypatch) -> None:
    """The same aten operations build 16 systems or 256 (vesin-torch took a launch
    sequence per system); so does a whole NeighborList rebuild on the accelerator path,
    and a steady call of it."""
    monkeypatch.setattr(tensor_ops, "CPU_READS_FREE", False)
    small, large = _argon_batch(16), _argon_batch(256)
    counts = []
    for batch in (small, large):
        edges, ops, syncs = count_ops(cell_list.batched_pairs, batch, 6.0)
        assert len(edges[0]) > 5 * batch.num_atoms
        counts.append((len(ops), len(syncs)))
    assert counts[0] == counts[1], counts
    assert counts[0][1] <= 8  # the sizes a build reads (output shapes), not per system
    # (on CPU a build primes the heap once per size of edge list: one op, not on a GPU)
    monkeypatch.setattr(device_path, "keep_edge_temporaries_on_heap", lambda n: None)
    calls = []
    for batch in (small, large):
        nl = NeighborList(5.0, 1.0)
        first = count_ops(nl, batch)
        second = count_ops(nl, batch)
        calls.append((len(first[1]), len(second[1]), len(second[2])))
    assert calls[0] == calls[1], calls
    assert calls[0][1] < calls[0][0] / 5  # a steady call is a small share of a build


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_batched_builder_on_cuda_gives_vesins_edges(vesin_only) -> None:
    batch = Batch.from_atoms(zoo(3), dtype=DT, validate=False)
    for radius in (2.5, 6.0):
        want = build_rows(batch, list(range(batch.num_systems)), radius)
        got = [t.cpu() for t in cell_list.batched_pairs(batch.to("cuda"), radius)]
        for k in (0, 1, 3, 4):  # the cartesian shifts: cuBLAS may round differently
            assert torch.equal(got[k], want[k]), k
        torch.testing.assert_close(got[2], want[2], atol=1e-12, rtol=0)
    counts = []
    for n in (16, 256):
        _, ops, _ = count_ops(cell_list.batched_pairs, _argon_batch(n).to("cuda"), 6.0)
        counts.append(len(ops))
    assert counts[0] == counts[1]


def test_a_system_staying_non_finite_costs_one_rebuild_not_one_per_call(monkeypatch) -> None:
    """On the accelerator path a system with one non-finite atom loses its edges at the
    rebuild one call after it turned bad (NaNGuard quarantines it at the next
    bookkeeping); while it stays so, the others moving little (0.02 Å in all, within
    half the 1 Å skin), the list is not rebuilt again at every call; the other
    systems' forces stay ASE's LennardJones's throughout (1e-10 eV/Å)."""
    from ase.calculators.lj import LennardJones as AseLJ

    monkeypatch.setattr(tensor_ops, "CPU_READS_FREE", False)
    systems = perturbed_argon(3, 2, 0.05, seed=8)
    batch = Batch.from_atoms(systems, dtype=DT)
    model = LennardJones(0.0104, 3.40, 5.0, skin=1.0)
    lo = int(batch.ptr[1])
    builds = []
    for call in range(10):
        batch.positions += 0.002
        if call == 2:
            batch.positions[lo] = float("nan")
        out = model(batch)
        builds.append(model.neighbors.num_builds)
    assert builds[3] > builds[2]  # rebuilt once, one call late, without system 1's edges
    assert builds[-1] == builds[3], builds  # and not again
    assert not bool((model.neighbors._system == 1).any())
    for k in (0, 2):
        atoms = systems[k].copy()
        atoms.positions = batch.positions[int(batch.ptr[k]) : int(batch.ptr[k + 1])].numpy()
        atoms.calc = AseLJ(epsilon=0.0104, sigma=3.40, rc=5.0)
        got = out["forces"][int(batch.ptr[k]) : int(batch.ptr[k + 1])].numpy()
        np.testing.assert_allclose(got, atoms.get_forces(), rtol=0, atol=1e-10)


def test_a_refill_after_the_cells_were_squeezed_keeps_their_strain_in_the_skin_check() -> None:
    """Kept systems whose cells were squeezed since their build (a barostat, 2 % per call
    for 5 calls) have less skin left for their atoms' moves; a refill building only a
    joining system must not make the skin check forget that strain: the steady calls
    after it (the cell unchanged, atoms moving ~0.07 Å a call) need no late correction
    (no violation of the skin) and give a fresh list's forces bit for bit.  Two Ar atoms
    in 4 Å cubic cells (narrower than the 6 Å radius: images matter)."""
    from alchemi_lit.testing import accelerator_path

    rng = np.random.default_rng(2)
    systems = [Atoms("Ar2", positions=rng.uniform(0, 4, (2, 3)), cell=[4.0] * 3, pbc=True)
               for _ in range(3)]  # fmt: skip
    lj = dict(epsilon=0.0104, sigma=3.40, cutoff=5.0, skin=1.0)
    with accelerator_path():
        first = Batch.from_atoms(systems, dtype=DT)
        model = LennardJones(**lj)
        model(first)
        for _ in range(5):
            squeeze = torch.eye(3, dtype=DT) * 0.98
            first.cell = first.cell @ squeeze  # (a new tensor, as the barostats set it)
            first.positions = first.positions @ squeeze
            model(first)
        keep = torch.tensor([0, 2])
        kept = first.select(keep)
        model.neighbors.remap(first.ptr, keep, kept)  # a graduation
        joining = Batch.from_atoms([systems[1]], system_ids=[7], dtype=DT)
        merged = Batch.concatenate([kept, joining])
        model.neighbors.remap(kept.ptr, torch.tensor([0, 1, -1]), merged)  # a refill
        gen = torch.Generator().manual_seed(2)
        for _ in range(12):
            merged.positions += 0.04 * torch.randn(merged.positions.shape, generator=gen, dtype=DT)
            out = model(merged)
            assert torch.equal(out["forces"], LennardJones(**lj)(merged)["forces"])
    assert model.neighbors.skin_watch.violations == 0
