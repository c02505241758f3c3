"""``alchemi-lit merge OUT IN...``: the shards of a campaign joined once, with the merged
summary.json (the merge itself is tested in tests/sinks/test_merge.py)."""

from __future__ import annotations

import json

import pytest

import alchemi_lit as al
from alchemi_lit.cli import main
from alchemi_lit.data import SizeAwareSampler, mixed_argon
from alchemi_lit.integrators import FIRE
from alchemi_lit.models import LennardJones
from alchemi_lit.sinks import ZarrSink, read_results

N = 9
DATA = mixed_argon(N, 8, 24, seed=8)


def shard(store, ids: list[int], fmax: float = 0.05) -> None:
    sim = al.Simulator(
        model=LennardJones(epsilon=0.0104, sigma=3.40, cutoff=6.0),
        stages=FIRE(fmax=fmax, max_steps=15),
        sinks=[ZarrSink(store)],
    )
    sim.run(SizeAwareSampler([DATA[i] for i in ids], max_atoms=100, system_ids=ids))


@pytest.fixture
def shards(tmp_path):
    stores = [tmp_path / f"results.shard-{i}-of-3.zarr" for i in range(3)]
    for i, store in enumerate(stores):
        shard(store, list(range(i, N, 3)))
    return stores


def test_merge_writes_the_store_and_its_summary(tmp_path, shards, capsys):
    out = tmp_path / "campaign.zarr"
    assert main(["merge", str(out), *map(str, shards)]) == 0
    printed = capsys.readouterr().out
    assert "alchemi-lit merge: summary" in printed and "(summary)" in printed  # (paths fold)
    assert sorted(read_results(out).system_id.tolist()) == list(range(N))
    summary = json.loads((tmp_path / "campaign.summary.json").read_text())
    assert summary["systems"] == N
    assert [m["path"] for m in summary["merge"]["merged"]] == list(map(str, shards))
    # one entry per shard's run, each with its own systems and wall time
    assert [r["systems"] for r in summary["runs"]] == [3, 3, 3]
    assert all(r["wall_time_s"] for r in summary["runs"])
    # again, with one more input named twice: nothing doubled, the summary says so
    assert main(["merge", str(out), *map(str, shards), str(shards[0])]) == 0
    summary = json.loads((tmp_path / "campaign.summary.json").read_text())
    assert summary["systems"] == N and summary["merge"]["systems"] == 0
    assert summary["merge"]["skipped"] == list(map(str, shards))


def test_a_conflict_is_one_line_and_exit_status_2(tmp_path, shards, capsys):
    other = tmp_path / "loose.zarr"
    shard(other, [0, 1], fmax=0.5)  # the same systems, relaxed to another criterion
    out = tmp_path / "campaign.zarr"
    assert main(["merge", str(out), *map(str, shards), str(other)]) == 2
    err = capsys.readouterr().err
    assert "system_id(s) 0 (1 systems) are in both" in err and "loose.zarr" in err
    assert not out.exists() or len(read_results(out)) == 0
    assert main(["merge", str(out), str(tmp_path / "nope.zarr")]) == 2
    assert "nope.zarr' does not exist" in capsys.readouterr().err
