"""The accelerator path's neighbour list reads nothing on the host in a steady call and
stays exact (issue #26, part 2): its skin check is read one call late, and a due
rebuild rebuilds every system.

Run on CPU with ``tensor_ops.CPU_READS_FREE = False``, counting what would be a host
read on a GPU (``device_counting``); tests marked ``cuda`` count real syncs on a GPU.
"""

from __future__ import annotations

import contextlib
import logging
import warnings

import numpy as np
import pytest
import torch
from device_counting import watch_calls

import alchemi_lit as al
from alchemi_lit import Batch
from alchemi_lit.integrators import Langevin
from alchemi_lit.models import LennardJones, NeighborList
from alchemi_lit.models.skin_watch import strain_limits
from alchemi_lit.testing import accelerator_path
from conftest import perturbed_argon, triclinic_argon

DT = torch.float64
LJ = {"epsilon": 0.0104, "sigma": 3.40, "cutoff": 5.0, "skin": 1.0}


@pytest.fixture
def accelerator():
    """The accelerator's path on CPU (testing.accelerator_path)."""
    with accelerator_path():
        yield


def fresh_forces(batch: Batch, **kw) -> dict[str, torch.Tensor]:
    """The result with a list built now, on the same path (the exact reference: the
    same edges in the same order and the same reductions, so equal to the bit)."""
    return LennardJones(**{**LJ, **kw})(batch, compute_stress=True)


class Checked(LennardJones):
    """LJ whose every step's result is compared with a fresh list's, bit for bit."""

    def __init__(self) -> None:
        super().__init__(**LJ)
        self.calls = 0
        self.rebuilt_at: list[int] = []

    def forward(self, batch, compute_stress=None, neighbors=None):
        builds = self.neighbors.num_builds
        out = super().forward(batch, compute_stress=True, neighbors=neighbors)
        if neighbors is None:
            if self.neighbors.num_builds != builds:
                self.rebuilt_at.append(self.calls)
            self.calls += 1
            want = fresh_forces(batch)
            for key in ("energy", "forces", "stress"):
                assert torch.equal(out[key], want[key]), (self.calls, key)
        return out


def test_a_long_md_run_keeps_the_list_exact_and_reads_the_host_in_few_calls(
    accelerator, monkeypatch
) -> None:
    """Langevin NVT of argon (60 K, dt 5 fs, 200 steps): every step's forces equal a fresh
    list's bit for bit, the list is rebuilt a few times (all systems at once), and only
    the calls that build read anything on the host (< 10 % of the calls)."""
    model = Checked()
    atoms = [*perturbed_argon(3, 2, 0.05, seed=1), triclinic_argon(2, 0.05, 0.04, seed=2)]
    stage = Langevin(dt=5.0, temperature=60.0, friction=0.01, steps=200)
    sim = al.Simulator(model=model, stages=stage, accelerator="cpu")
    with watch_calls(monkeypatch, NeighborList, "__call__", only=model.neighbors) as record:
        sim.run(atoms)
    assert model.calls == len(record.calls) >= 200
    watch = model.neighbors.skin_watch
    assert watch.violations == 0
    assert 2 <= len(model.rebuilt_at) - 1 <= 10, model.rebuilt_at  # rebuilds beyond the first
    assert model.neighbors.num_builds == len(model.rebuilt_at) * len(atoms)  # all at once
    reading = [k for k, (_, reads) in enumerate(record.calls) if reads]
    assert set(reading) <= set(model.rebuilt_at) | {1}, (reading, model.rebuilt_at)
    assert watch.exact_reads == 1  # the call after the first build: no history yet
    assert len(reading) < 0.1 * len(record.calls)
    steady = [ops for k, (ops, _) in enumerate(record.calls) if k not in reading]
    # a steady call: the check and the edge vectors (NaNGuard's restore, run on every
    # step here, leaves an untouched cell the same tensor: no strain computed; row sums
    # are column additions, two operations where a product with ones was one: #41)
    assert max(steady) < 62


def _move(batch: Batch, step: torch.Tensor, row: int) -> None:
    lo, hi = batch.ptr[row : row + 2].tolist()
    batch.positions[lo:hi] += step


