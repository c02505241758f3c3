"""The built-in constraint kinds that project: FixAtoms, FixCartesian / FixedPlane /
FixedLine (one per-atom "axis" slot) and FixCom -- ASE's semantics, batched.

The interface they implement is :class:`~.constraints.Constraint`; forces that add to
the model's (Hookean, ExternalForce) are in :mod:`.constraint_forces`, rigid bonds
(FixBondLengths, RATTLE) in :mod:`.constraint_bonds`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from .backends import primitive
from .constraints import Constraint, ConstraintField, Host, register_constraint
from .tensor_ops import row_dot

AXIS_CARTESIAN = 1
"""``axis_kind`` of an atom with ``FixCartesian`` of some axes (``axis_vector``: the mask)."""
AXIS_PLANE = 2
"""``axis_kind`` of an atom with ``FixedPlane`` (``axis_vector``: the unit normal)."""
AXIS_LINE = 3
"""``axis_kind`` of an atom with ``FixedLine`` (``axis_vector``: the unit direction)."""


class FixAtomsKind(Constraint):
    """ASE ``FixAtoms``, kept in the core ``fixed`` field: every integrator leaves those
    atoms where they are (:func:`~alchemi_lit.integrators.ops.moving_atoms`), so only the
    forces (zeroed, as ASE's ``adjust_forces``) go through the orchestration."""

    ase_names = ("FixAtoms",)
    bit = 1 << 0
    order = 50
    native = True

    def encode(self, constraint: Any, host: Host) -> None:
        raise TypeError("FixAtoms is read into the core 'fixed' field (constraints.fixed_mask)")

    def _fixed(self, batch: Any, active: torch.Tensor) -> torch.Tensor:
        return (batch.atom_mask(active) & batch.fixed).unsqueeze(-1)

    def adjust_positions(self, batch, old, new, active):  # type: ignore[no-untyped-def]
        return torch.where(self._fixed(batch, active), old, new)

    def adjust_velocities(self, batch, velocities, active):  # type: ignore[no-untyped-def]
        return velocities.masked_fill(self._fixed(batch, active), 0.0)

    def adjust_forces(self, batch, forces, active):  # type: ignore[no-untyped-def]
        return forces.masked_fill(self._fixed(batch, active), 0.0)


def _direction(host: Host, what: str, direction: Any) -> np.ndarray:
    d = np.asarray(direction, dtype=np.float64).reshape(-1)
    norm = float(np.linalg.norm(d)) if d.shape == (3,) else 0.0
    if not np.isfinite(norm) or norm == 0.0:
        raise host.refuse(f"{what}: direction {d.tolist()} is not a nonzero 3-vector")
    return d / norm


class AxisKind(Constraint):
    """ASE ``FixCartesian`` (some of x, y, z), ``FixedPlane`` and ``FixedLine``: one
    linear projection per atom (``axis_kind`` 1, 2, 3; ``axis_vector``: the fixed-axes
    mask, the plane's normal, the line's direction).  An atom may have one of them;
    ``FixCartesian`` of all three axes is ``FixAtoms`` (the ``fixed`` field)."""

    ase_names = ("FixCartesian", "FixedPlane", "FixedLine")
    bit = 1 << 1
    order = 60
    fields: ClassVar[dict[str, ConstraintField]] = {
        "axis_kind": ConstraintField("atom", dtype="int64"),
        "axis_vector": ConstraintField("atom", (3,)),
    }
    _HINT = "give each atom one of FixCartesian, FixedPlane, FixedLine (or FixAtoms)"

    def encode(self, constraint: Any, host: Host) -> None:
        name = type(constraint).__name__
        if name == "FixCartesian":
            kwargs = constraint.todict()["kwargs"]
            idx = host.indices(name, kwargs["a"])
            mask = np.broadcast_to(np.asarray(kwargs["mask"], dtype=bool).reshape(-1, 3),
                                   (len(idx), 3))  # fmt: skip
            keep = mask.any(1) & ~mask.all(1)  # all three: already in `fixed`; none: nothing
            idx, mask = idx[keep], mask[keep]
            kind, vec, dof = AXIS_CARTESIAN, mask.astype(np.float64), mask.sum(1)
        else:
            idx = host.indices(name, constraint.index)
            vec = np.broadcast_to(_direction(host, name, constraint.dir), (len(idx), 3))
            kind = AXIS_PLANE if name == "FixedPlane" else AXIS_LINE
            dof = np.full(len(idx), 1 if name == "FixedPlane" else 2)
        host.claim("axis", idx, name, self._HINT)
        host.array("axis_kind")[idx] = kind
        host.array("axis_vector")[idx] = vec
        host.flags |= self.bit
        host.dof += float(np.sum(dof))

    def decode(self, arrays: dict[str, np.ndarray], system: dict[str, Any]) -> list[Any]:
        from ase.constraints import FixCartesian, FixedLine, FixedPlane

        kinds, vecs, out = arrays["axis_kind"], arrays["axis_vector"], []
        for kind in (AXIS_CARTESIAN, AXIS_PLANE, AXIS_LINE):
            rows = np.flatnonzero(kinds == kind)
            groups: dict[tuple[float, ...], list[int]] = {}
            for i in rows:
                groups.setdefault(tuple(vecs[i].tolist()), []).append(int(i))
            for vec, idx in groups.items():
                if kind == AXIS_CARTESIAN:
                    out.append(FixCartesian(idx, mask=[bool(x) for x in vec]))
                else:
                    out.append((FixedPlane if kind == AXIS_PLANE else FixedLine)(idx, vec))
        return out

    def adjust_positions(self, batch, old, new, active):  # type: ignore[no-untyped-def]
        return axis_positions(batch, old, new, active)

    def adjust_velocities(self, batch, velocities, active):  # type: ignore[no-untyped-def]
        return axis_project(batch, velocities, active)  # ASE: adjust_momenta = adjust_forces

    def adjust_forces(self, batch, forces, active):  # type: ignore[no-untyped-def]
        return axis_project(batch, forces, active)


def _axis_parts(batch: Any, active: torch.Tensor) -> tuple[torch.Tensor, ...]:
    kind = torch.where(batch.atom_mask(active), batch.axis_kind, 0).unsqueeze(-1)
    return kind == AXIS_CARTESIAN, kind == AXIS_PLANE, kind == AXIS_LINE, batch.axis_vector


@primitive
def axis_project(batch: Any, f: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    """Forces or velocities ``f`` ``[N, 3]`` without the components the axis kinds of
    ``active``'s systems fix (ASE's ``adjust_forces`` of each)."""
    cart, plane, line, d = _axis_parts(batch, active)
    along = row_dot(f, d).unsqueeze(-1) * d
    f = torch.where(cart, f * (1.0 - d), f)  # f * ~mask
    f = torch.where(plane, f - along, f)
    return torch.where(line, along, f)


@primitive
def axis_positions(
    batch: Any, old: torch.Tensor, new: torch.Tensor, active: torch.Tensor
) -> torch.Tensor:
    """Positions ``new`` with the part of the move from ``old`` that the axis kinds of
    ``active``'s systems fix undone (ASE's ``adjust_positions`` of each)."""
    cart, plane, line, d = _axis_parts(batch, active)
    along = row_dot(new - old, d).unsqueeze(-1) * d
    new = torch.where(cart & (d != 0), old, new)
    new = torch.where(plane, new - along, new)
    return torch.where(line, old + along, new)


class FixComKind(Constraint):
    """ASE ``FixCom``: the centre of mass of the whole structure does not move
    (``com_fixed`` per system; 3 DOF removed).  Positions shift by the centre's
    displacement, velocities lose the centre's velocity, forces lose ``m λ`` with
    ``λ = Σ m F / Σ m²`` -- ASE's three formulas."""

    ase_names = ("FixCom",)
    bit = 1 << 2
    order = 70
    fields: ClassVar[dict[str, ConstraintField]] = {
        "com_fixed": ConstraintField("system", dtype="bool"),
    }

    def encode(self, constraint: Any, host: Host) -> None:
        if host.array("com_fixed")[0]:
            raise host.refuse("FixCom given twice; give it once")
        host.array("com_fixed")[0] = True
        host.flags |= self.bit
        host.dof += 3.0

    def decode(self, arrays: dict[str, np.ndarray], system: dict[str, Any]) -> list[Any]:
        from ase.constraints import FixCom

        return [FixCom()] if bool(system["com_fixed"]) else []

    def adjust_positions(self, batch, old, new, active):  # type: ignore[no-untyped-def]
        return fix_com(batch, new, old, COM_POSITIONS, active)

    def adjust_velocities(self, batch, velocities, active):  # type: ignore[no-untyped-def]
        return fix_com(batch, velocities, velocities, COM_VELOCITIES, active)

    def adjust_forces(self, batch, forces, active):  # type: ignore[no-untyped-def]
        return fix_com(batch, forces, forces, COM_FORCES, active)


COM_POSITIONS = 0
""":func:`fix_com` of positions: shifted back by the centre of mass's move."""
COM_VELOCITIES = 1
""":func:`fix_com` of velocities: less the centre of mass's velocity."""
COM_FORCES = 2
""":func:`fix_com` of forces: less ``m λ``, ``λ = Σ m F / Σ m²``."""


def _mean(batch: Any, values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``Σ m x / Σ w`` per system ``[B, 3]``, gathered onto atoms ``[N, 3]``."""
    seg = batch.segments
    num = seg.sum(values * batch.masses.unsqueeze(-1))
    return seg.to_atoms(num / seg.sum(weights).clamp_min(1e-300).unsqueeze(-1))


@primitive
def fix_com(
    batch: Any, values: torch.Tensor, ref: torch.Tensor, what: int, active: torch.Tensor
) -> torch.Tensor:
    """``values`` ``[N, 3]`` of the FixCom systems among ``active`` adjusted (``what``):
    positions shifted by the centre's move from ``ref``, velocities less the centre's,
    forces less ``m λ`` with ``λ = Σ m F / Σ m²``."""
    on = batch.atom_mask(active & batch.com_fixed).unsqueeze(-1)
    m = batch.masses
    if what == COM_POSITIONS:
        out = values + (_mean(batch, ref, m) - _mean(batch, values, m))
    elif what == COM_VELOCITIES:
        out = values - _mean(batch, values, m)
    else:
        out = values - m.unsqueeze(-1) * _mean(batch, values, m * m)
    return torch.where(on, out, values)


for _kind in (FixAtomsKind(), AxisKind(), FixComKind()):
    register_constraint(_kind)

from . import constraint_bonds, constraint_forces, symmetrize  # noqa: E402,F401  (register theirs)

__all__ = [
    "AXIS_CARTESIAN",
    "AXIS_LINE",
    "AXIS_PLANE",
    "COM_FORCES",
    "COM_POSITIONS",
    "COM_VELOCITIES",
    "AxisKind",
    "FixAtomsKind",
    "FixComKind",
    "axis_positions",
    "axis_project",
    "fix_com",
]  # fmt: skip
