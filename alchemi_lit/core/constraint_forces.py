"""Constraint kinds that add forces and energy: ASE's ``Hookean`` (atom-atom, atom-point,
atom-plane springs, with ASE's threshold ``rt`` and minimum-image convention) and
``ExternalForce`` (a constant force pulling two atoms apart).  Neither removes a degree
of freedom nor moves an atom itself; both add ``adjust_potential_energy`` to the energy
as ASE's ``Atoms.get_potential_energy`` does.

Storage: one slot per atom for each kind (the spring's or the pull's first atom, or the
second where the first is taken), with the partner as an offset inside the system.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from .backends import primitive
from .constraints import Constraint, ConstraintField, Host, partner, register_constraint
from .linalg import inverse
from .tensor_ops import row_dot, rows_times, small_matmul

SPRING_ATOM = 1
"""``spring_kind`` of a Hookean spring between two atoms (``spring_offset``: the other)."""
SPRING_POINT = 2
"""``spring_kind`` of a Hookean tether to a point (``spring_target[:3]``)."""
SPRING_PLANE = 3
"""``spring_kind`` of a Hookean spring to a plane ``A x + B y + C z + D = 0``."""

def _shifts(like: torch.Tensor) -> torch.Tensor:
    """The 27 image shifts ``{-1, 0, 1}^3`` ``[27, 3]``, made on ``like``'s device (no
    copy from the host, which a CUDA graph could not capture)."""
    one = torch.arange(-1, 2, device=like.device).to(like.dtype)
    return torch.cartesian_prod(one, one, one)


def mic_cells(batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Each system's cell with identity rows along its open axes, and its inverse
    ``[B, 3, 3]``: the lattice :func:`minimum_image` wraps into."""
    eye = torch.eye(3, dtype=batch.dtype, device=batch.device)
    cell = torch.where(batch.pbc.unsqueeze(-1), batch.cell, eye)
    return cell, inverse(cell)


def minimum_image(batch: Any, d: torch.Tensor) -> torch.Tensor:
    """``d`` ``[N, 3]`` (a vector per atom of its system) as its shortest periodic
    image, as ASE's ``find_mic``: wrapped into the cell along periodic axes, then the
    shortest of the 27 neighbouring images."""
    seg = batch.segments
    cell, inv = mic_cells(batch)
    cell_a = seg.to_atoms(cell)  # [N, 3, 3]
    pbc_a = seg.to_atoms(batch.pbc).to(d.dtype)  # [N, 3]
    frac = rows_times(d, seg.to_atoms(inv))  # (a row's bits: its own alone)
    frac = frac - torch.round(frac) * pbc_a
    shifts = _shifts(d)[None] * pbc_a[:, None]  # [N, 27, 3]
    images = small_matmul(frac[:, None] + shifts, cell_a)
    best = (images * images).sum(-1).argmin(1)
    return images[torch.arange(len(d), device=d.device), best]


def _slot(host: Host, group: str, a1: int, a2: int | None, what: str) -> tuple[int, int]:
    """The atom whose slot holds a link ``a1 -> a2`` (a1's, else a2's) and the offset."""
    owner = host.claimed.setdefault(group, np.zeros(host.n, dtype=bool))
    for first, second in ((a1, a2), (a2, a1)):
        if first is not None and not owner[first]:
            owner[first] = True
            return first, 0 if second is None else second - first
    raise host.refuse(
        f"atom {a1} already carries a {what} (one per atom here, or per atom pair end); "
        f"combine them into one"
    )


