"""Where a run loop's systems come from, and where finished ones go.

:class:`SamplerFeed` refills the batch from a :class:`~alchemi_lit.data.SizeAwareSampler`
within its atom/system/edge budgets (inflight batching); :class:`BatchFeed` is a fixed
batch; :class:`SinkDelivery` writes graduates to the run's sinks (a pipeline rank that
passes them on uses an outbox instead, see :mod:`alchemi_lit.strategies.pipeline`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from ..core import symmetry
from ..core.constraint_io import declare_for
from ..core.state import Batch
from ..data.sampler import SizeAwareSampler
from ..integrators.stage_fields import without_stage_fields
from ..sinks import SinkChain


def empty_batch(sim: Any, loops: list[Any], constraints: Iterable[str] = ()) -> Batch:
    """A batch of no systems with every field the ``loops`` declare (what a run with
    nothing to do yet starts from; a pipeline rank's schema comes from all ranks), and
    those of the ASE ``constraints`` (class names) the run's input carries."""
    from ase import Atoms

    one = [Atoms("H", positions=[[0, 0, 0]])]  # (not model-checked: it is never evaluated)
    b = Batch.from_atoms(one, dtype=sim.dtype, device=sim.device, validate=False)
    b = b.select(torch.zeros(0, dtype=torch.long))  # (no system a stage could refuse)
    for loop in loops:
        loop.declare(b)
    b.ensure_field("nan_flags", "system", dtype=torch.int64, fill=0)
    declare_for(b, constraints)
    return b


class BatchFeed:
    """A run over one prepared batch: nothing is ever added."""

    def __init__(self, batch: Batch, relaxes: bool = False) -> None:
        self.batch = batch
        if relaxes:
            record_initial_spacegroups(batch)

    def initial(self) -> Batch:
        return self.batch

    def admit(self, batch: Batch) -> Batch:
        return batch

    def exhausted(self) -> bool:
        return True

    def release(self, graduates: Batch) -> None:
        return None

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None


class SamplerFeed:
    """Inflight batching: refill what graduation freed, within the sampler's budgets.

    ``held`` (optional) says how many (atoms, systems) the caller holds outside the
    batch (a pipeline rank's inbox and outbox count against its budget too).  Refills
    are appended PENDING: their forces come from the next step's single forward.
    """

    def __init__(self, sim: Any, loop: Any, sampler: SizeAwareSampler) -> None:
        self.sim, self.loop, self.sampler = sim, loop, sampler
        self.relaxes = plan_relaxes(getattr(sim, "plan", None))
        self.inflight_edges = 0
        self.occupancy: list[float] = []

    @property
    def count_edges(self) -> bool:
        return self.sampler.edges is not None

    def initial(self) -> Batch:
        max_atoms, max_systems, max_edges = self.sampler.budget()
        return self.take(max_atoms, max_systems, max_edges) or empty_batch(self.sim, [self.loop])

    def take(self, atoms: int, systems: int, edges: int | None) -> Batch | None:
        """Systems that fit the free room, prepared on the run's device (None: none)."""
        picked, ids = self.sampler.take(max(0, atoms), max(0, systems), edges)
        if not picked:
            return None
        if self.count_edges:
            self.inflight_edges += self.sampler.edges_of(ids)
        fresh = Batch.from_atoms(picked, system_ids=ids, validate=False)
        if self.relaxes:
            record_initial_spacegroups(fresh)  # (on the host, before it moves)
        return self.sim.prepare(fresh)

    def admit(self, batch: Batch) -> Batch:
        max_atoms, max_systems, max_edges = self.sampler.budget()
        self.occupancy.append(batch.num_atoms / max_atoms)
        if self.sampler.exhausted:
            return batch
        free_edges = None if max_edges is None else max_edges - self.inflight_edges
        fresh = self.take(max_atoms - batch.num_atoms, max_systems - batch.num_systems, free_edges)
        return batch if fresh is None else self.loop.append(batch, [fresh])

    def exhausted(self) -> bool:
        return self.sampler.exhausted

    def release(self, graduates: Batch) -> None:
        if self.count_edges:
            self.inflight_edges -= self.sampler.edges_of(graduates.system_id.tolist())

    def state_dict(self) -> dict[str, Any]:
        return {"sampler": self.sampler.state_dict(), "inflight_edges": self.inflight_edges}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state["sampler"])
        self.inflight_edges = int(state["inflight_edges"])


