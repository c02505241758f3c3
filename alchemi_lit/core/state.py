"""The Batch: the one carrier of every tensor of every system in flight.

A batch is a ragged set of systems stored as flat per-atom tensors ``[N, ...]`` and
per-system tensors ``[B, ...]``; ``system_idx[N]`` maps each atom to its system row.
Every field lives in one of two dictionaries (``atom`` or ``system``) so a system can
be selected, concatenated, packed into a transfer buffer or checkpointed generically,
without knowing which integrator declared which field (DESIGN invariant 1).

Why not one Python object per system (ASE) or a fixed struct (TorchSim)?  Integrators
are plugins that add their own state (FIRE's dt/alpha, thermostat variables); with
field dictionaries they declare it once (:meth:`Batch.ensure_field`) and everything
that moves systems around carries it for free.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from . import system_sums
from .atoms_codec import atoms_from_host, default_system_ids, fields_from_atoms, steps_taken
from .fields import (
    ARRAYS_KEY,
    ATOM_FIELDS,
    EXIT_COMPLETED,
    EXIT_CONVERGED,
    EXIT_MAX_STEPS,
    EXIT_MODEL_ERROR,
    EXIT_QUARANTINED,
    EXIT_REASONS,
    EXIT_RUNNING,
    MODEL_ERROR_KEY,
    RESULT_INFO_KEYS,
    SYSTEM_FIELDS,
    FieldKind,
)
from .segments import Segments
from .tensor_ops import kept, may_be_set, row_dot
from .validation import (
    require_atoms,
    require_same_fields,
    require_unique_ids,
    system_name,
    validate_atoms,
)

#: names that lived here before the split into fields, validation and atoms_codec
__all__ = [
    "ARRAYS_KEY", "ATOM_FIELDS", "EXIT_COMPLETED", "EXIT_CONVERGED", "EXIT_MAX_STEPS",
    "EXIT_MODEL_ERROR", "EXIT_QUARANTINED", "EXIT_REASONS", "EXIT_RUNNING", "MODEL_ERROR_KEY",
    "RESULT_INFO_KEYS", "SYSTEM_FIELDS", "Batch", "FieldKind", "default_system_ids",
    "require_atoms", "steps_taken", "system_name", "validate_atoms",
]  # fmt: skip

_ATOM_ONLY_CORE = set(ATOM_FIELDS)
_SYSTEM_ONLY_CORE = set(SYSTEM_FIELDS)


class Batch:
    """Ragged batch of atomic systems; see module docstring.

    Build one with :meth:`from_atoms`; read results with :meth:`to_atoms`.  Fields are
    attributes (``batch.positions``, ``batch.energy``, ``batch.fire_dt`` ...).
    """

    __slots__ = ("_fixed_seen", "_force_sq", "_segments", "atom", "info", "layout", "system")

    def __init__(
        self,
        atom: dict[str, torch.Tensor],
        system: dict[str, torch.Tensor],
        info: dict[int, dict[str, Any]] | None = None,
    ) -> None:
        object.__setattr__(self, "atom", dict(atom))
        object.__setattr__(self, "system", dict(system))
        object.__setattr__(self, "info", dict(info or {}))
        # A fresh token whenever the set of atoms changes: caches (neighbour lists)
        # compare it by identity to know whether they still describe this batch.
        object.__setattr__(self, "layout", object())
        object.__setattr__(self, "_segments", None)
        object.__setattr__(self, "_fixed_seen", None)
        object.__setattr__(self, "_force_sq", None)

    # ------------------------------------------------------------------ access
    def __getattr__(self, name: str) -> torch.Tensor:
        for store in ("atom", "system"):
            fields = object.__getattribute__(self, store)
            if name in fields:
                return fields[name]
        raise AttributeError(f"Batch has no field {name!r}")

    def __setattr__(self, name: str, value: torch.Tensor) -> None:
        if name in ("system_idx", "n_atoms"):
            object.__setattr__(self, "_segments", None)  # built from these two
        if name in self.atom:
            self._check_shape(name, value, self.num_atoms)
            self.atom[name] = value
        elif name in self.system:
            self._check_shape(name, value, self.num_systems)
            self.system[name] = value
        else:
            raise AttributeError(
                f"Batch has no field {name!r}; declare new fields with "
                f"batch.ensure_field(name, kind='atom'|'system', ...)"
            )

    @staticmethod
    def _check_shape(name: str, value: torch.Tensor, n: int) -> None:
        if not isinstance(value, torch.Tensor) or value.shape[:1] != (n,):
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value)
            raise ValueError(f"field {name!r} must be a tensor with leading size {n}, got {shape}")

    def has_field(self, name: str) -> bool:
        return name in self.atom or name in self.system

    def field_kind(self, name: str) -> FieldKind:
        if name in self.atom:
            return "atom"
        if name in self.system:
            return "system"
        raise KeyError(name)

    def ensure_field(
        self,
        name: str,
        kind: FieldKind,
        shape: tuple[int, ...] = (),
        dtype: torch.dtype | None = None,
        fill: float | int | bool = 0,
    ) -> torch.Tensor:
        """Return field ``name``, creating it filled with ``fill`` if absent.

        Integrators call this for their own state; ``dtype`` defaults to the batch's
        float dtype.
        """
        if kind not in ("atom", "system"):  # else a typo ("atoms") made a system field
            raise ValueError(f"field {name!r}: kind must be 'atom' or 'system', got {kind!r}")
        store = self.atom if kind == "atom" else self.system
        other = self.system if kind == "atom" else self.atom
        if name in other:
            raise ValueError(
                f"field {name!r} already exists as a {'system' if kind == 'atom' else 'atom'} field"
            )
        if name not in store:
            n = self.num_atoms if kind == "atom" else self.num_systems
            store[name] = torch.full(
                (n, *shape), fill, dtype=dtype or self.dtype, device=self.device
            )
        return store[name]

    def drop_field(self, name: str) -> None:
        """Remove an extra field (core fields cannot be dropped)."""
        if name in ATOM_FIELDS or name in SYSTEM_FIELDS:
            raise ValueError(f"core field {name!r} cannot be dropped")
        self.atom.pop(name, None)
        self.system.pop(name, None)

    # ------------------------------------------------------------------ shape
    @property
    def num_atoms(self) -> int:
        return int(self.atom["positions"].shape[0])

    @property
    def num_systems(self) -> int:
        return int(self.system["cell"].shape[0])

    def __len__(self) -> int:
        return self.num_systems

    @property
    def dtype(self) -> torch.dtype:
        return self.atom["positions"].dtype

    @property
    def device(self) -> torch.device:
        return self.atom["positions"].device

    @property
    def ptr(self) -> torch.Tensor:
        """Offsets ``[B+1]``: atoms of system row b are ``ptr[b]:ptr[b+1]``."""
        n = self.system["n_atoms"]
        return torch.cat([n.new_zeros(1), torch.cumsum(n, 0)])

    @property
    def segments(self) -> Segments:
        """Per-system sums and broadcasts for this batch's atoms (built once, cached)."""
        if self._segments is None:
            object.__setattr__(
                self, "_segments", Segments(self.atom["system_idx"], self.system["n_atoms"])
            )
        return self._segments

    def may_have_fixed_atoms(self) -> bool:
        """False only when no atom is known to be fixed, at no cost: on CPU the answer
        is read once per ``fixed`` tensor (and again if it is written to), on an
        accelerator it is True (see :func:`~alchemi_lit.core.tensor_ops.may_be_set`)."""
        return self._kept("_fixed_seen", self.atom["fixed"], may_be_set)

    def force_sq_norms(self) -> torch.Tensor:
        """Per-atom squared force norms ``|F|^2`` ``[N]``, computed once per forces tensor
        (again if it is written to): NaNGuard, the force criterion and FIRE all read them
        in every step, on the same forces."""
        return self._kept("_force_sq", self.atom["forces"], row_dot)

    def forget_derived(self) -> None:
        """Drop what is derived from the fields and kept (segments, masks, ``|F|^2``):
        recomputed when next asked for (after a CUDA graph capture that failed, whose
        values were never filled in)."""
        for slot in ("_segments", "_fixed_seen", "_force_sq"):
            object.__setattr__(self, slot, None)

    def _kept(self, slot: str, tensor: torch.Tensor, compute: Callable[[torch.Tensor], Any]) -> Any:
        """``compute(tensor)``, kept in ``slot`` (see :func:`~alchemi_lit.core.tensor_ops.kept`)."""
        memo = kept(getattr(self, slot), tensor, compute)
        object.__setattr__(self, slot, memo)
        return memo[2]

    def atom_mask(self, system_mask: torch.Tensor) -> torch.Tensor:
        """Broadcast a per-system boolean mask ``[B]`` to atoms ``[N]``."""
        return system_mask.index_select(0, self.atom["system_idx"])  # [idx] is slower on CPU

    @property
    def volume(self) -> torch.Tensor:
        """Cell volume per system ``[B]`` (0 for systems without a 3-D cell)."""
        return system_sums.cell_volume(self.system["cell"])

    def temperature(self) -> torch.Tensor:
        """Instantaneous kinetic temperature per system ``[B]`` in K, over
        :meth:`degrees_of_freedom`, so values compare directly with ASE's
        ``Atoms.get_temperature``."""
        return system_sums.temperature(self.atom["velocities"], self.atom["masses"],
                                       self.segments, self.system["n_atoms"],
                                       *self._dof_inputs())  # fmt: skip

    def kinetic_energy(self, atoms: torch.Tensor | None = None) -> torch.Tensor:
        """Kinetic energy per system ``[B]`` in eV, of the atoms in the ``[N]`` or
        ``[N, 1]`` mask ``atoms`` (all by default)."""
        return system_sums.kinetic_energy(self.atom["velocities"], self.atom["masses"],
                                          self.segments, atoms)  # fmt: skip

    def degrees_of_freedom(self) -> torch.Tensor:
        """ASE's ``3 N - sum(constraint.get_removed_dof())`` per system ``[B]``, as a
        float: 3 per atom not fixed (``FixAtoms``), less what the other constraints
        remove (``constraint_dof``: 1 per FixedPlane atom or rigid bond, 2 per
        FixedLine atom, 1 per fixed Cartesian axis, 3 for FixCom)."""
        return system_sums.degrees_of_freedom(self.segments, self.system["n_atoms"],
                                              *self._dof_inputs(), self.dtype)  # fmt: skip

    def _dof_inputs(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        fixed = self.atom["fixed"] if self.may_have_fixed_atoms() else None
        return fixed, self.system.get("constraint_dof")

    # ------------------------------------------------------------------ moving
    def to(
        self, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> Batch:
        """Copy to ``device`` and/or cast floating fields to ``dtype``."""

        def move(t: torch.Tensor) -> torch.Tensor:
            if dtype is not None and t.is_floating_point():
                t = t.to(dtype)
            return t.to(device) if device is not None else t

        return Batch(
            {k: move(v) for k, v in self.atom.items()},
            {k: move(v) for k, v in self.system.items()},
            copy.deepcopy(self.info),  # a copy must not share the (mutable) info dicts
        )

    def clone(self) -> Batch:
        return Batch(
            {k: v.clone() for k, v in self.atom.items()},
            {k: v.clone() for k, v in self.system.items()},
            copy.deepcopy(self.info),
        )

    def atom_index(self, rows: torch.Tensor) -> torch.Tensor:
        """Flat atom indices of system rows ``rows`` (in that order)."""
        rows = torch.as_tensor(rows, dtype=torch.long, device=self.device)
        counts = self.system["n_atoms"][rows]
        starts = self.ptr[rows]
        total = int(counts.sum())
        offsets = torch.repeat_interleave(
            starts - (torch.cumsum(counts, 0) - counts), counts, output_size=total
        )
        return offsets + torch.arange(total, device=self.device)

    def select(self, rows: torch.Tensor | Sequence[int]) -> Batch:
        """New batch with system rows ``rows`` (in that order), every field kept."""
        rows = torch.as_tensor(rows, device=self.device)
        if rows.dtype == torch.bool:  # a mask: check before casting, or True/False -> 1/0
            rows = rows.nonzero().flatten()
        rows = rows.to(torch.long)
        aidx = self.atom_index(rows)
        atom = {k: v[aidx] for k, v in self.atom.items()}
        counts = self.system["n_atoms"][rows]
        atom["system_idx"] = torch.repeat_interleave(
            torch.arange(len(rows), device=self.device), counts, output_size=len(aidx)
        )
        system = {k: v[rows] for k, v in self.system.items()}
        ids = system["system_id"].tolist()
        require_unique_ids(ids, "select", "select each row once")
        info = {i: self.info[i] for i in ids if i in self.info}
        return Batch(atom, system, info)

    @staticmethod
    def concatenate(batches: Sequence[Batch]) -> Batch:
        """Join batches system-wise; fields missing in some batch are filled with zeros.

        A field must be declared alike (kind, trailing shape, dtype) in every batch that
        has it, and a ``system_id`` may occur once: :class:`BatchError` otherwise.
        """
        batches = [b for b in batches if b is not None]
        if not batches:
            raise ValueError("concatenate needs at least one batch")
        if len(batches) == 1:
            return batches[0].clone()
        require_same_fields(batches)
        require_unique_ids(
            list(itertools.chain.from_iterable(b.system["system_id"].tolist() for b in batches)),
            "concatenate",
            "a system may be in one of the batches only; drop the copies or give them new ids",
        )
        ref = batches[0]
        atom_keys = dict.fromkeys(itertools.chain.from_iterable(b.atom for b in batches))
        sys_keys = dict.fromkeys(itertools.chain.from_iterable(b.system for b in batches))

        def gather(store: str, key: str) -> torch.Tensor:
            parts = []
            template = next(getattr(b, store)[key] for b in batches if key in getattr(b, store))
            for b in batches:
                fields = getattr(b, store)
                n = b.num_atoms if store == "atom" else b.num_systems
                if key in fields:
                    parts.append(fields[key].to(template.device))
                else:
                    parts.append(template.new_zeros((n, *template.shape[1:])))
            return torch.cat(parts)

        atom = {k: gather("atom", k) for k in atom_keys if k != "system_idx"}
        system = {k: gather("system", k) for k in sys_keys}
        counts = system["n_atoms"]
        atom["system_idx"] = torch.repeat_interleave(
            torch.arange(len(counts), device=ref.device), counts
        )
        info: dict[int, dict[str, Any]] = {}
        for b in batches:
            info.update(b.info)
        return Batch(atom, system, info)

    def __repr__(self) -> str:
        extra = [
            k for k in (*self.atom, *self.system) if k not in ATOM_FIELDS and k not in SYSTEM_FIELDS
        ]
        return (
            f"Batch(systems={self.num_systems}, atoms={self.num_atoms}, dtype={self.dtype}, "
            f"device={self.device}, extra_fields={extra})"
        )

    # ------------------------------------------------------------------ ASE I/O
    @classmethod
    def from_atoms(
        cls,
        atoms: Iterable[Any],
        system_ids: Sequence[int] | None = None,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str = "cpu",
        validate: bool = True,
        min_distance: float = 0.5,
    ) -> Batch:
        """Build a batch from ``ase.Atoms`` objects: positions, numbers, masses, momenta,
        tags, cell, pbc, ``FixAtoms``, ``info`` and other numeric per-atom arrays (what is
        kept, refused and warned about: :func:`~alchemi_lit.core.atoms_codec.fields_from_atoms`).
        ``system_ids`` (the systems' global identity) default to
        :func:`~alchemi_lit.core.atoms_codec.default_system_ids`; with ``validate`` every
        system is checked (:func:`~alchemi_lit.core.validation.validate_atoms`), atoms closer
        than ``min_distance`` Å giving a :class:`StructureWarning`."""
        return cls(*fields_from_atoms(atoms, system_ids, dtype, device, validate, min_distance))

    def to_atoms(self, results: bool = True) -> list[Any]:
        """Convert back to ``ase.Atoms`` in ``system_id`` (input) order, everything
        :meth:`from_atoms` kept included; with ``results`` also a single-point calculator
        (energy, forces, stress where computed) and the results in ``info``
        (:func:`~alchemi_lit.core.atoms_codec.atoms_from_host`)."""
        host = self.to(device="cpu")  # its info is a private deep copy
        return atoms_from_host(
            {k: v.numpy() for k, v in host.atom.items()},
            {k: v.numpy() for k, v in host.system.items()},
            host.info,
            results,
        )
