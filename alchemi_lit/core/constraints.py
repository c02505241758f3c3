"""Constraints: ASE's ``ase.constraints`` as per-system, batched data and ONE interface.

How a constraint plugs in (the contract every kind keeps, FixSymmetry included):

* **Data lives in batch fields.**  A kind declares the fields it owns in
  :attr:`Constraint.fields` (per atom ``[N, ...]`` or per system ``[B, ...]``); zero means
  "no constraint here", because :meth:`~alchemi_lit.core.state.Batch.concatenate` fills a
  field a batch lacks with zeros.  Atom-to-atom links are stored as *offsets* to the
  partner atom inside the same system (``partner = i + offset``), which survive
  :meth:`~alchemi_lit.core.state.Batch.select`, inflight joins, checkpoints and the
  pipeline's packed buffers unchanged.  Two shared system fields say which kinds a
  system carries (``constraint_flags``, one bit per kind: :attr:`Constraint.bit`) and
  the degrees of freedom they remove beyond ``FixAtoms`` (``constraint_dof``, ASE's
  ``get_removed_dof`` summed).  The step loop declares every registered kind's fields on
  every batch (:func:`declare_fields`), so all batches of a run share one schema.
* **From ASE and back, on the host.**  :meth:`Constraint.encode` writes one ASE
  constraint of one structure into that structure's numpy arrays (refusing bad input
  with a :class:`~.errors.StructureError` naming the system); :meth:`Constraint.decode`
  rebuilds ASE constraint objects from one system's arrays for the result ``Atoms``.
  The ASE class names a kind accepts are :attr:`Constraint.ase_names`.
* **Applied in torch, batched, without host reads.**  Each method gets the batch and
  ``active`` ``[B]`` (the systems of the calling stage that carry this kind) and returns
  the adjusted tensor, touching nothing outside ``active``: :meth:`adjust_positions`
  (``old`` reference -- the positions before the step, carried by any cell change --
  and ``new``), :meth:`adjust_velocities` (ASE's ``adjust_momenta`` on ``v = p / m``),
  :meth:`adjust_forces` and :meth:`energy` (ASE's ``adjust_forces`` /
  ``adjust_potential_energy``), :meth:`adjust_stress` and :meth:`adjust_cell` (for
  cell filters and barostats; identity unless a kind needs them).  The orchestration --
  when each is called, in which order -- is in
  :mod:`alchemi_lit.integrators.constrain`; integrators never call kinds themselves.
* **Registered by name.**  :func:`register_constraint` adds a kind (a subclass
  instance) with a free :attr:`Constraint.bit`; a module of kinds is imported by
  :mod:`.constraint_io` (built-ins: :mod:`.constraint_kinds`), the conversions'
  module, so they are registered wherever constraints are read or applied; kinds apply in ascending
  :attr:`Constraint.order` (forces added first, then projections), which is also the
  order ASE recommends for its list.

Design record: docs/design/53-constraints.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch

from .errors import StructureError

#: system fields every batch carries: which kinds a system has, DOF they remove
FLAGS_FIELD = "constraint_flags"
DOF_FIELD = "constraint_dof"


@dataclass(frozen=True)
class ConstraintField:
    """A batch field a constraint kind owns; zero (the fill) means "not constrained"."""

    kind: Literal["atom", "system"]
    shape: tuple[int, ...] = ()
    dtype: Literal["float", "int64", "bool"] = "float"


SHARED_FIELDS = {
    FLAGS_FIELD: ConstraintField("system", dtype="int64"),
    DOF_FIELD: ConstraintField("system"),
}


class Host:
    """One structure's constraint arrays while it is encoded (numpy, zero-filled),
    with the structure's name for error messages."""

    def __init__(self, atoms: Any, index: int, name: str, fixed: np.ndarray) -> None:
        self.atoms, self.index, self.name = atoms, index, name
        self.n = len(atoms)
        self.fixed = fixed  # FixAtoms (and FixCartesian of x, y and z)
        self.arrays: dict[str, np.ndarray] = {}
        self.flags = 0
        self.dof = 0.0
        self.claimed: dict[str, np.ndarray] = {}  # per-atom owner checks (one_per_atom)

    def array(self, name: str) -> np.ndarray:
        """The zero-filled array of field ``name`` for this structure."""
        if name not in self.arrays:
            spec = field_specs()[name]
            n = self.n if spec.kind == "atom" else 1
            dtype = {"float": np.float64, "int64": np.int64, "bool": bool}[spec.dtype]
            self.arrays[name] = np.zeros((n, *spec.shape), dtype=dtype)
        return self.arrays[name]

    def refuse(self, message: str) -> StructureError:
        """A :class:`StructureError` naming this structure (raise it)."""
        return StructureError(f"{self.name}: {message}", self.index)

    def indices(self, what: str, values: Any) -> np.ndarray:
        """``values`` as atom indices of this structure, range-checked (negative
        indices count from the end, as in ASE)."""
        one = isinstance(values, (int, np.integer)) and not isinstance(values, (bool, np.bool_))
        if one and -self.n <= values < self.n:  # (a Hookean or pull end, per constraint)
            return np.array([values % self.n], dtype=np.int64)
        idx = np.atleast_1d(np.asarray(values))
        if idx.dtype == bool:
            if idx.shape != (self.n,):
                raise self.refuse(f"{what}: a mask of {len(idx)} for {self.n} atoms")
            idx = np.flatnonzero(idx)
        idx = idx.astype(np.int64)
        bad = (idx >= self.n) | (idx < -self.n)
        if bad.any():
            raise self.refuse(
                f"{what}: atom index {int(idx[bad][0])} out of range for {self.n} atoms; "
                f"indices count from 0 in each structure"
            )
        return np.where(idx < 0, idx + self.n, idx)

    def claim(self, group: str, atoms: np.ndarray, what: str, hint: str) -> None:
        """Mark ``atoms`` as taken in ``group`` (one slot per atom); an atom taken twice
        or fixed by ``FixAtoms`` raises (a contradiction or an ambiguous overlap)."""
        owner = self.claimed.setdefault(group, np.zeros(self.n, dtype=bool))
        for i in atoms:
            if self.fixed[i] and group != "pull":
                raise self.refuse(f"atom {i} is fixed (FixAtoms) and also in {what}; {hint}")
            if owner[i]:
                raise self.refuse(f"atom {i} is in two constraints of its kind ({what}); {hint}")
            owner[i] = True