def plan_relaxes(plan: Any) -> bool:
    """Whether a plan (fused, or a pipeline of fused plans) has an optimizer stage."""
    stages = getattr(plan, "stages", ())
    parts = stages.values() if isinstance(stages, dict) else stages
    return any(plan_relaxes(p) if hasattr(p, "stages") else p.is_optimizer for p in parts)


def _host(batch: Batch, *names: str) -> list[np.ndarray]:
    return [getattr(batch, k).detach().cpu().numpy() for k in names]


def record_initial_spacegroups(batch: Batch) -> None:
    """The space groups of systems entering a run with a relaxation (host, spglib: once
    per system) into ``spacegroup_initial``, where periodic in x, y and z; a plan
    without one leaves them 0 (the results table then shows no verdict)."""
    cell, pos, numbers, n_atoms, pbc = _host(
        batch, "cell", "positions", "atomic_numbers", "n_atoms", "pbc"
    )
    rows = pbc.all(-1) & (n_atoms > 0) & (np.abs(np.linalg.det(cell.astype(np.float64))) > 1e-12)
    initial = symmetry.spacegroups_of(
        cell.astype(np.float64), pos.astype(np.float64), numbers, n_atoms, rows
    )
    batch.system[symmetry.INITIAL] = torch.as_tensor(initial, device=batch.device)


def record_final_spacegroups(batch: Batch, relaxed: bool = True) -> None:
    """The finished systems' space groups (host, spglib: once per system, as it leaves
    a run with a relaxation; 0 where the plan relaxed nothing) into
    ``spacegroup_final``, for the results table."""
    batch.ensure_field(symmetry.FINAL, "system", (), torch.int64)
    if not relaxed:
        return
    cell, pos, numbers, n_atoms, initial = _host(
        batch, "cell", "positions", "atomic_numbers", "n_atoms", symmetry.INITIAL
    )
    final = symmetry.spacegroups_of(
        cell.astype(np.float64), pos.astype(np.float64), numbers, n_atoms, initial > 0
    )
    batch.system[symmetry.FINAL] = torch.as_tensor(final, device=batch.device)


class SinkDelivery:
    """Write graduates to the sinks (a priority chain that never drops a system).

    ``status_offset`` turns a pipeline rank's status codes into pipeline-wide ones, as
    a fused run of all stages would report them.  Where the run's forwards did not
    compute the stress (``Simulator(stress=...)``), graduates carry NaN stress rather
    than a stale or zero one: no extra model evaluation is made for it.
    """

    def __init__(
        self,
        sinks: SinkChain,
        sim: Any,
        loop: Any,
        status_offset: int = 0,
        info: dict[str, Any] | None = None,
    ) -> None:
        """``info``: extra entries for the stores' run record (a pipeline rank's number)."""
        self.sinks, self.sim, self.loop = sinks, sim, loop
        self.status_offset = int(status_offset)
        self.info = dict(info or {})
        self.delivered = 0
        self.relaxes = plan_relaxes(getattr(sim, "plan", None))

    def open(self, run_info: dict[str, Any]) -> None:
        self.sinks.open({**run_info, **self.info})

    def deliver(self, graduates: Batch) -> None:
        graduates = without_stage_fields(graduates, self.sim.plan)  # no optimizer state kept
        if not self.loop.needs_stress:
            graduates.stress = torch.full_like(graduates.stress, float("nan"))
        if self.status_offset:
            graduates.status = graduates.status + self.status_offset
        if graduates.has_field(symmetry.INITIAL):  # (0 after MD only: every store row has one)
            record_final_spacegroups(graduates, self.relaxes)
        self.sinks.write(graduates)
        self.delivered += graduates.num_systems

    def flush(self) -> None:
        self.sinks.flush()

    def close(self) -> None:
        self.sinks.close()

    def where(self) -> str:
        places = []
        for sink in self.sinks.sinks:
            path = getattr(sink, "path", None)
            if path is not None:
                places.append(f"{len(sink)} in {str(path)!r}")
        held = sum(b.num_systems for b in [*self.sinks.in_memory, *self.sinks.overflow])
        if held:
            places.append(f"{held} in memory (the exception's .results)")
        where = f" ({', '.join(places)})" if places else ""
        return f"{self.delivered} finished systems are saved{where}"

    def state_dict(self) -> dict[str, Any]:
        return {"sinks": self.sinks.state_dict(), "delivered": self.delivered}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sinks.load_state_dict(state["sinks"])
        self.delivered = int(state["delivered"])