class HookeanKind(Constraint):
    """ASE ``Hookean``: ``spring_kind`` (1 atom-atom, 2 atom-point, 3 atom-plane),
    ``spring_k`` (eV/Å², >= 0), ``spring_rt`` (Å), ``spring_target`` (point, or plane
    ``A, B, C, D``), ``spring_offset`` (the partner atom)."""

    ase_names = ("Hookean",)
    bit = 1 << 3
    order = 10
    holonomic = False
    fields: ClassVar[dict[str, ConstraintField]] = {
        "spring_kind": ConstraintField("atom", dtype="int64"),
        "spring_offset": ConstraintField("atom", dtype="int64"),
        "spring_k": ConstraintField("atom"),
        "spring_rt": ConstraintField("atom"),
        "spring_target": ConstraintField("atom", (4,)),
    }

    def encode(self, constraint: Any, host: Host) -> None:
        kw = constraint.todict()["kwargs"]
        k, rt, a2 = float(kw["k"]), kw["rt"], kw["a2"]
        if not np.isfinite(k) or k < 0:
            raise host.refuse(f"Hookean spring constant k={k} must be >= 0 (eV/Å²)")
        a1 = int(host.indices("Hookean a1", kw["a1"])[0])
        target = np.zeros(4)
        if constraint._type == "two atoms":
            kind, other = SPRING_ATOM, int(host.indices("Hookean a2", a2)[0])
            if other == a1:
                raise host.refuse(f"Hookean joins atom {a1} to itself")
        else:
            kind, other = (SPRING_POINT if len(a2) == 3 else SPRING_PLANE), None
            target[: len(a2)] = np.asarray(a2, dtype=np.float64)
            if kind == SPRING_PLANE and not np.any(target[:3]):
                raise host.refuse(f"Hookean plane {list(a2)} has no normal (A, B, C)")
        if kind != SPRING_PLANE and (rt is None or not np.isfinite(rt) or rt < 0):
            raise host.refuse(f"Hookean of atom {a1}: threshold rt={rt} must be >= 0 (Å)")
        i, offset = _slot(host, "spring", a1, other, "Hookean spring")
        host.array("spring_kind")[i] = kind
        host.array("spring_offset")[i] = offset
        host.array("spring_k")[i] = k
        host.array("spring_rt")[i] = 0.0 if rt is None else float(rt)
        host.array("spring_target")[i] = target
        host.flags |= self.bit

    def decode(self, arrays: dict[str, np.ndarray], system: dict[str, Any]) -> list[Any]:
        from ase.constraints import Hookean

        out = []
        for i in np.flatnonzero(arrays["spring_kind"]):
            kind, t = int(arrays["spring_kind"][i]), arrays["spring_target"][i]
            k, rt = float(arrays["spring_k"][i]), float(arrays["spring_rt"][i])
            if kind == SPRING_ATOM:
                out.append(Hookean(int(i), int(i + arrays["spring_offset"][i]), k, rt))
            elif kind == SPRING_POINT:
                out.append(Hookean(int(i), tuple(t[:3].tolist()), k, rt))
            else:
                out.append(Hookean(int(i), tuple(t.tolist()), k))
        return out

    def adjust_forces(self, batch, forces, active):  # type: ignore[no-untyped-def]
        return forces + spring_terms(batch, active)[0]

    def energy(self, batch, active):  # type: ignore[no-untyped-def]
        return batch.segments.sum(spring_terms(batch, active)[1])