class Constraint:
    """A constraint kind: its fields, its ASE conversion and its batched adjustments.

    See the module docstring for the contract.  Every adjustment defaults to the
    identity, so a kind implements only what it changes.
    """

    #: ASE class names this kind accepts (``type(c).__name__``)
    ase_names: ClassVar[tuple[str, ...]] = ()
    #: bit in ``constraint_flags``; unique per kind
    bit: ClassVar[int] = 0
    #: application order (ascending): forces are added before projections remove parts
    order: ClassVar[int] = 100
    #: fields this kind owns
    fields: ClassVar[dict[str, ConstraintField]] = {}
    #: moves positions or velocities (a holonomic constraint); a fluctuating cell
    #: (barostats) refuses such kinds
    holonomic: ClassVar[bool] = True
    #: integrators honour it themselves (FixAtoms: :func:`~alchemi_lit.integrators.ops.
    #: moving_atoms`); the step loop applies only its forces
    native: ClassVar[bool] = False

    # ----------------------------------------------------------- host side
    def encode(self, constraint: Any, host: Host) -> None:
        """Write ``constraint`` (an ASE object) into ``host``'s arrays."""
        raise TypeError(f"{type(self).__name__} reads no ASE constraint")

    def decode(self, arrays: dict[str, np.ndarray], system: dict[str, Any]) -> list[Any]:
        """ASE constraint objects for one system from its arrays (per-atom fields sliced
        to the system, per-system fields as scalars)."""
        return []

    # ----------------------------------------------------------- torch side
    def adjust_positions(
        self, batch: Any, old: torch.Tensor, new: torch.Tensor, active: torch.Tensor
    ) -> torch.Tensor:
        """Positions ``new`` ``[N, 3]`` made to satisfy the constraint, from ``old``."""
        return new

    def adjust_velocities(
        self, batch: Any, velocities: torch.Tensor, active: torch.Tensor
    ) -> torch.Tensor:
        """Velocities ``[N, 3]`` made to satisfy the constraint (ASE's ``adjust_momenta``)."""
        return velocities

    def adjust_forces(self, batch: Any, forces: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        """Forces ``[N, 3]`` as ASE's ``adjust_forces`` leaves them."""
        return forces

    def energy(self, batch: Any, active: torch.Tensor) -> torch.Tensor | None:
        """Energy ``[B]`` this kind adds (ASE's ``adjust_potential_energy``), or None."""
        return None

    def adjust_stress(self, batch: Any, stress: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        """Stress ``[B, 3, 3]`` as ASE's ``adjust_stress`` leaves it."""
        return stress

    def adjust_cell(
        self, batch: Any, old: torch.Tensor, new: torch.Tensor, active: torch.Tensor
    ) -> torch.Tensor:
        """A new cell ``[B, 3, 3]`` as ASE's ``adjust_cell`` leaves it."""
        return new


_KINDS: dict[str, Constraint] = {}
#: the kinds in application order, sorted when one registers (read several times a step)
_ORDERED: list[tuple[Constraint, ...]] = [()]


def register_constraint(kind: Constraint) -> Constraint:
    """Register a constraint kind (an instance): its ASE names, bit and fields."""
    for other in _KINDS.values():
        if other.bit == kind.bit or set(other.ase_names) & set(kind.ase_names):
            if type(other) is type(kind):
                return other
            raise ValueError(f"{type(kind).__name__}: bit or ASE name already taken by {other}")
    clash = set(kind.fields) & set(field_specs())
    if clash:
        raise ValueError(f"{type(kind).__name__}: fields {sorted(clash)} already declared")
    _KINDS[type(kind).__name__] = kind
    _ORDERED[0] = tuple(sorted(_KINDS.values(), key=lambda k: (k.order, k.bit)))
    return kind


def constraint_kinds() -> tuple[Constraint, ...]:
    """Every registered kind, in application order (the built-ins are registered by
    importing :mod:`.constraint_io`, which every user of the kinds imports)."""
    return _ORDERED[0]


def field_specs() -> dict[str, ConstraintField]:
    """Every constraint field (shared and per kind) by name."""
    specs = dict(SHARED_FIELDS)
    for kind in _KINDS.values():
        specs.update(kind.fields)
    return specs


def fixes_atoms(constraint: Any) -> bool:
    """Whether ``constraint`` only fixes whole atoms: ``FixAtoms``, or a ``FixCartesian``
    of x, y and z for every atom it names (the core ``fixed`` field either way)."""
    name = type(constraint).__name__
    if name != "FixCartesian":
        return name == "FixAtoms"
    return bool(np.asarray(constraint.todict()["kwargs"]["mask"], dtype=bool).all())


def fixed_mask(atoms: Any, index: int, system_id: int | None = None) -> np.ndarray:
    """Atoms fixed by ``FixAtoms`` or by a ``FixCartesian`` of all three directions (the
    core ``fixed`` field).  Every other constraint is read, or refused by name, by
    :func:`~.constraint_io.encode_structure`."""
    from ase.constraints import FixAtoms, FixCartesian

    mask = np.zeros(len(atoms), dtype=bool)
    for c in atoms.constraints:
        if isinstance(c, FixAtoms):
            mask[c.index] = True
        elif type(c) is FixCartesian:
            kwargs = c.todict()["kwargs"]  # True = fixed here in every ASE version
            idx = np.atleast_1d(np.asarray(kwargs["a"], dtype=np.int64))
            rows = np.broadcast_to(np.asarray(kwargs["mask"], dtype=bool).reshape(-1, 3),
                                   (len(idx), 3))  # fmt: skip
            mask[idx[rows.all(axis=1)]] = True
    return mask


def partner(batch: Any, offset: torch.Tensor) -> torch.Tensor:
    """Flat index of each atom's partner ``[N]`` from an offset field (itself where the
    offset is 0)."""
    return torch.arange(batch.num_atoms, device=batch.device) + offset


def atoms_of(batch: Any, active: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """``[N]`` atoms of ``active``'s systems where ``present`` (an ``[N]`` bool) holds."""
    return batch.atom_mask(active) & present


__all__ = [
    "DOF_FIELD", "FLAGS_FIELD", "SHARED_FIELDS", "Constraint", "ConstraintField", "Host",
    "atoms_of", "constraint_kinds", "field_specs", "fixed_mask", "fixes_atoms",
    "partner",
    "register_constraint",
]  # fmt: skip
