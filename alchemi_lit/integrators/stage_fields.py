"""Which batch fields are a stage's own, and what a system's history records when it
leaves a stage.

Stage-private fields -- the :class:`~.base.FieldSpec` fields integrators declare and
the fields their convergence criteria declare -- exist only to continue a system in
its stage: FIRE's time step, L-BFGS's history, BFGS's Hessian rows (``(3n + 9)(3
max_atoms + 9)`` numbers a system).  A finished system needs none of them, so
:func:`without_stage_fields` drops them from graduates before the sinks keep them (the
results store never held them; in memory they were most of a BFGS result).  The core
fields, the stage history and NaNGuard's flags stay.

:func:`record_stage_exit` writes the history a system keeps of each stage it left:
its energy (eV), cell volume (Å^3) and pressure (eV/Å^3, ``-trace(stress) / 3``), NaN
where undefined -- the volume and pressure of a system not periodic in x, y and z, the
pressure where the run did not compute the stress.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ..core.state import ATOM_FIELDS, SYSTEM_FIELDS, Batch

#: a system's reference cell in a stage with a cell filter (:mod:`.cell`)
CELL_REFERENCE = "cell_ref"
#: the cell rows' velocities of FIRE and FIRE2 with a cell filter (atoms: ``velocities``)
CELL_VELOCITIES = "fire_cell_velocities"
#: per-system cell state besides the cell itself (what NaNGuard restores with it)
CELL_STATE = (CELL_REFERENCE, CELL_VELOCITIES)

#: per-stage history written when a system leaves a stage: name -> what a column holds
EXIT_HISTORY = {
    "stage_energy": "energy (eV)",
    "stage_volume": "cell volume (Å^3)",
    "stage_pressure": "pressure (eV/Å^3)",
}

_private: dict[tuple[int, ...], tuple[list[Any], frozenset[str]]] = {}


def stages_of(plan: Any) -> list[Any]:
    """Every stage of a fused plan, of every rank of a pipeline, or of a list of stages."""
    stages = getattr(plan, "stages", plan)
    if isinstance(stages, dict):  # a pipeline: rank -> fused plan
        return [s for fused in stages.values() for s in stages_of(fused)]
    return list(stages)


def stage_private_fields(stages: Iterable[Any]) -> frozenset[str]:
    """Names of the fields ``stages`` declare for themselves: their :attr:`fields` and
    their criteria's (found by letting each criterion, as bound by the run, declare its
    fields on a probe batch).  Kept per set of stages: graduation asks every time."""
    stages = list(stages)
    key = tuple(id(s) for s in stages)
    hit = _private.get(key)
    if hit is not None:
        return hit[1]
    names: set[str] = set()
    probe = None
    for stage in stages:
        names.update(getattr(stage, "fields", {}))
        criterion = getattr(stage, "criterion", None)
        if criterion is not None:
            probe = probe or _probe()
            before = set(probe.atom) | set(probe.system)
            criterion.declare(probe)
            names.update((set(probe.atom) | set(probe.system)) - before)
    found = frozenset(names - set(ATOM_FIELDS) - set(SYSTEM_FIELDS))
    if len(_private) > 16:
        _private.clear()
    _private[key] = (stages, found)  # (the stages are kept: their ids stay theirs)
    return found


def without_stage_fields(graduates: Batch, plan: Any) -> Batch:
    """``graduates`` without the stage-private fields of ``plan``'s stages (in place)."""
    for name in stage_private_fields(stages_of(plan)):
        graduates.drop_field(name)
    return graduates


def _probe() -> Batch:
    from ase import Atoms

    return Batch.from_atoms([Atoms("H", positions=[[0.0, 0.0, 0.0]])], validate=False)


# ------------------------------------------------------------------ stage history
def declare_exit_history(batch: Batch, width: int) -> None:
    """The ``[B, width]`` columns of :data:`EXIT_HISTORY` (NaN until a stage is left)."""
    for name in EXIT_HISTORY:
        batch.ensure_field(name, "system", (width,), None, float("nan"))


def record_stage_exit(batch: Batch, column: int, leave: torch.Tensor, stress_known: bool) -> None:
    """Energy, volume and pressure of the systems of ``leave`` ``[B]`` into ``column`` of
    the history; ``stress_known``: whether this step's forward computed the stress."""
    periodic = batch.pbc.all(-1)
    nan = torch.full_like(batch.energy, float("nan"))
    volume = torch.where(periodic, batch.volume, nan)
    pressure = -batch.stress.diagonal(0, -2, -1).sum(-1) / 3.0
    pressure = torch.where(periodic, pressure, nan) if stress_known else nan
    for name, value in (
        ("stage_energy", batch.energy),
        ("stage_volume", volume),
        ("stage_pressure", pressure),
    ):
        history = getattr(batch, name)
        history[:, column] = torch.where(leave, value, history[:, column])