def test_the_late_check_rebuilds_before_an_atom_moved_half_the_skin(accelerator) -> None:
    """Atoms drifting at a steady speed: the list is rebuilt in time (the exact check
    never finds it stale), and not much earlier than needed."""
    batch = Batch.from_atoms(perturbed_argon(3, 2, 0.05, seed=3), dtype=DT)
    nl = NeighborList(5.0, 1.0)
    gen = torch.Generator().manual_seed(0)
    drift = torch.tensor([0.021, -0.013, 0.008], dtype=DT)
    builds = []
    for _ in range(120):
        jitter = 0.002 * torch.randn(batch.positions.shape, generator=gen, dtype=DT)
        batch.positions += jitter
        _move(batch, drift, 1)
        before = nl.num_builds
        nl(batch)
        builds.append(nl.num_builds > before)
        assert not bool(nl.needs_rebuild(batch).any())  # the list in use is exact
    # |drift| 0.026 Å a call: 0.5 Å of skin lasts ~19 calls; rebuilt a few calls early
    gaps = np.diff(np.nonzero(builds)[0])
    assert len(gaps) >= 4 and gaps.min() >= 12, gaps
    assert nl.skin_watch.violations == 0


def test_a_sudden_jump_is_caught_one_call_late_with_a_warning(accelerator, caplog) -> None:
    """A move far beyond the last rate (no integrator makes one) leaves one call with a
    stale list: the next call counts it, warns, rebuilds and grows its margin."""
    batch = Batch.from_atoms(perturbed_argon(2, 2, 0.05, seed=4), dtype=DT)
    nl = NeighborList(5.0, 1.0)
    for _ in range(4):
        batch.positions += 0.005
        nl(batch)
    _move(batch, torch.tensor([0.7, 0.0, 0.0], dtype=DT), 0)
    before = nl.num_builds
    nl(batch)
    assert nl.num_builds == before  # not seen yet: this call's list is stale
    assert bool(nl.needs_rebuild(batch).any())
    with caplog.at_level(logging.WARNING, logger="alchemi_lit.models.skin_watch"):
        nl(batch)
    assert nl.skin_watch.violations == 1 and "past the skin" in caplog.text
    assert nl.num_builds == before + batch.num_systems
    assert nl.skin_watch.safety == 6.0


@pytest.mark.parametrize("step", [0.03, 0.2])
def test_a_call_moving_up_to_safety_times_the_last_keeps_the_list_exact(accelerator, step) -> None:
    """The late check's promise (``skin_watch``'s module doc): the list stays exact as long
    as no call moves an atom more than ``safety`` (3) times as far as the call before,
    wherever in the list's life that call comes -- right after a rebuild too, when the
    list is ``skin / 2`` from its limit (with 0.2 A steps a call, every call rebuilds).
    A check without the margin, or one that took a rebuilt list for a whole skin from
    its limit, kept lists that such a call outran."""
    base = Batch.from_atoms(perturbed_argon(1, 2, 0.05, seed=6), dtype=DT)
    atom = 3
    move = step * torch.tensor([0.6, -0.48, 0.64], dtype=DT)
    for jump_at in range(1, 18 if step < 0.1 else 5):  # every phase of the first skin
        batch, nl = base.clone(), NeighborList(5.0, 1.0)
        for call in range(jump_at + 1):
            if call:
                batch.positions[atom] += move * (2.9 if call == jump_at else 1.0)
            nl(batch)
            assert not bool(nl.needs_rebuild(batch).any()), (jump_at, call)
        assert nl.skin_watch.violations == 0


def test_a_steadily_compressed_cell_is_rebuilt_before_its_limit_runs_out(accelerator) -> None:
    """A barostat compressing the cell: the atoms follow the cell (no move beyond the
    affine one), but the limit of their moves (``skin / 2`` in the cell built in) drops
    at every call, and the late check counts that drop in its rate; with the drop's
    sign flipped the list was kept one call past its limit."""
    batch = Batch.from_atoms(perturbed_argon(2, 2, 0.05, seed=7), dtype=DT)
    nl = NeighborList(5.0, 1.0)
    for call in range(40):
        batch.cell = batch.cell * 0.99  # (new tensors, as the barostats set them)
        batch.positions = batch.positions * 0.99
        nl(batch)
        assert not bool(nl.needs_rebuild(batch).any()), call
    assert nl.num_builds >= 3 * batch.num_systems  # (rebuilt twice at least)
    assert nl.skin_watch.violations == 0


