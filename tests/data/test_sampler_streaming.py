"""SizeAwareSampler over a file streams (issue 46, parts 1-2): it keeps per-structure
numbers, not the Atoms; takes read the frames they hand out; shards keep global ids;
a run without a budget gets the default one."""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path

import ase.io
import numpy as np
import pytest
from ase.build import bulk

from alchemi_lit.core.errors import ConfigError
from alchemi_lit.data import SizeAwareSampler, read_structures
from alchemi_lit.data.default_budget import BOUNDED_MAX_ATOMS, default_budget_sampler


def write_cells(path: Path, n: int, repeat: int = 1) -> None:
    """``n`` rattled Cu cells (4 atoms each, times ``repeat`` along z), one extxyz file."""
    base = bulk("Cu", "fcc", a=3.6, cubic=True) * (1, 1, repeat)
    rng = np.random.default_rng(0)
    frames = []
    for k in range(n):
        a = base.copy()
        a.positions += rng.normal(scale=0.02, size=a.positions.shape)
        a.info["label"] = k
        frames.append(a)
    ase.io.write(path, frames, format="extxyz")


def retained(build) -> tuple[object, int]:
    """What ``build()`` returns and the bytes it keeps allocated (traced)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        obj = build()
        gc.collect()
        return obj, tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


@pytest.fixture(scope="module")
def cells(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("stream") / "cells.extxyz"
    write_cells(path, 3000)
    return path


def test_a_sampler_over_a_file_keeps_no_atoms(cells: Path) -> None:
    """A sampler of a file holds tens of bytes a structure (its offsets, sizes, ids and
    queue), far below the ~2 kB of each ase.Atoms a list holds; the old sampler read
    the dataset into a list and kept it."""
    sampler, kept = retained(lambda: SizeAwareSampler(cells, max_atoms=64))
    atoms, listed = retained(lambda: read_structures(cells))
    assert len(sampler) == len(atoms) == 3000
    assert listed > 3000 * 1000  # (the list of Atoms: over a kB each)
    assert kept < 200 * 3000  # offsets, sizes, ids, units, order: 8 bytes each
    assert kept < listed / 10


def test_takes_read_the_frames_of_the_file_in_order(cells: Path) -> None:
    sampler = SizeAwareSampler(cells, max_atoms=40, max_systems=7)
    sampler.bind(3.0)
    ref = ase.io.read(cells, ":")
    seen: list[int] = []
    while not sampler.exhausted:
        taken, ids = sampler.take(40, 7)
        assert 0 < len(ids) <= 7 and sum(len(a) for a in taken) <= 40
        for a, sid in zip(taken, ids):
            np.testing.assert_array_equal(a.positions, ref[sid].positions)
            assert a.info["label"] == sid
        seen += ids
    assert seen == list(range(3000))


def test_without_and_with_budget_keep_the_facts_without_a_pass(cells: Path) -> None:
    sampler = SizeAwareSampler(cells, max_atoms=64)
    rest = sampler.without(set(range(0, 3000, 2)))
    assert rest.system_ids.tolist() == list(range(1, 3000, 2))
    np.testing.assert_array_equal(rest.dataset[0].positions, sampler.dataset[1].positions)
    wider = sampler.with_budget(128)
    assert wider.max_atoms == 128 and wider.system_ids is sampler.system_ids


def test_shards_keep_global_ids_and_cover_the_dataset_once(cells: Path) -> None:
    whole = SizeAwareSampler(cells, max_atoms=64)
    parts = [SizeAwareSampler(cells, max_atoms=64, shard=f"{i}/7") for i in range(7)]
    joined = np.concatenate([p.system_ids for p in parts])
    np.testing.assert_array_equal(joined, whole.system_ids)
    assert parts[3].shard == (3, 7)
    k = int(parts[3].system_ids[5])
    np.testing.assert_array_equal(parts[3].dataset[5].positions, whole.dataset[k].positions)
    same = SizeAwareSampler(cells, max_atoms=64, shard=(3, 7))
    np.testing.assert_array_equal(same.system_ids, parts[3].system_ids)


def test_bad_shards_are_refused(cells: Path) -> None:
    with pytest.raises(ConfigError, match=r"shard index must be in 0\.\.3"):
        SizeAwareSampler(cells, max_atoms=64, shard="4/4")
    with pytest.raises(ConfigError, match="INDEX/COUNT"):
        SizeAwareSampler(cells, max_atoms=64, shard="4")
    atoms = read_structures(cells, index=":3")
    with pytest.raises(ConfigError, match="holds no structure: the dataset has 3"):
        SizeAwareSampler(atoms, max_atoms=64, shard="0/5")


def test_a_shard_boundary_inside_a_band_is_refused() -> None:
    images = []
    for p in range(2):
        for _ in range(3):
            a = bulk("Cu", "fcc", a=3.6, cubic=True)
            a.info["path_id"] = p
            images.append(a)
    with pytest.raises(ConfigError, match="inside band path_id 0"):
        SizeAwareSampler(images, max_atoms=64, shard="0/3")
    assert len(SizeAwareSampler(images, max_atoms=64, shard="1/2")) == 3


def test_the_input_digest_of_a_streamed_file_is_that_of_its_structures(cells: Path) -> None:
    from alchemi_lit.engine.fingerprint import input_digest

    streamed = SizeAwareSampler(cells, max_atoms=64)
    listed = SizeAwareSampler(read_structures(cells), max_atoms=64)
    assert input_digest(streamed) == input_digest(listed)
    rehashed = streamed.with_budget(64)
    rehashed.content_hashes = None  # (hashed anew in id order: the same digest)
    assert input_digest(rehashed) == input_digest(streamed)
    moved = read_structures(cells)
    moved[2999].positions[0, 0] += 1e-9
    assert input_digest(SizeAwareSampler(moved, max_atoms=64)) != input_digest(streamed)


def test_the_default_budget_is_bounded_on_a_cpu_and_measured_on_cuda(cells: Path) -> None:
    cpu = default_budget_sampler(cells, "cpu", measurable=True)
    assert cpu.max_atoms == BOUNDED_MAX_ATOMS and not cpu.auto
    hinted = default_budget_sampler(cells, "cpu", measurable=True, cpu_batch_atoms=128)
    assert hinted.max_atoms == 128
    assert default_budget_sampler(cells, "cuda", measurable=True).max_atoms == "auto"
    assert default_budget_sampler(cells, "cuda", measurable=False).max_atoms == BOUNDED_MAX_ATOMS
    big = [bulk("Cu", "fcc", a=3.6, cubic=True) * (4, 4, 4)]  # 256 atoms > the hint
    assert default_budget_sampler(big, "cpu", True, cpu_batch_atoms=128).max_atoms == 256


def test_the_measured_default_falls_back_to_the_bound_where_memory_is_unseen() -> None:
    """A model whose memory the reader cannot see (allocations outside PyTorch) stops an
    explicit ``max_atoms="auto"`` with an error; the default budget runs bounded."""
    from test_memory_budget import CUTOFF, SKIN, LawReader, MiB, Recording, cpu_probe

    from alchemi_lit.data import mixed_argon

    model = Recording()
    reader = LawReader(model, 0.0, 0.0, 0.0, 64 * MiB)
    reader.resolution = MiB
    data = mixed_argon(n_systems=100, max_atoms=100)
    sampler = default_budget_sampler(data, "cuda", measurable=True)
    sampler.memory_reader = reader
    rest = sampler.without({0})  # (a resume keeps the fallback)
    sampler.bind(CUTOFF + SKIN, cpu_probe(model))
    assert sampler.max_atoms == BOUNDED_MAX_ATOMS
    assert rest.fallback_atoms == BOUNDED_MAX_ATOMS
    explicit = SizeAwareSampler(data, max_atoms="auto", memory_reader=reader)
    with pytest.raises(ConfigError, match="did not grow with the batch"):
        explicit.bind(CUTOFF + SKIN, cpu_probe(model))
