"""merge_stores: the shards of a campaign joined once, resumable, refusing conflicts.

The shards are runs over disjoint slices of one data set (their system_ids global, as
``alchemi-lit run --shard i/n`` numbers them); their merge must equal the one run over
all of it, bit for bit (a system's path does not depend on its batch-mates).
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
import zarr

import alchemi_lit as al
from alchemi_lit.core.errors import ConfigError
from alchemi_lit.data import SizeAwareSampler, mixed_argon
from alchemi_lit.integrators import FIRE, Langevin
from alchemi_lit.models import LennardJones
from alchemi_lit.sinks import ZarrSink, merge_stores, read_results
from alchemi_lit.sinks import merge as merge_module
from alchemi_lit.sinks.merge import store_identity

N, SHARDS = 18, 3
DATA = mixed_argon(N, 8, 30, seed=6)


def run_into(store, ids: list[int], temperature: float = 50.0, sinks=None) -> al.Results:
    sim = al.Simulator(
        model=LennardJones(epsilon=0.0104, sigma=3.40, cutoff=6.0),
        stages=FIRE(fmax=0.05, max_steps=20)
        + Langevin(dt=2.0, temperature=temperature, friction=0.02, steps=5),
        sinks=sinks if sinks is not None else [ZarrSink(store)],
        sync_every=4,
    )
    sampler = SizeAwareSampler([DATA[i % N] for i in ids], max_atoms=150, system_ids=ids)
    return sim.run(sampler)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Three shard stores (ids i::3) and the one-run reference, in memory."""
    folder = tmp_path_factory.mktemp("shards")
    stores = []
    for i in range(SHARDS):
        stores.append(folder / f"results.shard-{i}-of-{SHARDS}.zarr")
        run_into(stores[-1], list(range(i, N, SHARDS)))
    reference = run_into(None, list(range(N)), sinks=[al.sinks.HostMemory()]).batch
    return stores, reference


def assert_same(batch, ref) -> None:
    assert batch.system_id.tolist() == ref.system_id.tolist()
    for name in ("positions", "velocities", "forces", "atomic_numbers"):
        assert torch.equal(batch.atom[name], ref.atom[name]), name
    for name in ("energy", "total_steps", "converged", "exit_code", "stage_steps"):
        assert torch.equal(batch.system[name], ref.system[name]), name


def test_shards_merged_equal_one_run(shards, tmp_path):
    stores, ref = shards
    out = tmp_path / "merged.zarr"
    report = merge_stores(out, stores, chunk_systems=4)  # several chunks per shard
    assert report["systems"] == N and report["duplicates"] == 0
    merged = read_results(out)
    assert_same(merged.batch, ref)
    # each shard's run entry, with its statistics, is a run of the merged store
    for k in range(SHARDS):
        part = read_results(out, run=k)
        assert part.system_id.tolist() == list(range(k, N, SHARDS))
        assert part.stats["systems"] == N // SHARDS
    runs = zarr.open_group(str(out), mode="r").attrs["runs"]
    assert [r["merged_from"] for r in runs] == [str(s) for s in stores]
    assert [m["path"] for m in zarr.open_group(str(out), mode="r").attrs["merged"]] == [
        str(s) for s in stores
    ]


def test_a_merge_run_again_adds_nothing_and_a_new_shard_is_added(shards, tmp_path):
    stores, ref = shards
    out = tmp_path / "merged.zarr"
    merge_stores(out, stores[:2])
    again = merge_stores(out, stores[:2])
    assert again["systems"] == 0 and again["skipped"] == [str(s) for s in stores[:2]]
    more = merge_stores(out, stores)  # the third shard finished later
    assert more["systems"] == N // SHARDS
    assert_same(read_results(out).batch, ref)


def test_identical_rows_are_stored_once(shards, tmp_path):
    stores, ref = shards
    copy = tmp_path / "copy.zarr"
    shutil.copytree(stores[0], copy)
    zarr.open_group(str(copy), mode="r+").attrs["note"] = "a copy"  # same rows
    out = tmp_path / "merged.zarr"
    report = merge_stores(out, [*stores, copy])
    assert report["systems"] == N  # the copy adds nothing: its identity is the shard's
    # a store holding the same systems under another identity: rows compared, deduplicated
    overlap = tmp_path / "overlap.zarr"
    run_into(overlap, [0, 3, 1])  # 0 and 3 as in shard 0, 1 as in shard 1
    report = merge_stores(out, [overlap])
    assert report["systems"] == 0 and report["duplicates"] == 3
    assert_same(read_results(out).batch, ref)


