"""The constraint kinds' compiled CPU kernels (:mod:`.constraints`) as a backend:
implementations of the primitives of :mod:`alchemi_lit.core.constraint_bonds` (SHAKE,
RATTLE), :mod:`~alchemi_lit.core.constraint_forces` (Hookean, ExternalForce) and
:mod:`~alchemi_lit.core.constraint_kinds` (FixCartesian, FixedPlane, FixedLine, FixCom)
and :mod:`alchemi_lit.integrators.constrain` (RATTLE's first half),
registered with :mod:`alchemi_lit.core.backends` when it first dispatches.

Each takes float64 inputs that :func:`~alchemi_lit.kernels.usable` accepts (on the
accelerator path the kernels are off: the torch references, fixed sweeps, no host
reads).  Held to the references by ``tests/kernels/test_constraint_kernels.py``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .. import kernels
from ..core import constraint_bonds as bonds
from ..core import constraint_forces as forces
from ..core import constraint_kinds as axes
from ..core.state import Batch
from ..integrators import constrain
from .backend import BACKEND, kept


def _constraint_take(batch: Batch, *args: Any) -> bool:
    """The constraint kernels compute in float64 (the torch path takes other dtypes)."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    return batch.dtype == torch.float64 and kernels.usable(
        batch.positions, batch.masses, batch.cell, *tensors
    )


def _lattice(batch: Batch) -> tuple[np.ndarray, ...]:
    """The minimum image's lattice per system (cell, inverse, pbc as 1.0 / 0.0, the
    reach of the wrapped image: :func:`~.constraints.lattice_reach`), kept
    while the cell is (an inverse per step would cost more than the kernels)."""

    def make() -> tuple[np.ndarray, ...]:
        cell, inv = (np.ascontiguousarray(t.numpy()) for t in forces.mic_cells(batch))
        pbc = batch.pbc.to(batch.dtype).numpy()
        return cell, inv, pbc, kernels.load("constraints").lattice_reach(inv, pbc)

    return kept(batch, "lattice", (batch.cell, batch.pbc), make)


def _bond_sweeps(batch: Batch, ref: torch.Tensor, active: torch.Tensor) -> tuple[Any, ...]:
    """The sweep kernels' inputs: the bonds as a list (kept while the bond fields and the
    masses are), their vectors at ``ref`` and minimum images (kept while ``ref`` is:
    RATTLE runs twice a step at the same positions), then masses, bonds, ``active``,
    tolerances and the sweep limit."""
    k = kernels.load("constraints")
    a, b, cd, first = kept(
        batch, "bond list", (batch.bond_offset, batch.bond_length, batch.masses),
        lambda: k.bond_list(batch.bond_offset.numpy(), batch.bond_length.numpy(),
                            batch.masses.numpy(), *batch.segments.bounds),
    )  # fmt: skip
    r0, d0 = kept(
        batch, "bond vectors", (ref, batch.bond_offset, batch.bond_length, batch.cell, batch.pbc),
        lambda: k.bond_vectors(ref.numpy(), a, b, first, *_lattice(batch)),
    )  # fmt: skip
    rest = (batch.masses.numpy(), a, b, cd, first, active.numpy())
    return r0, d0, (*rest, batch.bond_tolerance.numpy(), bonds.MAX_SWEEPS)