def test_atoms_following_a_sheared_cell_have_not_moved(accelerator) -> None:
    """Atoms that follow their cell's deformation (positions ``r0 M`` as the cell is
    ``h0 M``, row vectors) have not moved as far as the list is concerned: a shear
    within the limit keeps the list on the accelerator's path as on the CPU's (taking
    the strain as ``M^T`` counted ``r0 (M - M^T)``, up to ~0.8 A here, as a move)."""
    batch = Batch.from_atoms(perturbed_argon(2, 2, 0.05, seed=9), dtype=DT)
    counts = []
    for path in (accelerator_path, contextlib.nullcontext):
        with path():
            copy, nl = batch.clone(), NeighborList(5.0, 1.0)
            nl(copy)
            for _ in range(4):  # a shear of 0.08 in four calls
                shear = torch.eye(3, dtype=DT)
                shear[1, 0] = 0.02
                copy.cell = copy.cell @ shear
                copy.positions = copy.positions @ shear
                nl(copy)
                assert not bool(nl.needs_rebuild(copy).any())
            counts.append(nl.num_builds)
    assert counts == [batch.num_systems] * 2


def _drive(nl: NeighborList, batch: Batch, moves: list[torch.Tensor], graphed: bool) -> list:
    """Call ``nl`` once per move, eagerly or as ``engine.cuda_graph.GraphedSteps`` does
    (replay -- an in-graph call, its measure published -- while the late check keeps
    the list, else one eager call, then a capture, an in-graph call); whether each call
    built.  The list in use must be exact at every call."""
    builds, replaying, eager_before = [], False, False
    for move in moves:
        batch.positions += move
        before = nl.num_builds
        if replaying and not nl.skin_watch.keeps():
            replaying = False
        if graphed and (replaying or (eager_before and nl.ready_for_graph(batch))):
            nl.in_graph = True
            nl(batch)
            nl.in_graph = False
            nl.skin_watch.publish_graph()
            replaying, eager_before = True, False
        else:
            nl(batch)
            eager_before = True
        builds.append(nl.num_builds > before)
        assert not bool(nl.needs_rebuild(batch).any()), len(builds)  # exact
    return builds


def test_graph_replays_rebuild_when_the_eager_path_does(accelerator) -> None:
    """Under CUDA graphs the skin is measured in the graph and read one replay late: a
    drift must stop the replays and rebuild at the very calls the eager path rebuilds,
    with no exact read and no violation (a measure truncated to integers never
    rebuilt; a refusal that the eager call after it did not act on left that call to
    an exact check with no margin, and the capture after it ran on an inexact list)."""
    gen = torch.Generator().manual_seed(5)
    batch = Batch.from_atoms(perturbed_argon(2, 2, 0.05, seed=5), dtype=DT)
    moves = [0.002 * torch.randn(batch.positions.shape, generator=gen, dtype=DT)
             for _ in range(70)]  # fmt: skip
    lo, hi = batch.ptr[1:3].tolist()
    for move in moves:
        move[lo:hi] += torch.tensor([0.021, -0.013, 0.008], dtype=DT)
    eager = _drive(NeighborList(5.0, 1.0), batch.clone(), moves, graphed=False)
    nl = NeighborList(5.0, 1.0)
    assert _drive(nl, batch.clone(), moves, graphed=True) == eager
    assert sum(eager) >= 4  # (the first build and rebuilds)
    # (the call after the first build is a capture: no exact read, eagerly one)
    assert nl.skin_watch.violations == 0 and nl.skin_watch.exact_reads == 0


def test_changing_cells_keep_the_list_exact_without_reads(accelerator, monkeypatch) -> None:
    """A barostat's cells: kept lists get their shifts in the new cell on the device,
    forces equal a fresh list's bit for bit, and steady calls read nothing."""
    batch = Batch.from_atoms([triclinic_argon(2, seed=3), *perturbed_argon(2, 2, 0.1, seed=4)])
    model = LennardJones(**LJ)
    gen = torch.Generator().manual_seed(1)
    with watch_calls(monkeypatch, NeighborList, "__call__", only=model.neighbors) as record:
        for _ in range(40):
            strain = torch.eye(3, dtype=DT) + 0.002 * torch.randn(3, 3, generator=gen, dtype=DT)
            batch.cell = batch.cell @ strain  # (a new tensor, as the barostats set it)
            batch.positions = batch.positions @ strain
            batch.positions += 0.01 * torch.randn(batch.positions.shape, generator=gen, dtype=DT)
            out = model(batch, compute_stress=True)
            want = fresh_forces(batch)
            for key in ("energy", "forces", "stress"):
                assert torch.equal(out[key], want[key]), key
    reading = sum(bool(reads) for _, reads in record.calls)
    builds = model.neighbors.num_builds // batch.num_systems
    assert builds < 10 and reading <= builds + 1, (builds, reading)