def test_conflicting_rows_are_refused_before_anything_is_written(shards, tmp_path):
    stores, _ = shards
    other = tmp_path / "hotter.zarr"
    run_into(other, [3, 4, 20], temperature=300.0)  # 3 and 4 computed differently
    out = tmp_path / "merged.zarr"
    merge_stores(out, stores[:1])
    before = store_identity(out), store_identity(other)
    with pytest.raises(ConfigError, match=r"system_id\(s\) 3 \(1 systems\) are in both") as e:
        merge_stores(out, [other, stores[1]])
    assert "hotter.zarr" in str(e.value) and "merged.zarr" in str(e.value)
    assert (store_identity(out), store_identity(other)) == before  # nothing written
    with pytest.raises(ConfigError, match=r"system_id\(s\) 4 .*shard-1-of-3.zarr' and .*hotter"):
        merge_stores(tmp_path / "fresh.zarr", [stores[1], other])  # between two inputs


def test_an_interrupted_merge_is_rolled_back_and_redone_once(shards, tmp_path, monkeypatch):
    stores, ref = shards
    out = tmp_path / "merged.zarr"
    merge_stores(out, stores[:1])
    original = merge_module.copy_rows
    calls = []

    def dies_mid_store(src, sink, rows=None, skip=None, chunk_systems=4096):
        calls.append(src)
        if len(calls) == 2:  # shard 2's copy: one chunk committed, then killed
            batch = next(merge_module.iter_store_batches(src, 2, rows=rows))
            sink.write(batch)
            sink.flush()
            raise KeyboardInterrupt
        return original(src, sink, rows, skip, chunk_systems)

    monkeypatch.setattr(merge_module, "copy_rows", dies_mid_store)
    inputs_before = [store_identity(s) for s in stores]
    with pytest.raises(KeyboardInterrupt):
        merge_stores(out, stores[1:])
    group = zarr.open_group(str(out), mode="r")
    assert group.attrs["merge_pending"]["path"] == str(stores[2])
    assert group.attrs["n_systems"] == 2 * N // SHARDS + 2  # the partial rows, committed
    monkeypatch.setattr(merge_module, "copy_rows", original)
    report = merge_stores(out, stores)
    assert report["skipped"] == [str(s) for s in stores[:2]]
    assert report["systems"] == N // SHARDS
    assert_same(read_results(out).batch, ref)  # nothing doubled
    assert [store_identity(s) for s in stores] == inputs_before  # the inputs untouched
    assert len(group.attrs["runs"]) == SHARDS


def test_the_merged_store_is_sharded_and_reads_like_a_plain_one(shards, tmp_path):
    """(The file counts sharding saves are measured in tests/io/test_results_at_scale.py.)"""
    stores, _ = shards
    out = tmp_path / "merged.zarr"
    merge_stores(out, stores, chunk_systems=2)
    plain = tmp_path / "plain.zarr"
    sink = ZarrSink(plain, flush_every=1)
    sink.open({})
    for batch in merge_module.iter_store_batches(out, 2):
        sink.write(batch)
    sink.close()
    group = zarr.open_group(str(out), mode="r")
    arrays = [a for _, a in group.members(max_depth=None) if isinstance(a, zarr.Array)]
    assert len(arrays) > 20 and all(a.shards is not None for a in arrays)
    merged, copied = read_results(out).to_pandas(), read_results(plain).to_pandas()
    copied.columns = merged.columns  # (the copy's run records no stage names)
    assert merged.equals(copied)


def test_bad_inputs_are_named(shards, tmp_path):
    stores, _ = shards
    with pytest.raises(ConfigError, match="no input stores"):
        merge_stores(tmp_path / "o.zarr", [])
    with pytest.raises(ConfigError, match=r"missing\.zarr' does not exist"):
        merge_stores(tmp_path / "o.zarr", [tmp_path / "missing.zarr"])
    not_ours = tmp_path / "other.zarr"
    zarr.open_group(str(not_ours), mode="w").attrs["schema"] = "something else"
    with pytest.raises(ConfigError, match="not an alchemi_lit results store"):
        merge_stores(tmp_path / "o.zarr", [not_ours])
    out = tmp_path / "o.zarr"
    merge_stores(out, stores[:1])
    with pytest.raises(ConfigError, match="is also an input"):
        merge_stores(out, [out])
    assert json.dumps(read_results(out).stats)  # still a valid store
    assert np.isfinite(read_results(out).energy.numpy()).all()
