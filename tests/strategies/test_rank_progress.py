"""Progress across ranks: what passes through each rank (``shares.rank_totals``) is its
log's total, one bar is drawn (rank 0's) and counts every replica's systems, every
rank's log lines say which rank they come from, and the shares add up to the whole
data set."""

from __future__ import annotations

import re

import pytest
from loguru import logger
from rich.console import Console

import alchemi_lit as al
from alchemi_lit.callbacks import Logger, ProgressBar
from alchemi_lit.data import SizeAwareSampler, mixed_argon
from alchemi_lit.integrators import FIRE, Langevin
from alchemi_lit.integrators.stages import Pipeline
from alchemi_lit.models import LennardJones
from alchemi_lit.strategies.shares import rank_totals, shard

N = 14
DATA = mixed_argon(N, 8, 30, seed=2)


def sampler() -> SizeAwareSampler:
    return SizeAwareSampler(DATA, max_atoms=200)


def test_totals_of_replicas_linear_pipelines_fan_in_and_fan_out():
    s = sampler()
    atoms = sum(len(a) for a in DATA)
    relax, md = FIRE(fmax=0.05, max_steps=5), Langevin(dt=2.0, temperature=50.0, steps=3)
    replicas = Pipeline.of(relax + md).replicate(2)
    totals = rank_totals(replicas, s)
    assert sum(n for n, _ in totals.values()) == N and sum(a for _, a in totals.values()) == atoms
    for r in (0, 1):  # each replica's total is its shard
        assert totals[r] == (len(shard(s, 2, r)), int(shard(s, 2, r).sizes.sum()))
    assert rank_totals(Pipeline.of(relax | md), s) == {0: (N, atoms), 1: (N, atoms)}
    fan_in = Pipeline({0: relax, 1: relax, 2: md}, [(0, 2), (1, 2)])
    t = rank_totals(fan_in, s)
    assert t[2] == (N, atoms) and t[0][0] + t[1][0] == N
    fan_out = Pipeline({0: relax, 1: md, 2: md}, [(0, 1), (0, 2)])
    assert rank_totals(fan_out, s) == {0: (N, atoms)}  # the branches' shares are not known


@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_one_bar_counting_every_replica_and_every_rank_logging_its_rank(tmp_path):
    bar_file, log_file = tmp_path / "bar.txt", tmp_path / "log.txt"
    sink = logger.add(log_file, level="INFO", format="{message}")
    try:
        with open(bar_file, "w") as out:
            console = Console(file=out, force_terminal=True, width=200)
            sim = al.Simulator(
                model=LennardJones(epsilon=0.0104, sigma=3.40, cutoff=6.0),
                stages=FIRE(fmax=0.05, max_steps=15) + Langevin(dt=2.0, temperature=50.0, steps=4),
                strategy="replicas", devices=2, start_method="fork", timeout=60.0,
                callbacks=[ProgressBar(every=1, console=console), Logger(every=5)],
            )  # fmt: skip
            results = sim.run(sampler())
    finally:
        logger.remove(sink)
    assert results.stats["systems"] == N
    share = len(shard(sampler(), 2, 0))
    bar = bar_file.read_text()
    assert "[2 replicas]" in bar and "[rank 1" not in bar  # no other rank drew
    finished = [int(n) for n in re.findall(rf"(\d+)/{N} systems", bar)]
    assert finished and max(finished) >= share  # every replica's total; rank 0's share done
    assert not list(tmp_path.glob("alchemi-progress-*"))
    log = log_file.read_text()
    for r in (0, 1):
        total = len(shard(sampler(), 2, r))
        assert re.search(rf"rank {r}/2 \| run start: {total} systems", log), log[:2000]
