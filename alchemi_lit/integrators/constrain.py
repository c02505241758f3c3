"""When the step loop applies constraints, for every integrator and cell filter alike.

The kinds (:mod:`alchemi_lit.core.constraints`) say *how* to adjust; this module says
*when*, following what ASE's ``Atoms`` does when an optimizer or ``VelocityVerlet``
calls ``set_positions``, ``get_forces`` and ``set_momenta``::

    before pre_update    snapshot positions and cell               (snapshot)
    after pre_update     cell: adjust_cell; positions: adjust_positions from the old
                         positions carried by the cell change (ASE's scale_atoms);
                         MD stages: v += (r_adjusted - r) / (drift x dt)  -- RATTLE's
                         first half, ASE's p = (r_new - r) m / dt       (after_pre_update)
    after the forward    energy += each kind's energy; forces and stress adjusted
                         (ASE's get_potential_energy / get_forces)      (adjust_results)
    after post_update    MD stages: adjust_velocities -- RATTLE's second half,
                         ASE's set_momenta(apply_constraint=True)        (after_post_update)

Only systems in a stage that carry a kind (``constraint_flags``) are touched; nothing
reads a value on the host (the kinds' own CPU-only convergence loops aside).  The loop
calls these only for the kinds a batch may carry (``StepContext.constraint_bits``, read
at bookkeeping), so a run without constraints costs nothing.  Applying every kind's
force adjustment in MD as well (ASE's ``md=True`` skips the projections) changes
nothing but rounding: a projected kick followed by the projected drift equals ASE's
projected displacement.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..core import symmetry
from ..core.backends import primitive
from ..core.constraint_forces import SPRING_PLANE, SPRING_POINT
from ..core.constraint_io import constraint_kinds
from ..core.constraints import FLAGS_FIELD, Constraint
from ..core.linalg import inverse
from ..core.state import Batch
from ..core.tensor_ops import small_matmul
from . import ops


@dataclass
class Snapshot:
    """Positions and cell before a step's position updates, and the cell tensor itself
    with its version: a step that neither replaced nor wrote it changed no cell, which
    is known without reading a value."""

    positions: torch.Tensor
    cell: torch.Tensor
    cell_tensor: torch.Tensor
    cell_version: int


def constraint_bits(batch: Batch) -> int:
    """The kinds (``constraint_flags`` bits, OR-ed) ``batch`` carries beyond FixAtoms,
    read on the host: the run loop calls it at bookkeeping and hands the number to
    the step loop, so a step applies only the kinds present and reads nothing."""
    if not batch.has_field(FLAGS_FIELD) or not batch.num_systems:
        return 0
    out = 0
    for value in torch.unique(batch.system[FLAGS_FIELD]).tolist():
        out |= int(value)
    return out


def _kinds(bits: int) -> list[Constraint]:
    """The registered kinds among ``bits``, in application order."""
    return [k for k in constraint_kinds() if k.bit & bits]


def snapshot(batch: Batch, bits: int) -> Snapshot | None:
    """The references :func:`after_pre_update` adjusts from (copies: a kernel may write
    in place); None where no kind among ``bits`` moves positions (nothing to adjust)."""
    if not any(k.holonomic and not k.native for k in _kinds(bits)):
        return None
    cell = batch.cell
    return Snapshot(batch.positions.clone(), cell.clone(), cell, cell._version)


def _active(batch: Batch, mask: torch.Tensor, kind: Constraint) -> torch.Tensor:
    return mask & ((batch.system[FLAGS_FIELD] & kind.bit) != 0)


def _moved_by_cell(batch: Batch, before: Snapshot) -> torch.Tensor:
    """The old positions carried by each system's cell change (``r h_old^-1 h_new``,
    ASE's ``set_cell(scale_atoms=True)``), unchanged where the cell did not change
    (all of them, without arithmetic, when no stage touched the cell tensor: MD)."""
    if batch.cell is before.cell_tensor and batch.cell._version == before.cell_version:
        return before.positions
    changed = (batch.cell != before.cell).flatten(1).any(-1)
    eye = torch.eye(3, dtype=batch.dtype, device=batch.device).expand_as(batch.cell)
    safe = torch.where(changed.view(-1, 1, 1), before.cell, eye)
    strain = small_matmul(inverse(safe), batch.cell)
    seg = batch.segments
    carried = small_matmul(before.positions.unsqueeze(-2), seg.to_atoms(strain)).squeeze(-2)
    return torch.where(seg.to_atoms(changed).unsqueeze(-1), carried, before.positions)


def after_pre_update(
    batch: Batch, stages: Sequence[tuple[Any, torch.Tensor]], before: Snapshot, bits: int
) -> None:
    """Adjust the cell, positions and (MD) velocities of the systems ``stages`` (pairs
    of a stage and its ``[B]`` mask) just moved (see the module docstring)."""
    if not stages:
        return
    kinds = [k for k in _kinds(bits) if not k.native]
    moved = stages[0][1] if len(stages) == 1 else torch.stack([m for _, m in stages]).any(0)
    cell = batch.cell
    for kind in kinds:
        if type(kind).adjust_cell is not Constraint.adjust_cell:
            cell = kind.adjust_cell(batch, before.cell, cell, _active(batch, moved, kind))
    # ASE's set_cell(scale_atoms=True) then set_positions(target): the old positions are
    # carried by the adjusted cell (below); the integrator's target is not re-expressed
    batch.cell = cell
    old = _moved_by_cell(batch, before)
    unconstrained = batch.positions
    new = unconstrained
    for kind in kinds:
        if kind.holonomic:
            new = kind.adjust_positions(batch, old, new, _active(batch, moved, kind))
    batch.positions = new
    for stage, mask in stages:
        if stage.is_optimizer or not hasattr(stage, "dt"):
            continue
        dt = ops.per_system(batch, stage.dt) * getattr(stage, "constraint_drift", 1.0)
        batch.velocities = drift_velocities(
            batch, batch.velocities, new, unconstrained, dt, mask & (batch.system[FLAGS_FIELD] != 0)
        )


@primitive
def drift_velocities(
    batch: Batch, velocities: torch.Tensor, new: torch.Tensor, unconstrained: torch.Tensor,
    dt: float | torch.Tensor, systems: torch.Tensor,
) -> torch.Tensor:  # fmt: skip
    """``velocities + (new - unconstrained) / dt`` on the atoms of ``systems`` (``dt``: a
    number or ``[B]``, the drift's step): RATTLE's first half, ASE's ``p = (r_new - r) m / dt``."""
    rate = batch.segments.to_atoms(dt).unsqueeze(-1) if isinstance(dt, torch.Tensor) else dt
    on = batch.atom_mask(systems).unsqueeze(-1)
    return torch.where(on, velocities + (new - unconstrained) / rate, velocities)


def adjust_results(
    batch: Batch, forces: torch.Tensor, energy: torch.Tensor, stress: torch.Tensor | None,
    fixed: bool, bits: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """A forward's energy, forces and stress as ASE's ``get_potential_energy``,
    ``get_forces`` and ``get_stress`` return them with the constraints applied
    (``fixed``: the batch may have FixAtoms; ``bits``: the other kinds it may carry)."""
    if not bits:
        return (
            (forces.masked_fill(batch.fixed.unsqueeze(-1), 0.0) if fixed else forces),
            energy,
            stress,
        )
    flags = batch.system[FLAGS_FIELD]
    for kind in constraint_kinds():
        if not (kind.native or kind.bit & bits):
            continue
        if kind.native:
            if fixed:
                forces = kind.adjust_forces(batch, forces, torch.ones_like(batch.pbc[:, 0]))
            continue
        active = (flags & kind.bit) != 0  # (every system that carries the kind)
        extra = kind.energy(batch, active)
        if extra is not None:
            energy = energy + extra
        forces = kind.adjust_forces(batch, forces, active)
        if stress is not None:
            stress = kind.adjust_stress(batch, stress, active)
    return forces, energy, stress


def constrain_velocities(batch: Batch, mask: torch.Tensor, bits: int) -> None:
    """Velocities of ``mask``'s systems made to satisfy the kinds among ``bits`` (ASE's
    ``set_momenta``): after a kick, and when systems enter an MD stage."""
    v = batch.velocities
    for kind in _kinds(bits):
        if kind.holonomic and not kind.native:
            v = kind.adjust_velocities(batch, v, _active(batch, mask, kind))
    batch.velocities = v


def after_post_update(
    batch: Batch, stages: Sequence[tuple[Any, torch.Tensor]], bits: int
) -> None:
    """RATTLE's second half for the MD stages among ``stages``."""
    for stage, mask in stages:
        if not stage.is_optimizer and hasattr(stage, "dt"):
            constrain_velocities(batch, mask, bits)


def refuse_holonomic(batch: Batch, mask: torch.Tensor) -> list[tuple[int, str]]:
    """``(row, constraint names)`` of ``mask``'s systems with a constraint that moves
    positions (for stages that cannot honour one: barostats).  Reads on the host."""
    if not batch.has_field(FLAGS_FIELD):
        return []
    flags = batch.system[FLAGS_FIELD]
    out = []
    for row in (mask & (flags != 0)).nonzero().flatten().tolist():
        names = [
            "/".join(k.ase_names)
            for k in constraint_kinds()
            if k.holonomic and not k.native and int(flags[row]) & k.bit
        ]
        if names:
            out.append((row, ", ".join(names)))
    return out


def space_fixed_tethers(batch: Batch, mask: torch.Tensor) -> list[int]:
    """Rows of ``mask``'s systems under FixSymmetry with Hookean springs to points or
    planes, for stages that move the cell (cell filters) to refuse.  Why: the points and
    planes are fixed in space, while a moving cell carries the lattice and the
    operations' translations; their invariance, checked for the input cell
    (:mod:`~alchemi_lit.core.symmetry_invariance`), then need not last a step, and ASE's
    result would again depend on the order of its list.  Reads on the host."""
    if not (batch.has_field(symmetry.COUNT) and batch.has_field("spring_kind")):
        return []
    tether = (batch.spring_kind == SPRING_POINT) | (batch.spring_kind == SPRING_PLANE)
    tethered = batch.segments.sum(tether.to(batch.dtype)) > 0
    return (mask & tethered & (getattr(batch, symmetry.COUNT) > 0)).nonzero().flatten().tolist()


__all__ = [
    "Snapshot", "adjust_results", "after_post_update", "after_pre_update",
    "constrain_velocities", "constraint_bits", "drift_velocities", "refuse_holonomic",
    "snapshot", "space_fixed_tethers",
]  # fmt: skip
