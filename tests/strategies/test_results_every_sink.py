"""The Results a run returns, for every kind of sink under every strategy.

Each sink setup (none, HostMemory, ZarrSink, a bounded HostMemory chained before a
ZarrSink) runs under ``single``, ``replicas`` and ``pipeline``; the returned Results
must be usable (``len``, ``print``, ``to_pandas``) and equal what the store reads back
(:func:`read_results`), and together with the store hold every system once, in the
state the one-process fused run gives.  The ranks here are forked (rank 0 is a child
process); the launches where rank 0 is the calling process itself -- popen, torchrun,
SLURM, the launches where the returned Results once named a removed per-rank store --
are in ``test_multinode.py`` (slow tier).
"""

from __future__ import annotations

import pytest
import torch

import alchemi_lit as al
from alchemi_lit.core.state import Batch
from alchemi_lit.data import SizeAwareSampler, mixed_argon
from alchemi_lit.integrators import FIRE, Langevin
from alchemi_lit.models import LennardJones
from alchemi_lit.sinks import HostMemory, ZarrSink, read_results
from alchemi_lit.strategies.buffers import BufferConfig

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(120)]

N = 16
KEPT = 3  # what the bounded HostMemory of the chain keeps (per writing rank)
SINKS = ("none", "memory", "zarr", "chain")
STRATEGIES = ("single", "replicas", "pipeline")


def structures() -> list:
    return mixed_argon(N, 8, 30, seed=4)


def model() -> LennardJones:
    return LennardJones(epsilon=0.0104, sigma=3.40, cutoff=6.0)


def plan(strategy: str):
    relax = FIRE(fmax=0.05, max_steps=25)
    md = Langevin(dt=2.0, temperature=50.0, friction=0.02, steps=8)
    return relax | md if strategy == "pipeline" else relax + md


def sinks_of(kind: str, store) -> list | None:
    return {
        "none": None,
        "memory": [HostMemory()],
        "zarr": [ZarrSink(store)],
        "chain": [HostMemory(capacity=KEPT), ZarrSink(store)],
    }[kind]


def run(strategy: str, sinks: list | None) -> al.Results:
    kwargs = {}
    if strategy != "single":
        kwargs = dict(
            strategy=strategy, devices=2, start_method="fork", timeout=60.0,
            buffer=BufferConfig(num_systems=8, num_atoms=200),
        )  # fmt: skip
    sim = al.Simulator(model=model(), stages=plan(strategy), sinks=sinks, sync_every=4, **kwargs)
    return sim.run(SizeAwareSampler(structures(), max_atoms=200))


_REFERENCE: list[Batch] = []


def reference() -> Batch:
    """The one-process fused run, every system in memory."""
    if not _REFERENCE:
        _REFERENCE.append(run("single", None).batch)
    return _REFERENCE[0]


def same_systems(got: Batch, ref: Batch) -> None:
    """``got`` holds the systems of ``ref`` with these ids, in the same final state."""
    rows = torch.searchsorted(ref.system_id, got.system_id)
    want = ref.select(rows)
    assert torch.equal(got.system_id, want.system_id)
    for name in ("positions", "velocities", "forces", "atomic_numbers"):
        assert torch.equal(got.atom[name], want.atom[name]), name
    for name in ("energy", "total_steps", "converged", "exit_code", "n_atoms"):
        assert torch.equal(got.system[name], want.system[name]), name


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("kind", SINKS)
def test_returned_results_are_usable_and_match_the_store(tmp_path, strategy, kind):
    store = tmp_path / "results.zarr"
    results = run(strategy, sinks_of(kind, store))
    assert "Results(systems=" in repr(results)
    table = results.to_pandas()
    assert len(table) == len(results)
    assert results.stats["systems"] == N
    ref = reference()
    if kind in ("zarr", "chain"):
        assert not list(tmp_path.glob("results.rank*")), "per-rank stores left behind"
        stored = read_results(store)
    if kind == "zarr":  # the Results are the store's systems, read lazily
        assert len(results) == N
        assert table.equals(stored.to_pandas())
        same_systems(results.batch, ref)
    elif kind == "chain":  # the HostMemory's share in the Results, the rest in the store
        writers = 2 if strategy == "replicas" else 1
        assert len(results) == KEPT * writers
        assert f"went to later sinks in {store}" in repr(results)
        ids = results.system_id.tolist() + stored.system_id.tolist()
        assert sorted(ids) == list(range(N)), "lost or duplicated"
        same_systems(results.batch, ref)
        same_systems(stored.batch, ref)
    else:
        assert results.system_id.tolist() == list(range(N))
        same_systems(results.batch, ref)
