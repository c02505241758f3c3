"""How nudged elastic bands cross ranks: whole, in one message, once all of a band is there.

A band (the systems sharing ``neb_path``, :mod:`~alchemi_lit.integrators.neb`) can only
start when all its images and both endpoints are in one batch.  A rank that relaxes
the endpoints (``relax | neb``) passes the images on at once, so the members of a band
finish on it at different times.  Holding them on the *receiving* rank until the band
is complete can deadlock: its budget fills with the images of bands whose endpoints
then find no room to follow.  So the *sending* rank holds them: a band leaves a rank's
outbox only whole, in one message, to one downstream rank and within that rank's
credit (its free budget), and is admitted there as one unit.  Its members waiting in
the outbox count against the sender's budget, as the waiting images of a fused plan
count against its batch.  A band that no message could carry is refused before launch.

A band that arrives with a failed member (an endpoint quarantined while it relaxed
upstream) cannot run: its interior images are quarantined on arrival, as the fused
plan quarantines the images waiting for that endpoint.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..core.errors import ConfigError
from ..core.state import EXIT_QUARANTINED, Batch
from ..data.sampler import SizeAwareSampler
from ..integrators.neb import QUARANTINED_BAND
from ..integrators.stages import Pipeline
from .buffers import INFO_OVERHEAD, BufferConfig, info_size


def sendable(batch: Batch) -> tuple[list[list[int]], list[int]]:
    """Rows of an outbox grouped into what may be sent -- a lone system, or every member
    of a band (placed where its first member is) -- and the rows of bands not all
    there yet, which wait."""
    rows = range(batch.num_systems)
    if not batch.has_field("neb_count"):
        return [[r] for r in rows], []
    path, count = batch.neb_path.tolist(), batch.neb_count.tolist()
    bands: dict[int, list[int]] = {}
    units: list[list[int]] = []
    for r in rows:
        if count[r] <= 0:
            units.append([r])
        elif path[r] in bands:
            bands[path[r]].append(r)
        else:
            units.append(bands.setdefault(path[r], [r]))
    whole = [u for u in units if count[u[0]] <= 0 or len(u) >= count[u[0]]]
    waiting = sorted(r for u in units if count[u[0]] > len(u) for r in u)
    return whole, waiting


def quarantine_orphans(batch: Batch, dead: torch.Tensor) -> torch.Tensor:
    """Quarantine the live interior images of bands of ``batch`` with a failed member
    (``dead`` ``[B]``); returns ``dead`` with them."""
    if not batch.has_field("neb_count") or not bool((dead & (batch.neb_count > 0)).any()):
        return dead
    broken = batch.neb_path[dead & (batch.neb_count > 0)]
    inner = (batch.neb_image > 0) & (batch.neb_image < batch.neb_count - 1)
    lost = inner & ~dead & torch.isin(batch.neb_path, broken)
    for sid in batch.system_id[lost].tolist():
        batch.info.setdefault(sid, {})["neb_quarantined"] = QUARANTINED_BAND
    batch.exit_code = torch.where(lost, EXIT_QUARANTINED, batch.exit_code)
    batch.converged = batch.converged & ~lost
    return dead | lost


def check_replica_ranks(pipeline: Pipeline) -> None:
    """Before launch: a replica exchange (:class:`~alchemi_lit.integrators.ReplicaExchange`)
    only on ranks the data enters (each a shard of whole groups): the transfer between
    ranks keeps bands whole, not replica groups, so a downstream exchange rank could
    receive a group split over messages."""
    from ..integrators.tempering import ReplicaExchange

    sources = set(pipeline.sources())
    for rank, fused in pipeline.stages.items():
        grouped = [isinstance(s, ReplicaExchange) or getattr(s, "proposals", 1) > 1
                   for s in fused.stages]  # fmt: skip
        if rank not in sources and any(grouped):
            raise ConfigError(
                f"rank {rank} runs a ReplicaExchange or Monte Carlo (proposals > 1) stage "
                f"downstream of another rank; replica groups and chains of copies cross ranks "
                f"only whole in a shard, not through a pipeline's transfer: fuse it with the "
                f"stages before it (relax + ReplicaExchange(...)) on one rank, or run the plan "
                f"with strategy='replicas'"
            )


def check_bands(
    pipeline: Pipeline,
    sampler: SizeAwareSampler,
    buffer: BufferConfig,
    pairs: Sequence[int] | None = None,
) -> None:
    """Before launch: a band stage gets only bands (as on one device, where it checks its
    first batch), and every band fits one transfer message; ``pairs``: each structure's
    neighbour pairs, where ``buffer.num_edges`` bounds them."""
    if any(pipeline.has_band(r) for r in pipeline.sources()):
        banded = np.zeros(len(sampler.dataset), dtype=bool)
        for _, start, stop in sampler.bands:
            banded[start:stop] = True
        lone = [int(k) for k in sampler.order if not banded[k]]
        if lone:
            raise ConfigError(
                f"a band stage (band=NEB(...)) of the pipeline would get structure {lone[0]}, "
                f"which has no info['path_id'] ({len(lone)} such); a band stage relaxes bands: "
                f"build them with alchemi_lit.workflows.make_band, or run the others apart"
            )
    if not pipeline.edges:  # (replicas: nothing crosses ranks)
        return
    for p, start, stop in sampler.bands:
        atoms, count = int(sampler.sizes[start:stop].sum()), stop - start
        info = sum(info_size(getattr(sampler.dataset[k], "info", None)) for k in range(start, stop))
        edges = sum(pairs[start:stop]) if pairs is not None and buffer.num_edges else 0
        for what, need, room in (
            ("num_atoms", atoms, buffer.num_atoms),
            ("num_systems", count, buffer.num_systems),
            ("info_bytes", info + INFO_OVERHEAD, buffer.info_bytes),
            ("num_edges", edges, buffer.num_edges or edges),
        ):
            if need > room:
                raise ConfigError(
                    f"band path_id {p} (structures {start}-{stop - 1}) needs {what}={need} in "
                    f"one transfer message, more than BufferConfig({what}={room}); a band crosses "
                    f"ranks whole, in one message: raise {what} to at least {need}"
                )
