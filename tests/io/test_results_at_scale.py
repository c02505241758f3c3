"""A results store of 10,240 tiny systems (8-atom cells): appended with flat memory, read lazily.

Memory is measured with ``tracemalloc`` (NumPy's buffers, which the store's arrays are
read into, are traced), never time: ``len`` reads only the commit marker, a column
subset of ``to_pandas`` and ``iter_atoms`` hold one chunk at a time, and each append
costs the same whatever the store already holds.  Sharding is measured in files.
"""

from __future__ import annotations

import gc
import itertools
import math
import tracemalloc

import numpy as np
import pytest
import torch
import zarr
from ase.build import bulk

import alchemi_lit as al
from alchemi_lit.sinks import ZarrSink, read_results

N, FLUSH = 10_240, 512  # 20 appends, 20 chunks a column
CELL = bulk("Ar", "fcc", a=5.26, cubic=True).repeat((2, 1, 1))  # 8 atoms, as in the issue


_TEMPLATE: list[al.Batch] = []


def batch_of(first: int, n: int) -> al.Batch:
    """Systems ``first ..`` of the store: copies of one 8-atom cell with distinct energies."""
    if not _TEMPLATE:
        _TEMPLATE.append(al.Batch.from_atoms([CELL] * FLUSH))
    batch = _TEMPLATE[0].select(torch.arange(n)).clone()
    batch.system["system_id"] = torch.arange(first, first + n)
    batch.energy.copy_(-1.0 + torch.arange(first, first + n, dtype=batch.energy.dtype) / N)
    batch.system["stress"].fill_(0.01)  # (arrays of fill values store no chunks at all)
    return batch


def write_store(path, shards=None) -> list[int]:
    """The store of N dimers, FLUSH at a time; the traced peak of each append."""
    sink = ZarrSink(path, flush_every=FLUSH, shards=shards)
    sink.open({})
    peaks = []
    for first in range(0, N, FLUSH):
        batch = batch_of(first, min(FLUSH, N - first))
        gc.collect()  # (garbage of the previous flush is not this one's cost)
        tracemalloc.reset_peak()
        sink.write(batch)
        sink.flush()
        peaks.append(tracemalloc.get_traced_memory()[1])
    sink.close()
    return peaks


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("scale") / "big.zarr"
    tracemalloc.start()
    try:
        peaks = write_store(path)
    finally:
        tracemalloc.stop()
    return path, peaks


@pytest.fixture(scope="module", autouse=True)
def warm(tmp_path_factory):
    """Every reader run once on a small store: one-time costs (imports) are not what
    the tests measure."""
    path = tmp_path_factory.mktemp("warm") / "small.zarr"
    sink = ZarrSink(path)
    sink.open({})
    sink.write(batch_of(0, 3))
    sink.close()
    read_results(path).to_pandas(columns=["system_id"], chunk_systems=2)
    read_results(path).to_pandas()
    list(read_results(path).iter_atoms(chunk_systems=2))


def atom_bytes(path) -> int:
    """What the store's per-atom arrays hold: a reader that loads them all needs more."""
    group = zarr.open_group(str(path), mode="r")["atoms"]
    return sum(a.nbytes for _, a in group.arrays())


def traced_peak(fn) -> tuple[object, int]:
    """fn() and the peak of memory traced while it ran (above what was held before)."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        out = fn()
        return out, tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def test_appending_costs_the_same_whatever_the_store_holds(store):
    _, peaks = store
    first, last = np.mean(peaks[1:4]), np.mean(peaks[-4:-1])  # (not the short last one)
    # memory growing with the store would be several times larger by the last flushes
    assert last < 2 * first, f"append memory grew with the store: {peaks}"


def test_len_reads_no_systems(store):
    path, _ = store
    results, _ = traced_peak(lambda: read_results(path))
    n, peak = traced_peak(lambda: len(results))
    assert n == N
    assert peak < 40_000  # bytes: the ids alone would be 82 kB, the atoms ~8 MB
    text, peak = traced_peak(lambda: repr(results))  # print(results): two columns read
    assert text == f"Results(systems={N}, converged=0, steps=0)"
    assert peak < 1_000_000
    assert results._batch is None  # nothing was loaded


def test_a_column_subset_is_read_a_chunk_at_a_time(store):
    path, _ = store
    subset, chunked = traced_peak(
        lambda: read_results(path).to_pandas(columns=["system_id", "energy"], chunk_systems=512)
    )
    assert list(subset.columns) == ["system_id", "energy"]
    assert subset.system_id.tolist() == list(range(N))
    assert np.array_equal(subset.energy, -1.0 + np.arange(N) / N)
    assert chunked < atom_bytes(path) / 4, (chunked, atom_bytes(path))
    with pytest.raises(ValueError, match=r"unknown Results column\(s\) \['enrgy'\]"):
        read_results(path).to_pandas(columns=["enrgy"])


def test_atoms_are_made_a_chunk_at_a_time(store):
    path, _ = store

    def ids(n: int) -> list[int]:  # the first n, holding none of them
        atoms = read_results(path).iter_atoms(chunk_systems=256)
        return [a.info["system_id"] for a in itertools.islice(atoms, n)]

    got, streamed = traced_peak(lambda: ids(16 * 256))  # 16 chunks: enough to accumulate
    assert got == list(range(16 * 256))
    assert streamed < atom_bytes(path) / 2, (streamed, atom_bytes(path))
    first = next(read_results(path).iter_atoms())
    assert first.get_chemical_formula() == "Ar8"


def test_sharding_puts_many_chunks_in_few_files(store, tmp_path):
    path, _ = store
    sharded = tmp_path / "sharded.zarr"
    write_store(sharded, shards=16)
    plain_group, sharded_group = (zarr.open_group(str(p), mode="r") for p in (path, sharded))
    for name in ("systems/energy", "systems/stress", "atoms/positions"):
        plain = plain_group[name]
        assert sharded_group[name].shards == (plain.chunks[0] * 16, *plain.chunks[1:])
        chunks = math.ceil(plain.shape[0] / plain.chunks[0])
        assert chunks >= 10  # the measurement means something
        plain_files = sum(1 for p in (path / name).rglob("*") if p.is_file()) - 1  # zarr.json
        shard_files = sum(1 for p in (sharded / name).rglob("*") if p.is_file()) - 1
        assert plain_files == chunks
        assert shard_files == math.ceil(chunks / 16)
    columns = ["system_id", "energy", "n_atoms"]
    assert read_results(sharded).to_pandas(columns).equals(read_results(path).to_pandas(columns))
    assert np.array_equal(
        read_results(sharded).batch.positions.numpy(), read_results(path).batch.positions.numpy()
    )