def test_the_strain_limit_is_a_lower_bound_of_the_exact_one() -> None:
    """Without a sync (no LAPACK error check), the smallest singular value of the strain
    comes from a closed form, less a margin for rounding: never later than the exact
    rule (``svdvals``), and no more than a hair earlier."""
    gen = torch.Generator().manual_seed(2)
    ref = 6.0 * torch.eye(3, dtype=DT) + torch.randn(64, 3, 3, generator=gen, dtype=DT)
    strain = torch.eye(3, dtype=DT) + 0.03 * torch.randn(64, 3, 3, generator=gen, dtype=DT)
    strain[:8] = torch.diag_embed(1 + 0.03 * torch.randn(8, 3, generator=gen, dtype=DT))
    strain[8] = torch.eye(3, dtype=DT) * 1.01  # a triple singular value
    m, limit = strain_limits(ref, ref @ strain, 5.0, 1.0)
    torch.testing.assert_close(m, strain, atol=1e-12, rtol=0)
    exact = 0.5 * (6.0 * torch.linalg.svdvals(strain)[:, -1] - 5.0)
    assert bool((limit <= exact).all())
    torch.testing.assert_close(limit, exact, atol=1e-7, rtol=0)
    same = strain_limits(ref, ref.clone(), 5.0, 1.0)[1]
    assert bool((same == 0.5).all())
    singular = ref.clone()
    singular[3, 2] = singular[3, 0]
    assert float(strain_limits(ref, singular, 5.0, 1.0)[1][3]) < 0  # (rebuilt)
    nan_cell = ref.clone()
    nan_cell[5, 1, 1] = float("nan")
    assert bool(strain_limits(ref, nan_cell, 5.0, 1.0)[1][5].isnan())


def test_a_refill_builds_only_the_new_systems_and_reads_no_history(
    accelerator, monkeypatch
) -> None:
    """Systems leaving and joining (``remap``, at a bookkeeping): the kept systems keep
    their edges, history and cells (steady calls after a graduation read nothing and
    compute no strain), the new ones are built and merged at the next call; edges and
    forces equal a fresh list's throughout, and no exact read is needed."""
    first = Batch.from_atoms(perturbed_argon(4, 2, 0.1, seed=5), dtype=DT)
    model = LennardJones(**LJ)
    for _ in range(3):
        first.positions += 0.01
        model(first)
    exact = model.neighbors.skin_watch.exact_reads

    def steps(batch: Batch, n: int) -> None:
        for _ in range(n):
            batch.positions += 0.01
            out = model(batch, compute_stress=True)
            want = fresh_forces(batch)
            for key in ("energy", "forces", "stress"):
                assert torch.equal(out[key], want[key]), key

    keep = torch.tensor([0, 2, 3])
    kept = first.select(keep)
    model.neighbors.remap(first.ptr, keep, kept)  # a graduation
    builds = model.neighbors.num_builds
    with watch_calls(monkeypatch, NeighborList, "__call__", only=model.neighbors) as record:
        steps(kept, 3)
    assert record.calls_with_reads == 0 and max(ops for ops, _ in record.calls) < 62, record.calls
    joining = Batch.from_atoms([triclinic_argon(2, seed=6)], system_ids=[7], dtype=DT)
    merged = Batch.concatenate([kept, joining])
    model.neighbors.remap(kept.ptr, torch.tensor([0, 1, 2, -1]), merged)  # a refill
    steps(merged, 5)
    assert model.neighbors.num_builds == builds + 1  # the joining system only
    assert model.neighbors.skin_watch.exact_reads == exact


