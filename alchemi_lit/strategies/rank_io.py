"""What flows in and out of a pipeline rank: its inbox, its outbox and their budgets.

:class:`RankIO` is the run loop's feed on a pipeline rank (received systems, plus the
sampler's on a source rank) and decides what the exchange sends: credit for upstream
(the room the rank has left) and which finished systems go to which downstream rank.
:class:`Outbox` is the delivery of a rank that passes its graduates on; the last rank
of a pipeline delivers to the sinks instead (:class:`~alchemi_lit.engine.feeds.SinkDelivery`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core.errors import ConfigError
from ..core.state import EXIT_MODEL_ERROR, EXIT_QUARANTINED, Batch
from ..engine.feeds import SamplerFeed
from ..io.serialize import batch_from_state, batch_state
from ..models.neighbors import batch_pair_counts
from .buffers import INFO_OVERHEAD, BufferConfig, check_info_fits
from .units import Unit, quarantine_orphans, sendable


class Outbox:
    """Finished systems waiting for downstream credit (FIFO)."""

    def __init__(self) -> None:
        self.batch: Batch | None = None

    def open(self, run_info: dict[str, Any]) -> None:
        return None

    def deliver(self, graduates: Batch) -> None:
        self.batch = graduates if self.batch is None else Batch.concatenate([self.batch, graduates])

    def flush(self) -> None:
        return None

    def close(self) -> None:
        return None

    def where(self) -> str:
        return ""

    def state_dict(self) -> dict[str, Any]:
        return {"outbox": None if self.batch is None else batch_state(self.batch)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        out = state["outbox"]
        self.batch = None if out is None else batch_from_state(out)


class RankIO:
    """Inbox, outbox and budgets of one rank (see the module docstring).

    ``capacity``: (max_atoms, max_systems) the rank may hold -- batch, inbox and
    outbox together, so back-pressure reaches the source; ``empty``: a batch of no
    systems with the pipeline's fields; ``unit``: the replica groups or chains the
    transfer keeps whole (None: bands only).
    """

    def __init__(
        self,
        sim: Any,
        loop: Any,
        sampler_feed: SamplerFeed | None,
        delivery: Any,
        downs: list[int],
        buffer: BufferConfig,
        capacity: tuple[int, int],
        stats: Any,
        empty: Callable[[], Batch],
        unit: Unit | None = None,
    ) -> None:
        self.sim, self.loop, self.source = sim, loop, sampler_feed
        self.unit = unit  # the groups sent whole, as bands are (:func:`.units.group_unit`)
        self.delivery, self.downs, self.buffer = delivery, downs, buffer
        self.max_atoms, self.max_systems = capacity
        self.stats, self.empty = stats, empty
        self.inbox: list[Batch] = []
        self.outbox = delivery if isinstance(delivery, Outbox) else None

    # ------------------------------------------------------------------ feed
    def initial(self) -> Batch:
        first = None
        if self.source is not None:
            max_atoms, max_systems, max_edges = self.source.sampler.budget()
            first = self.source.take(max_atoms, max_systems, max_edges)
        if first is None:
            return self.empty()
        self.loop.declare(first)
        self.stats.systems_in += first.num_systems
        return _conform(first, self.empty())  # every field any rank declares travels

    def admit(self, batch: Batch) -> Batch:
        """Append received systems and (source ranks) sampler refills as PENDING."""
        fresh, self.inbox = self.inbox, []
        if self.source is not None and not self.source.exhausted():
            atoms, systems = self.held(batch, fresh)
            new = self.source.take(self.max_atoms - atoms, self.max_systems - systems, None)
            if new is not None:
                self.loop.declare(new)
                fresh.append(_conform(new, batch if batch.num_systems else self.empty()))
                self.stats.systems_in += new.num_systems
        if not fresh:
            return batch
        merged = self.loop.append(batch, fresh)
        self.track_peak(merged)
        return merged

    def exhausted(self) -> bool:
        return self.source is None or self.source.exhausted()

    def release(self, graduates: Batch) -> None:
        return None

    def state_dict(self) -> dict[str, Any]:
        return {
            "sampler": None if self.source is None else self.source.state_dict(),
            "inbox": [batch_state(b) for b in self.inbox],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.source is not None:
            self.source.load_state_dict(state["sampler"])
        self.inbox = [batch_from_state(b).to(device=self.sim.device) for b in state["inbox"]]

    # ------------------------------------------------------------------ exchange
    def accept(self, received: Batch) -> None:
        """Inbox for systems to simulate; quarantined ones pass straight through."""
        self.stats.systems_in += received.num_systems
        dead = (received.exit_code == EXIT_QUARANTINED) | (received.exit_code == EXIT_MODEL_ERROR)
        dead = quarantine_orphans(received, dead)  # (a band lost a member upstream)
        if bool(dead.any()):
            through = received.select(dead.nonzero().flatten())
            through.status.fill_(self.loop.plan.exit)  # (a sink rank adds its offset)
            self.delivery.deliver(through)
            received = received.select((~dead).nonzero().flatten())
        if received.num_systems:
            self.inbox.append(received)

    def held(self, batch: Batch, extra: list[Batch] = ()) -> tuple[int, int]:
        """(atoms, systems) this rank holds: its batch, inbox, outbox and ``extra``."""
        parts = [batch, *self.inbox, *extra]
        if self.outbox is not None and self.outbox.batch is not None:
            parts.append(self.outbox.batch)
        return sum(b.num_atoms for b in parts), sum(b.num_systems for b in parts)

    def track_peak(self, batch: Batch) -> None:
        atoms, systems = self.held(batch)
        self.stats.peak_atoms = max(self.stats.peak_atoms, atoms)
        self.stats.peak_systems = max(self.stats.peak_systems, systems)

    def finished(self, batch: Batch, ups_done: bool) -> bool:
        """Whether this rank has nothing left: upstream done, sampler dry, batch, inbox
        and outbox empty."""
        out = self.outbox.batch if self.outbox is not None else None
        return (
            ups_done
            and self.exhausted()
            and batch.num_systems == 0
            and not self.inbox
            and (out is None or out.num_systems == 0)
        )

    def credit_shares(
        self, batch: Batch, ups: list[int], round_: int
    ) -> dict[int, tuple[int, int]]:
        """Split this rank's free room among its active upstream ranks (fan-in).

        Counting the outbox (finished systems waiting for downstream credit) is what
        makes back-pressure reach the source.  An even split when every share can still
        take the largest possible system or band; otherwise all of it to one
        upstream per round, in turn -- an even split of too little room would never let
        a large system through (livelock).
        """
        if not ups:
            return {}
        atoms, systems = self.held(batch)
        free_atoms = max(0, self.max_atoms - atoms)
        free_systems = max(0, min(self.max_systems - systems, 1 << 40))
        n = len(ups)
        largest = min(self.buffer.num_atoms, self.max_atoms)
        # a unit may be a whole band or group (:mod:`.units`): as many systems as a message
        banded = batch.has_field("neb_count") or self.unit is not None
        most = min(self.buffer.num_systems, self.max_systems) if banded else 1
        if n == 1 or (free_atoms // n >= largest and free_systems // n >= most):
            return {u: (free_atoms // n, free_systems // n) for u in ups}
        turn = ups[round_ % n]
        return {u: (free_atoms, free_systems) if u == turn else (0, 0) for u in ups}

    def route(self, credit: dict[int, tuple[int, int]]) -> dict[int, Batch]:
        """Split the outbox among downstream ranks: most credit first, within buffers, in
        order; a band or group goes whole, once all of it is here (:mod:`.units`)."""
        out = self.outbox.batch if self.outbox is not None else None
        if out is None or out.num_systems == 0 or not self.downs:
            return {}
        buf = self.buffer
        credit_left = {d: list(credit[d]) for d in self.downs}
        empty = [buf.num_atoms, buf.num_systems, buf.num_edges, buf.info_bytes - INFO_OVERHEAD]
        room = {d: list(empty) for d in self.downs}
        ids = out.system_id.tolist()
        info = [  # raises, naming the fix, for a system no message could carry
            check_info_fits(out.info.get(sid), sid, buf) if out.info else 0 for sid in ids
        ]
        radius = self.sim.model.cutoff + self.sim.model.neighbors.skin
        edges = batch_pair_counts(out, radius) if buf.num_edges else [0] * out.num_systems
        atoms = out.n_atoms.tolist()
        chosen: dict[int, list[int]] = {d: [] for d in self.downs}
        units, left = sendable(out, self.unit)
        blocked = False
        for unit in units:
            need = [sum(atoms[r] for r in unit), len(unit), sum(edges[r] for r in unit),
                    sum(info[r] for r in unit)]  # fmt: skip
            if len(unit) > 1 and need[3] > empty[3]:
                raise ConfigError(
                    f"the band or group of system_id {ids[unit[0]]} carries {need[3]} bytes of "
                    f"info, more than one transfer message holds (BufferConfig.info_bytes="
                    f"{buf.info_bytes}); raise info_bytes to at least {need[3] + INFO_OVERHEAD}"
                )
            fits = [
                d for d in self.downs
                if credit_left[d][0] >= need[0] and credit_left[d][1] >= need[1]
                and room[d][0] >= need[0] and room[d][1] >= need[1]
                and (not buf.num_edges or room[d][2] >= need[2]) and room[d][3] >= need[3]
            ]  # fmt: skip
            if not fits or blocked:  # keep FIFO order: once one waits, later ones wait too
                blocked = True
                left += unit
                continue
            d = max(fits, key=lambda k: (credit_left[k][0], -k))
            chosen[d] += unit
            credit_left[d][0] -= need[0]
            credit_left[d][1] -= need[1]
            for k, used in enumerate(need):
                room[d][k] -= used
        parts = {d: out.select(sorted(rows)) for d, rows in chosen.items() if rows}
        self.outbox.batch = out.select(sorted(left)) if left else None
        return parts


def _conform(batch: Batch, template: Batch) -> Batch:
    """Give ``batch`` every field of ``template`` (zero-filled), so schemas match."""
    for name, t in template.atom.items():
        if name not in batch.atom:
            batch.ensure_field(name, "atom", tuple(t.shape[1:]), t.dtype, 0)
    for name, t in template.system.items():
        if name not in batch.system:
            batch.ensure_field(name, "system", tuple(t.shape[1:]), t.dtype, 0)
    return batch