@bonds.shake.register(BACKEND, _constraint_take)
def shake(batch: Batch, old: torch.Tensor, new: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    r0, d0, rest = _bond_sweeps(batch, old, active)
    out, failed = kernels.load("constraints").shake(new.numpy(), r0, d0, *rest)
    if failed >= 0:
        raise bonds.unconverged(batch, int(failed), "positions (SHAKE)")
    return torch.from_numpy(out)


@bonds.rattle.register(BACKEND, _constraint_take)
def rattle(batch: Batch, velocities: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    _, d0, rest = _bond_sweeps(batch, batch.positions, active)
    out, failed = kernels.load("constraints").rattle(velocities.numpy(), d0, *rest)
    if failed >= 0:
        raise bonds.unconverged(batch, int(failed), "velocities (RATTLE)")
    return torch.from_numpy(out)


@bonds.rattle_forces.register(BACKEND, _constraint_take)
def rattle_forces(batch: Batch, forces: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    _, d0, (m, *rest) = _bond_sweeps(batch, batch.positions, active)
    out, failed = kernels.load("constraints").rattle_forces(
        forces.numpy(), d0, m, *batch.segments.bounds, *rest
    )
    if failed >= 0:
        raise bonds.unconverged(batch, int(failed), "velocities (RATTLE)")
    return torch.from_numpy(out)


@forces.spring_terms.register(BACKEND, _constraint_take)
def spring_terms(batch: Batch, active: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    fields = (batch.spring_kind, batch.spring_offset, batch.spring_k, batch.spring_rt,
              batch.spring_target)  # fmt: skip

    def make() -> tuple[torch.Tensor, torch.Tensor]:
        force, energy = kernels.load("constraints").springs(
            batch.positions.numpy(), *(f.numpy() for f in fields), *batch.segments.bounds,
            active.numpy(), *_lattice(batch),
        )  # fmt: skip
        return torch.from_numpy(force), torch.from_numpy(energy)

    return kept(batch, "springs", _once_a_step(batch, active, fields), make)


@forces.pull_terms.register(BACKEND, _constraint_take)
def pull_terms(batch: Batch, active: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    fields = (batch.pull_offset, batch.pull_force)

    def make() -> tuple[torch.Tensor, torch.Tensor]:
        force, energy = kernels.load("constraints").pulls(
            batch.positions.numpy(), *(f.numpy() for f in fields), *batch.segments.bounds,
            active.numpy(),
        )  # fmt: skip
        return torch.from_numpy(force), torch.from_numpy(energy)

    return kept(batch, "pulls", _once_a_step(batch, active, fields), make)


def _once_a_step(batch: Batch, active: torch.Tensor, fields: tuple) -> tuple:
    """The key of a kind's force terms: the energy and the forces of one forward ask
    for them with the same positions and the same ``active`` tensor (computed once)."""
    return (batch.positions, active, batch.cell, batch.pbc, *fields)


@axes.axis_project.register(BACKEND, _constraint_take)
def axis_project(batch: Batch, f: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    starts, counts = batch.segments.bounds
    return torch.from_numpy(kernels.load("constraints").axis_project(
        f.numpy(), batch.axis_kind.numpy(), batch.axis_vector.numpy(), starts, counts,
        active.numpy(),
    ))  # fmt: skip


@axes.axis_positions.register(BACKEND, _constraint_take)
def axis_positions(
    batch: Batch, old: torch.Tensor, new: torch.Tensor, active: torch.Tensor
) -> torch.Tensor:
    starts, counts = batch.segments.bounds
    return torch.from_numpy(kernels.load("constraints").axis_positions(
        old.numpy(), new.numpy(), batch.axis_kind.numpy(), batch.axis_vector.numpy(), starts,
        counts, active.numpy(),
    ))  # fmt: skip



@axes.fix_com.register(BACKEND, _constraint_take)
def fix_com(
    batch: Batch, values: torch.Tensor, ref: torch.Tensor, what: int, active: torch.Tensor
) -> torch.Tensor:
    starts, counts = batch.segments.bounds
    return torch.from_numpy(kernels.load("constraints").fix_com(
        values.numpy(), ref.numpy(), batch.masses.numpy(), what, starts, counts,
        (active & batch.com_fixed).numpy(),
    ))  # fmt: skip



@constrain.drift_velocities.register(BACKEND, _constraint_take)
def drift_velocities(
    batch: Batch, velocities: torch.Tensor, new: torch.Tensor, unconstrained: torch.Tensor,
    dt: float | torch.Tensor, systems: torch.Tensor,
) -> torch.Tensor:  # fmt: skip
    starts, counts = batch.segments.bounds
    return torch.from_numpy(kernels.load("constraints").drift_velocities(
        velocities.numpy(), new.numpy(), unconstrained.numpy(),
        kernels.per_system(batch, dt), starts, counts, systems.numpy(),
    ))  # fmt: skip


__all__: list[str] = []