def test_a_system_turning_non_finite_loses_its_edges_and_gets_them_back(accelerator) -> None:
    """A diverged system gets no edges (NaNGuard quarantines it) at the rebuild after
    the call that saw it, and its edges again once it is finite (a restored snapshot);
    the other systems' forces stay exact throughout."""
    batch = Batch.from_atoms(perturbed_argon(3, 2, 0.05, seed=8), dtype=DT)
    model = LennardJones(**LJ)
    lo = int(batch.ptr[1])
    saved = batch.positions[lo].clone()
    edges_of_1 = []
    for call in range(10):
        batch.positions += 0.002
        if call == 3:
            batch.positions[lo] = float("nan")
        if call == 6:
            batch.positions[lo] = saved + 0.002 * (call + 1)
        out = model(batch)
        edges_of_1.append(int((model.neighbors._system == 1).sum()))
        want = fresh_forces(batch)
        rows = batch.system_idx != 1
        assert torch.equal(out["forces"][rows], want["forces"][rows]), call
        if call >= 8:
            assert torch.equal(out["forces"], want["forces"]), call
    assert edges_of_1[4] == 0 and edges_of_1[3] > 0  # rebuilt one call late, without them
    assert edges_of_1[-1] == edges_of_1[0]
    assert model.neighbors.skin_watch.violations == 0


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_steady_md_on_cuda_does_not_sync_in_the_neighbour_list(monkeypatch) -> None:
    """On a GPU, counted by ``torch.cuda.set_sync_debug_mode``: a steady call of the
    list makes no blocking sync; forces agree with the CPU's."""
    model = LennardJones(**LJ)
    synced: list[int] = []
    original = NeighborList.__call__

    def watched(self, batch):
        if self is not model.neighbors:
            return original(self, batch)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                return original(self, batch)
            finally:
                torch.cuda.set_sync_debug_mode(0)
                synced.append(sum("synchroniz" in str(w.message) for w in caught))

    monkeypatch.setattr(NeighborList, "__call__", watched)
    atoms = perturbed_argon(8, 2, 0.05, seed=7)
    sim = al.Simulator(
        model=model,
        stages=Langevin(dt=4.0, temperature=60.0, friction=0.01, steps=200),
        accelerator="cuda",
    )
    res = sim.run(atoms)
    assert sum(n > 0 for n in synced) < 0.1 * len(synced), synced
    assert model.neighbors.skin_watch.violations == 0
    final = Batch.from_atoms(res.to_atoms(), dtype=DT)
    got = LennardJones(**LJ).to("cuda")(final.to("cuda"))["forces"].cpu()
    torch.testing.assert_close(got, fresh_forces(final)["forces"], atol=1e-10, rtol=0)


def test_one_model_can_run_on_either_path_one_run_after_the_other() -> None:
    """A list kept by the accelerator's path is started over by the CPU's (and the
    other way round): each run equals the same run with a fresh model."""
    import alchemi_lit as al
    from alchemi_lit.integrators import FIRE

    data = [a.copy() for a in perturbed_argon(6, 2, 0.1, seed=1)]
    model = LennardJones(**LJ)

    def relax(m: LennardJones) -> torch.Tensor:
        stage = FIRE(fmax=0.05, max_steps=30)
        return al.Simulator(model=m, stages=stage, precision="64").run(data).batch.positions

    for path in (accelerator_path, contextlib.nullcontext, accelerator_path):
        with path():
            torch.testing.assert_close(relax(model), relax(LennardJones(**LJ)), rtol=0, atol=0)


def test_a_list_kept_by_the_accelerators_path_is_started_over_on_the_cpus() -> None:
    """The same batch (same layout) through the accelerator's path, then the CPU's: the
    CPU's path builds its own list, with its reduction aids, so the forces equal a
    fresh CPU list's to the bit (kept as it was, the list had no aids, and the forces
    were summed in another order)."""
    batch = Batch.from_atoms(perturbed_argon(3, 2, 0.1, seed=1), dtype=DT)
    model = LennardJones(**LJ)
    with accelerator_path():
        model(batch)
        batch.positions += 0.01
        model(batch)
    batch.positions += 0.01
    ours = model(batch, compute_stress=True)
    want = LennardJones(**LJ)(batch, compute_stress=True)
    for key in ("energy", "forces", "stress"):
        assert torch.equal(ours[key], want[key]), key