class ExternalForceKind(Constraint):
    """ASE ``ExternalForce(a1, a2, f_ext)``: ``f_ext`` (eV/Å) along ``r1 - r2`` on
    ``a1`` and against it on ``a2``; energy ``-|r1 - r2| f_ext`` (no minimum image, as
    ASE).  ``pull_offset`` (the partner, nonzero where a pull is) and ``pull_force``."""

    ase_names = ("ExternalForce",)
    bit = 1 << 4
    order = 0
    holonomic = False
    fields: ClassVar[dict[str, ConstraintField]] = {
        "pull_offset": ConstraintField("atom", dtype="int64"),
        "pull_force": ConstraintField("atom"),
    }

    def encode(self, constraint: Any, host: Host) -> None:
        a1, a2 = (int(i) for i in host.indices("ExternalForce", constraint.indices))
        f = float(constraint.external_force)
        if a1 == a2 or not np.isfinite(f):
            raise host.refuse(f"ExternalForce({a1}, {a2}, {f}) needs two atoms and a finite force")
        i, offset = _slot(host, "pull", a1, a2, "ExternalForce")
        host.array("pull_offset")[i] = offset
        host.array("pull_force")[i] = f  # symmetric: the force is along r_slot - r_partner
        host.flags |= self.bit

    def decode(self, arrays: dict[str, np.ndarray], system: dict[str, Any]) -> list[Any]:
        from ase.constraints import ExternalForce

        return [
            ExternalForce(int(i), int(i + arrays["pull_offset"][i]), float(arrays["pull_force"][i]))
            for i in np.flatnonzero(arrays["pull_offset"])
        ]

    def adjust_forces(self, batch, forces, active):  # type: ignore[no-untyped-def]
        return forces + pull_terms(batch, active)[0]

    def energy(self, batch, active):  # type: ignore[no-untyped-def]
        return batch.segments.sum(pull_terms(batch, active)[1])


@primitive
def spring_terms(batch: Any, active: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The Hookean springs of ``active``'s systems: the force on each atom ``[N, 3]``
    (both ends of a spring between atoms) and each slot's energy ``[N]``."""
    kind = torch.where(batch.atom_mask(active), batch.spring_kind, 0)
    r, t, k = batch.positions, batch.spring_target, batch.spring_k
    other = partner(batch, batch.spring_offset)
    p2 = torch.where((kind == SPRING_ATOM).unsqueeze(-1), r.index_select(0, other), t[:, :3])
    d = minimum_image(batch, p2 - r)
    length = d.norm(dim=-1)
    stretch = length - batch.spring_rt
    on = (kind == SPRING_ATOM) | (kind == SPRING_POINT)
    pulled = on & (stretch > 0)
    f_pair = (k * stretch / length.clamp_min(1e-300)).unsqueeze(-1) * d
    e_pair = 0.5 * k * stretch * stretch
    normal = t[:, :3]
    norm = normal.norm(dim=-1).clamp_min(1e-300)
    dist = (row_dot(r, normal) + t[:, 3]) / norm
    plane = kind == SPRING_PLANE
    f_plane = -(k * dist / norm).unsqueeze(-1) * normal
    force = torch.where(pulled.unsqueeze(-1), f_pair, 0.0)
    force = torch.where((plane & (dist >= 0)).unsqueeze(-1), f_plane, force)
    energy = torch.where(pulled, e_pair, 0.0)
    energy = torch.where(plane & (dist > 0), 0.5 * k * dist * dist, energy)
    back = torch.where((pulled & (kind == SPRING_ATOM)).unsqueeze(-1), -force, 0.0)
    return force.index_add(0, other, back), energy


@primitive
def pull_terms(batch: Any, active: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The ExternalForce pulls of ``active``'s systems: the force on each atom
    ``[N, 3]`` (both ends) and each slot's energy ``[N]``."""
    on = batch.atom_mask(active) & (batch.pull_offset != 0)
    other = partner(batch, batch.pull_offset)
    dist = batch.positions - batch.positions.index_select(0, other)
    length = dist.norm(dim=-1)
    f = batch.pull_force
    force = torch.where(
        on.unsqueeze(-1), (f / length.clamp_min(1e-300)).unsqueeze(-1) * dist, 0.0
    )
    return force.index_add(0, other, -force), torch.where(on, -length * f, 0.0)


for _kind in (HookeanKind(), ExternalForceKind()):
    register_constraint(_kind)


__all__ = [
    "SPRING_ATOM", "SPRING_PLANE", "SPRING_POINT", "ExternalForceKind", "HookeanKind",
    "mic_cells", "minimum_image", "pull_terms", "spring_terms",
]  # fmt: skip
