"""``alchemi-lit run`` at campaign scale (issue 46): a file of thousands of structures
with no sampler section streams in bounded batches, and ``--shard i/n`` runs one slice
into its own store with global ids -- the shards together equal one run."""

from __future__ import annotations

import re
import resource
from pathlib import Path

import ase.io
import numpy as np
import pytest
import yaml
from loguru import logger

from alchemi_lit.cli import main
from alchemi_lit.data.default_budget import BOUNDED_MAX_ATOMS
from alchemi_lit.sinks import read_results
from conftest import copper_cells


def write_cells(path: Path, n: int) -> None:
    ase.io.write(path, copper_cells(n, seed=1), format="extxyz")


def config(tmp: Path, structures: Path, store: Path, steps: int = 2) -> Path:
    """An EMT FIRE run of ``structures`` into ``store``, with no sampler section."""
    cfg = {
        "simulator": {
            "model": {"class_path": "EMT"},
            "stages": [{"class_path": "FIRE", "init_args": {"fmax": 0.01, "max_steps": steps}}],
            "sinks": [{"class_path": "ZarrSink", "init_args": {"store": str(store), "mode": "w"}}],
            "accelerator": "cpu",
            "precision": "64",
            "seed": 0,
        },
        "data": {"structures": str(structures)},
    }
    path = tmp / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.parametrize("n", [3000, pytest.param(100_000, marks=pytest.mark.slow)])
def test_thousands_of_structures_without_a_budget_run_in_bounded_batches(
    tmp_path: Path, n: int
) -> None:
    """The issue's run (100,000 cells, no sampler section: one batch of every atom, killed
    for memory at 24 GB), and a fast 3,000-cell version: the default budget bounds the
    batches, every structure is stored once, and the process's peak memory stays far
    from a batch of every atom (under 3 GB here)."""
    structures, store = tmp_path / "cells.extxyz", tmp_path / "r.zarr"
    with open(structures, "w") as out:  # (written in parts: the list is not kept)
        for lo in range(0, n, 5000):
            ase.io.write(out, copper_cells(min(5000, n - lo), seed=lo), format="extxyz")
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="INFO")
    try:
        assert main(["run", "--config", str(config(tmp_path, structures, store, 1))]) == 0
    finally:
        logger.remove(sink)
    chosen = [ln for ln in lines if "no batch budget given" in ln]
    assert len(chosen) == 1 and f"max_atoms={BOUNDED_MAX_ATOMS}" in chosen[0]
    assert BOUNDED_MAX_ATOMS < 3000 * 4  # (so it is more than one batch)
    ids = read_results(store).to_pandas(columns=["system_id"])["system_id"].to_numpy()
    np.testing.assert_array_equal(np.sort(ids), np.arange(n))
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # (KiB on Linux)
    assert peak_kib < 3 * 2**20, f"peak resident memory {peak_kib / 2**20:.2f} GiB"


def shard_store(store: Path, i: int, n: int) -> Path:
    return store.with_name(f"{store.stem}.shard-{i}-of-{n}{store.suffix}")


def test_shards_together_equal_one_run_and_resume_on_their_own(tmp_path: Path) -> None:
    structures, store = tmp_path / "cells.extxyz", tmp_path / "r.zarr"
    write_cells(structures, 40)
    cfg = config(tmp_path, structures, store, steps=3)
    assert main(["run", "--config", str(cfg)]) == 0
    whole = read_results(store).batch
    parts = []
    for i in range(3):
        assert main(["run", "--config", str(cfg), "--shard", f"{i}/3"]) == 0
        path = shard_store(store, i, 3)
        assert (tmp_path / f"r.shard-{i}-of-3.summary.json").is_file()
        parts.append(read_results(path).batch)
    ids = [b.system_id.tolist() for b in parts]
    assert ids == [list(range(0, 13)), list(range(13, 26)), list(range(26, 40))]
    for key in ("positions", "forces"):  # float64 EMT: batch-independent, bit for bit
        joined = np.concatenate([getattr(b, key).numpy() for b in parts])
        np.testing.assert_array_equal(joined, getattr(whole, key).numpy())
    joined = np.concatenate([b.system["energy"].numpy() for b in parts])
    np.testing.assert_array_equal(joined, whole.system["energy"].numpy())
    # a resumed shard continues its own store: nothing is run twice
    assert main(["run", "--config", str(cfg), "--shard", "1/3", "--resume"]) == 0
    again = read_results(shard_store(store, 1, 3)).batch
    assert again.system_id.tolist() == list(range(13, 26))
    # shard + merge equals one run (#46): every system once, the same bits; a second
    # merge of the same shards changes nothing
    merged = tmp_path / "merged.zarr"
    shards = [str(shard_store(store, i, 3)) for i in range(3)]
    for _ in range(2):
        assert main(["merge", str(merged), *shards]) == 0
        got = read_results(merged).batch
        order = np.argsort(got.system_id.numpy(), kind="stable")
        assert got.system_id.numpy()[order].tolist() == list(range(40))
        np.testing.assert_array_equal(got.system["energy"].numpy()[order],
                                      whole.system["energy"].numpy())  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--shard", "3/3"], r"error: data\.shard: shard index must be in 0\.\.2"),
        (["--shard", "1"], r"error: data\.shard: --shard must be INDEX/COUNT"),
        (["--shard"], r"error: shard: expected INDEX/COUNT after --shard"),
        (["--shard", "0/0"], r"error: data\.shard: shard count must be >= 1"),
    ],
)
def test_bad_shard_specs_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], match: str
) -> None:
    structures = tmp_path / "cells.extxyz"
    write_cells(structures, 4)
    cfg = config(tmp_path, structures, tmp_path / "r.zarr")
    assert main(["validate", "--config", str(cfg), *argv]) == 2
    err = capsys.readouterr().err
    assert any(re.search(match, ln) for ln in err.splitlines()), err
