"""Units that cross ranks whole: bands, replica groups and chains of copies.

A unit is systems that must be in one batch together: a nudged elastic band (the
systems sharing ``neb_path``, :mod:`~alchemi_lit.integrators.neb`), a replica-exchange
group (``rex_group``, :mod:`~alchemi_lit.integrators.tempering`) or the copies of a
Monte Carlo chain with ``proposals=k`` (``mc_chain``,
:mod:`~alchemi_lit.integrators.proposal_copies`).
Their members finish a rank at different times (``relax | neb`` passes the images on at
once; a group's members may leave a relaxation at different steps).  Holding them on
the *receiving* rank until the unit is complete can deadlock: its budget fills with
members of units whose mates then find no room to follow.  So the *sending* rank holds
them: a unit leaves a rank's outbox only whole, in one message, to one downstream rank
and within that rank's credit (its free budget), and is admitted there as one unit.  Its
members waiting in the outbox count against the sender's budget and take no step (their
keyed random streams do not see the wait).  A unit no message could carry is refused
before launch.

Every rank declares the unit fields from the start (``FusedLoop(carried=)``): a group's
membership is read from ``info`` and checked whole where it enters the run, as in one
fused plan, and travels in the fields.  A band that arrives with a failed member (an
endpoint quarantined while it relaxed upstream) cannot run: its interior images are
quarantined on arrival, as the fused plan quarantines the images waiting for that
endpoint; a group runs on without a failed member, as in the fused plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..core.errors import ConfigError
from ..core.state import EXIT_QUARANTINED, Batch
from ..data.sampler import SizeAwareSampler
from ..integrators.exchange import GROUP
from ..integrators.neb import QUARANTINED_BAND
from ..integrators.stages import Pipeline
from .buffers import INFO_OVERHEAD, BufferConfig, info_size

#: a group unit: the batch field naming each system's group, and the members of a group
Unit = tuple[str, int]


def sendable(batch: Batch, unit: Unit | None = None) -> tuple[list[list[int]], list[int]]:
    """Rows of an outbox grouped into what may be sent -- a lone system, or every member
    of a band or of a group of ``unit`` (placed where its first member is) -- and the rows
    of units not all there yet, which wait."""
    n = batch.num_systems
    path = batch.neb_path.tolist() if batch.has_field("neb_count") else [-1] * n
    count = batch.neb_count.tolist() if batch.has_field("neb_count") else [0] * n
    group = getattr(batch, unit[0]).tolist() if unit and batch.has_field(unit[0]) else [-1] * n
    units: dict[tuple[str, int], list[int]] = {}
    need: dict[tuple[str, int], int] = {}
    order: list[list[int]] = []
    for r in range(n):
        key = ("band", path[r]) if count[r] > 0 else ("group", group[r]) if group[r] >= 0 else None
        if key is None:
            order.append([r])
        elif key in units:
            units[key].append(r)
        else:
            need[key] = count[r] if count[r] > 0 else unit[1]
            order.append(units.setdefault(key, [r]))
    sizes = {id(rows): need[k] for k, rows in units.items()}
    whole = [u for u in order if len(u) >= sizes.get(id(u), 1)]
    waiting = sorted(r for u in order if len(u) < sizes.get(id(u), 1) for r in u)
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


def grouped(stage: Any) -> Unit | None:
    """The unit a stage needs whole: a replica exchange's groups (one replica per rung)
    or a Monte Carlo chain's ``k`` copies (``proposals=k``); None for any other stage."""
    from ..integrators.proposals import CHAIN
    from ..integrators.tempering import ReplicaExchange

    if isinstance(stage, ReplicaExchange):
        return GROUP, len(stage.temperatures)
    k = int(getattr(stage, "proposals", 1))
    return (CHAIN, k) if k > 1 else None


def group_unit(pipeline: Pipeline) -> Unit | None:
    """The groups the pipeline's transfer keeps whole (None: no grouped stage); refused:
    grouped stages of different sizes, and a rank fanning out to branches of which only
    some run one (groups go to whichever branch has room)."""
    found = {grouped(s) for plan in pipeline.stages.values() for s in plan.stages} - {None}
    if len(found) > 1:
        raise ConfigError(
            f"the pipeline's ReplicaExchange / Monte Carlo (proposals > 1) stages need groups of "
            f"different sizes ({sorted(k for _, k in found)} systems); its groups cross ranks "
            f"whole, one size for the run: give them one ladder length (or one proposals)"
        )

    def runs(r: int) -> bool:
        return any(grouped(s) for s in pipeline.stages[r].stages) or any(
            runs(d) for d in pipeline.downstream(r))  # fmt: skip

    for r in sorted(pipeline.stages):
        downs = pipeline.downstream(r)
        yes = [d for d in downs if runs(d)]
        if yes and len(yes) < len(downs):
            raise ConfigError(
                f"pipeline rank {r} fans out to ranks {downs}, of which {yes} run a "
                f"ReplicaExchange or Monte Carlo (proposals > 1) stage and the others do not; "
                f"groups go to whichever branch has room, so some would never be exchanged: give "
                f"every branch the same stages, or run that stage after the branches join"
            )
    return next(iter(found), None)


class Members:
    """A grouped stage of another rank as a rank's loop carries it (``FusedLoop(carried=)``):
    its membership fields declared and read from ``info`` where a system enters the run."""

    def __init__(self, stage: Any) -> None:
        self.stage = stage

    def declare(self, batch: Batch) -> None:
        from ..integrators import proposal_copies

        k = int(getattr(self.stage, "proposals", 1))
        if k > 1:
            proposal_copies.enter(batch, k, f"{type(self.stage).__name__}(proposals={k})")
        else:
            self.stage.declare(batch)

    def quarantine_bands(self, batch: Batch, left: torch.Tensor, exit_code: int) -> None:
        """A group runs on without a failed member (as in one fused plan): none to take."""
        return None


def carriers(pipeline: Pipeline, rank: int) -> list[Any]:
    """What ``rank``'s loop carries of the other ranks' stages: their band filters and
    grouped stages, whose fields its systems carry from the start (as in one fused plan)."""
    own = {id(s) for s in pipeline.stages[rank].stages}
    stages = [s for _, plan in sorted(pipeline.stages.items()) for s in plan.stages
              if id(s) not in own]  # fmt: skip
    bands = [s.band for s in stages if getattr(s, "band", None) is not None]
    return bands + [Members(s) for s in stages if grouped(s)]


def check_units(
    pipeline: Pipeline,
    sampler: SizeAwareSampler,
    buffer: BufferConfig,
    pairs: Sequence[int] | None = None,
) -> None:
    """Before launch: a band stage gets only bands (as on one device, where it checks its
    first batch), and every band and group (of a grouped stage, :func:`group_unit`) fits
    one transfer message; ``pairs``: each structure's neighbour pairs, where
    ``buffer.num_edges`` bounds them."""
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
    units = [(f"band path_id {p}", start, stop) for p, start, stop in sampler.bands]
    if group_unit(pipeline) is not None:
        units += [(f"replica group {g}", start, stop) for g, start, stop in sampler.groups]
    for name, start, stop in units:
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
                    f"{name} (structures {start}-{stop - 1}) needs {what}={need} in one "
                    f"transfer message, more than BufferConfig({what}={room}); bands and groups "
                    f"cross ranks whole, in one message: raise {what} to at least {need}"
                )
