"""How a distributed run splits its data: the shards of the source ranks, and how many
systems and atoms pass through each rank (the totals its progress bar and log count).

Shards are balanced by atom count (greedy, largest first) and deterministic, so every
rank computes every source's share without talking to the others.
"""

from __future__ import annotations

import numpy as np

from ..data.datasets import Subset
from ..data.sampler import SizeAwareSampler
from ..integrators.stages import Pipeline


def shard_owner(sampler: SizeAwareSampler, parts: int) -> np.ndarray:
    """The shard (``0 .. parts-1``) of each of ``sampler``'s systems; a band's images
    share their first image's."""
    loads = [0] * parts
    owner = np.empty(len(sampler.dataset), dtype=np.int64)
    heads = np.flatnonzero(sampler.unit > 0)  # a system, or the first image of a band
    units = [slice(int(k), int(k + sampler.unit[k])) for k in heads]
    unit_atoms = np.asarray([int(sampler.sizes[u].sum()) for u in units])
    for j in np.argsort(-unit_atoms, kind="stable"):
        p = int(np.argmin(loads))
        owner[units[j]] = p
        loads[p] += int(unit_atoms[j])
    return owner


def shard(sampler: SizeAwareSampler, parts: int, index: int) -> SizeAwareSampler:
    """A disjoint shard of ``sampler``'s systems, balanced by atom count (greedy); the
    images of a band (:mod:`~alchemi_lit.data.bands`) go to one shard together."""
    owner = shard_owner(sampler, parts)
    mine = [int(k) for k in sampler.order if owner[k] == index]
    sub = (
        SizeAwareSampler(
            Subset(sampler.dataset, mine),  # (read on access: a rank holds no list)
            sampler.max_atoms,
            sampler.max_systems,
            sampler.max_edges,
            system_ids=[int(sampler.system_ids[k]) for k in mine],
            skip_invalid=sampler.skip_invalid,
        )
        if mine
        else None
    )
    return sub


def rank_totals(pipeline: Pipeline, sampler: SizeAwareSampler) -> dict[int, tuple[int, int]]:
    """(systems, atoms) that will pass through each rank, for the ranks where that is
    known: a source rank's shard, plus what its upstream ranks pass on when none of them
    splits its output (fan-out: which branch a system takes depends on credit at run
    time, so the ranks below a split are left out)."""
    sources = pipeline.sources()
    owner = shard_owner(sampler, len(sources))
    queued = np.asarray(sampler.order, dtype=np.int64)
    share = {
        r: (int((owner[queued] == i).sum()), int(sampler.sizes[queued][owner[queued] == i].sum()))
        for i, r in enumerate(sources)
    }
    totals: dict[int, tuple[int, int]] = {}
    for rank in _upstream_first(pipeline):
        ups = pipeline.upstream(rank)
        if any(len(pipeline.downstream(u)) > 1 or u not in totals for u in ups):
            continue  # below a fan-out (or an unknown rank): not known
        own = share.get(rank, (0, 0))
        totals[rank] = (
            own[0] + sum(totals[u][0] for u in ups),
            own[1] + sum(totals[u][1] for u in ups),
        )
    return totals


def _upstream_first(pipeline: Pipeline) -> list[int]:
    """The ranks, each after all its upstream ranks (the pipeline is acyclic)."""
    done: list[int] = []
    left = list(range(pipeline.num_ranks))
    while left:
        ready = [r for r in left if all(u in done for u in pipeline.upstream(r))]
        if not ready:  # (a cycle: validated away before a run; nothing more is known)
            break
        done += ready
        left = [r for r in left if r not in ready]
    return done
