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
import numbers
import os
import sys
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, NoReturn

import numpy as np
import torch

from .errors import BatchError, StructureError, StructureWarning
from .segments import Segments
from .tensor_ops import kept, may_be_set, row_dot

FieldKind = Literal["atom", "system"]

#: Core per-atom fields and their dtype class ("float" follows the batch precision).
ATOM_FIELDS: dict[str, str] = {
    "positions": "float",
    "velocities": "float",
    "forces": "float",
    "masses": "float",
    "atomic_numbers": "int64",
    "system_idx": "int64",
    "fixed": "bool",
    "tags": "int64",
}

#: Core per-system fields.  ``energy`` is NaN until a model has evaluated the system.
SYSTEM_FIELDS: dict[str, str] = {
    "cell": "float",
    "pbc": "bool",
    "energy": "float",
    "stress": "float",
    "n_atoms": "int64",
    "system_id": "int64",
    "status": "int64",
    "step": "int64",
    "total_steps": "int64",
    "converged": "bool",
    "exit_code": "int64",
}

#: Exit codes recorded per system in ``exit_code``.
EXIT_RUNNING = 0
EXIT_CONVERGED = 1
EXIT_MAX_STEPS = 2
EXIT_COMPLETED = 3
EXIT_QUARANTINED = 4
EXIT_MODEL_ERROR = 5
EXIT_REASONS = {
    EXIT_RUNNING: "running",
    EXIT_CONVERGED: "converged",
    EXIT_MAX_STEPS: "max_steps",
    EXIT_COMPLETED: "completed",
    EXIT_QUARANTINED: "non_finite",
    EXIT_MODEL_ERROR: "model_error",
}

_ATOM_ONLY_CORE = set(ATOM_FIELDS)
_SYSTEM_ONLY_CORE = set(SYSTEM_FIELDS)

#: ``info`` key under which a system's other per-atom ``ase.Atoms.arrays``
#: (``initial_magmoms``, ``initial_charges``, extxyz columns ...) travel, as numpy arrays:
#: info already goes everywhere a system goes (transfer messages, checkpoints, zarr).
ARRAYS_KEY = "__arrays__"
#: ``ase.Atoms.arrays`` that are core batch fields rather than carried in info.
_CORE_ARRAYS = frozenset({"numbers", "positions", "masses", "momenta", "tags"})
#: ``info`` keys :meth:`Batch.to_atoms` writes with ``results=True`` (and ``stage_energy``
#: where the batch has it); an input value under one of them moves to ``input_<key>``,
#: never silently replaced.
RESULT_INFO_KEYS = ("system_id", "status", "steps", "converged", "exit_reason")
#: ``info`` key holding why a quarantined system failed (the model's exception); named
#: so it cannot be mistaken for a user's own ``error`` key.
MODEL_ERROR_KEY = "model_error"


def _count_dtype(kind: str, float_dtype: torch.dtype) -> torch.dtype:
    return {"float": float_dtype, "int64": torch.int64, "bool": torch.bool}[kind]


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
        accelerator it is True (see :func:`~alchemi_lit.tensor_ops.may_be_set`)."""
        return self._kept("_fixed_seen", self.atom["fixed"], may_be_set)

    def force_sq_norms(self) -> torch.Tensor:
        """Per-atom squared force norms ``|F|^2`` ``[N]``, computed once per forces tensor
        (again if it is written to): NaNGuard, the force criterion and FIRE all read them
        in every step, on the same forces."""
        return self._kept("_force_sq", self.atom["forces"], row_dot)

    def _kept(self, slot: str, tensor: torch.Tensor, compute: Callable[[torch.Tensor], Any]) -> Any:
        """``compute(tensor)``, kept in ``slot`` (see :func:`~alchemi_lit.tensor_ops.kept`)."""
        memo = kept(getattr(self, slot), tensor, compute)
        object.__setattr__(self, slot, memo)
        return memo[2]

    def atom_mask(self, system_mask: torch.Tensor) -> torch.Tensor:
        """Broadcast a per-system boolean mask ``[B]`` to atoms ``[N]``."""
        return system_mask.index_select(0, self.atom["system_idx"])  # 3x faster than [idx]

    @property
    def volume(self) -> torch.Tensor:
        """Cell volume per system ``[B]`` (0 for systems without a 3-D cell)."""
        return torch.linalg.det(self.system["cell"]).abs()

    def temperature(self) -> torch.Tensor:
        """Instantaneous kinetic temperature per system ``[B]`` in K.

        Degrees of freedom: 3 per free (not fixed) atom; ASE's convention for atoms
        without constraints, so values compare directly with ``Atoms.get_temperature``.
        """
        from .units import kB

        return 2.0 * self.kinetic_energy() / (self.degrees_of_freedom().clamp_min(1.0) * kB)

    def kinetic_energy(self, atoms: torch.Tensor | None = None) -> torch.Tensor:
        """Kinetic energy per system ``[B]`` in eV, of the atoms in the ``[N]`` or
        ``[N, 1]`` mask ``atoms`` (all by default)."""
        seg, v = self.segments, self.atom["velocities"]
        mv2 = v * v * seg.atom_xyz(self.atom["masses"])
        if atoms is not None:
            mv2 = torch.where(atoms.view(-1, 1), mv2, 0.0)
        return 0.5 * seg.sum_xyz(mv2)

    def degrees_of_freedom(self) -> torch.Tensor:
        """``3 x`` free (not fixed) atoms per system ``[B]``, as a float (ASE's count)."""
        if self.may_have_fixed_atoms():
            return 3.0 * self.segments.sum((~self.atom["fixed"]).to(self.dtype))
        return 3.0 * self.system["n_atoms"].to(self.dtype)

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
        _require_unique_ids(ids, "select", "select each row once")
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
        _require_same_fields(batches)
        _require_unique_ids(
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
        """Build a batch from ``ase.Atoms`` objects.

        Kept: positions, atomic numbers, masses, momenta (as velocities), tags, cell,
        pbc, ``FixAtoms`` constraints (and ``FixCartesian`` of x, y and z; as the
        ``fixed`` mask), ``info`` and the other numeric per-atom ``arrays``
        (``initial_magmoms``, ``initial_charges`` ...; carried in ``info`` under
        :data:`ARRAYS_KEY`).  Other constraints raise :class:`StructureError`, because
        silently dropping them would change the physics.  Momenta of fixed atoms are
        zeroed (as ASE's ``set_momenta`` does), with a :class:`StructureWarning` if they
        were not zero.  ``system_ids`` default to :func:`default_system_ids` (``0..B-1``,
        or the ids results of an earlier run carry); they are the systems' global
        identity (result order, random streams) and must be unique.  A structure that
        is an earlier run's result (its ``info`` holds every key of
        :data:`RESULT_INFO_KEYS`) goes on counting its steps from ``info["steps"]``
        (:func:`steps_taken`), so its random numbers continue rather than repeat.

        With ``validate`` every system is checked (see :func:`validate_atoms`); atoms
        closer than ``min_distance`` Å give a :class:`StructureWarning`, not an error.
        """
        atoms = list(atoms)
        if not atoms:
            raise StructureError("no structures given: pass a non-empty list of ase.Atoms")
        require_atoms(atoms, "from_atoms")
        if system_ids is None:
            system_ids = default_system_ids(atoms)
        elif len(system_ids) != len(atoms):
            raise ValueError(f"got {len(system_ids)} system_ids for {len(atoms)} structures")
        ids = [int(s) for s in system_ids]
        _require_unique_ids(ids, "from_atoms", "give every structure its own id", StructureError)

        pos, num, mass, mom, tags, fixed = [], [], [], [], [], []
        cells, pbcs, counts, info = [], [], [], {}
        for k, (a, sid) in enumerate(zip(atoms, ids)):
            if validate:
                validate_atoms(a, k, min_distance=min_distance, system_id=sid)
            fixed.append(_fixed_mask(a, k, sid))
            pos.append(np.asarray(a.positions, dtype=np.float64))
            num.append(np.asarray(a.numbers, dtype=np.int64))
            mass.append(np.asarray(a.get_masses(), dtype=np.float64))
            mom.append(_free_momenta(a, fixed[-1], k, sid))
            tags.append(np.asarray(a.get_tags(), dtype=np.int64))
            cells.append(np.asarray(a.cell.array, dtype=np.float64))
            pbcs.append(np.asarray(a.pbc, dtype=bool))
            counts.append(len(a))
            entry = _info_of(a, k, sid)
            if entry:
                info[sid] = entry

        def t(x: Any, dt: torch.dtype) -> torch.Tensor:
            return torch.as_tensor(np.asarray(x), dtype=dt, device=device)

        masses = t(np.concatenate(mass), dtype)
        momenta = t(np.concatenate(mom), dtype)
        n_atoms = t(counts, torch.int64)
        n_sys, n_tot = len(atoms), int(sum(counts))
        atom = {
            "positions": t(np.concatenate(pos), dtype),
            "velocities": momenta / masses[:, None],
            "forces": torch.zeros((n_tot, 3), dtype=dtype, device=device),
            "masses": masses,
            "atomic_numbers": t(np.concatenate(num), torch.int64),
            "system_idx": torch.repeat_interleave(torch.arange(n_sys, device=device), n_atoms),
            "fixed": t(np.concatenate(fixed), torch.bool),
            "tags": t(np.concatenate(tags), torch.int64),
        }
        system = {
            "cell": t(np.stack(cells), dtype),
            "pbc": t(np.stack(pbcs), torch.bool),
            "energy": torch.full((n_sys,), float("nan"), dtype=dtype, device=device),
            "stress": torch.zeros((n_sys, 3, 3), dtype=dtype, device=device),
            "n_atoms": n_atoms,
            "system_id": t(ids, torch.int64),
            "status": torch.zeros(n_sys, dtype=torch.int64, device=device),
            "step": torch.zeros(n_sys, dtype=torch.int64, device=device),
            "total_steps": t([steps_taken(a.info) for a in atoms], torch.int64),
            "converged": torch.zeros(n_sys, dtype=torch.bool, device=device),
            "exit_code": torch.zeros(n_sys, dtype=torch.int64, device=device),
        }
        return cls(atom, system, info)

    def to_atoms(self, results: bool = True) -> list[Any]:
        """Convert back to ``ase.Atoms``, sorted by ``system_id`` (input order).

        Everything :meth:`from_atoms` keeps comes back (``info`` and the carried per-atom
        ``arrays`` included).  With ``results`` each system whose energy was computed
        gets a ``SinglePointCalculator`` holding energy, forces and (3-D cells) stress,
        and ``info`` gains ``system_id``, ``status``, ``steps``, ``converged`` and
        ``exit_reason`` (and ``stage_energy``: the energy in eV when the system left each
        stage, NaN for stages it did not leave) -- so ASE tools work on the results
        directly.  An input ``info`` value under one of these keys is kept as
        ``input_<key>`` (with a :class:`StructureWarning`), unless the input was itself
        such a result, whose values are simply updated.
        """
        from ase import Atoms
        from ase.calculators.singlepoint import SinglePointCalculator
        from ase.constraints import FixAtoms
        from ase.stress import full_3x3_to_voigt_6_stress

        host = self.to(device="cpu")  # its info is a private deep copy
        a, s = (
            {k: v.numpy() for k, v in host.atom.items()},
            {k: v.numpy() for k, v in host.system.items()},
        )
        ptr = np.concatenate([[0], np.cumsum(s["n_atoms"])])
        out, moved = [], {}
        for b in np.argsort(s["system_id"], kind="stable"):
            lo, hi = ptr[b], ptr[b + 1]
            sid = int(s["system_id"][b])
            atoms = Atoms(
                numbers=a["atomic_numbers"][lo:hi],
                positions=a["positions"][lo:hi],
                cell=s["cell"][b],
                pbc=s["pbc"][b],
                masses=a["masses"][lo:hi],
                tags=a["tags"][lo:hi],
            )
            vel = a["velocities"][lo:hi]
            if np.any(vel != 0):
                atoms.set_momenta(vel * a["masses"][lo:hi, None], apply_constraint=False)
            if a["fixed"][lo:hi].any():
                atoms.set_constraint(FixAtoms(mask=a["fixed"][lo:hi]))
            atoms.info.update(host.info.get(sid, {}))
            for name, values in atoms.info.pop(ARRAYS_KEY, {}).items():
                atoms.set_array(name, values)
            if results:
                values = {
                    "system_id": sid,
                    "status": int(s["status"][b]),
                    "steps": int(s["total_steps"][b]),
                    "converged": bool(s["converged"][b]),
                    "exit_reason": EXIT_REASONS.get(int(s["exit_code"][b]), "unknown"),
                }
                if "stage_energy" in s:
                    values["stage_energy"] = s["stage_energy"][b].tolist()
                clashes = _merge_results(atoms.info, values)
                if clashes:
                    moved[sid] = clashes
                energy = float(s["energy"][b])
                if np.isfinite(energy):
                    props: dict[str, Any] = {"energy": energy, "forces": a["forces"][lo:hi].copy()}
                    stress = s["stress"][b]  # (NaN: not computed by the run)
                    if abs(np.linalg.det(s["cell"][b])) > 1e-12 and np.isfinite(stress).all():
                        props["stress"] = full_3x3_to_voigt_6_stress(stress)
                    atoms.calc = SinglePointCalculator(atoms, **props)
            out.append(atoms)
        if moved:
            keys = sorted(set(itertools.chain.from_iterable(moved.values())))
            _warn(
                f"to_atoms: the input info of system_id(s) {list(moved)[:10]} has key(s) "
                f"{keys}, which hold this run's results; the input values were kept as "
                f"{[f'input_{k}' for k in keys]}. Rename those keys in atoms.info to avoid "
                f"this, or call to_atoms(results=False)"
            )
        return out


def steps_taken(info: dict[str, Any]) -> int:
    """The step count a structure starts a run with: an earlier run's result (``info``
    holds every key of :data:`RESULT_INFO_KEYS`) continues from its ``info["steps"]``,
    as a fused run of both plans would (the noise is keyed on it); anything else -- a
    new structure, or a user's own ``steps`` key -- starts at 0."""
    steps = info.get("steps")
    earlier_result = all(k in info for k in RESULT_INFO_KEYS)
    if earlier_result and isinstance(steps, numbers.Integral) and not isinstance(steps, bool):
        return max(int(steps), 0)
    return 0


def require_atoms(structures: Sequence[Any], owner: str) -> None:
    """Every item must be an ``ase.Atoms``: anything else is named before it fails deep
    inside a run."""
    from ase import Atoms

    for k, a in enumerate(structures):
        if not isinstance(a, Atoms):
            raise StructureError(
                f"{owner}: structure {k} is of type {type(a).__name__}, not ase.Atoms; read "
                f"structure files with alchemi_lit.data.read_structures (or pass the path)",
                k,
            )


def default_system_ids(atoms: Sequence[Any]) -> list[int]:
    """Ids of structures given without explicit ``system_ids``: the ``info["system_id"]``
    each carries when all carry distinct integers (results of an earlier run read back,
    so a system keeps its identity from run to run), else positions ``0..n-1``."""
    ids = [a.info.get("system_id") for a in atoms]
    integral = all(isinstance(i, numbers.Integral) and not isinstance(i, bool) for i in ids)
    if ids and integral and len(set(ids)) == len(ids):
        return [int(i) for i in ids]
    return list(range(len(atoms)))


# ---------------------------------------------------------------------- batch checks
def _require_unique_ids(
    ids: list[int], where: str, fix: str, error: type[ValueError] = BatchError
) -> None:
    """A ``system_id`` names one system; a repeated one would mix up results and info."""
    repeated = [sid for sid, n in Counter(ids).items() if n > 1]
    if repeated:
        raise error(
            f"{where}: system_id(s) {repeated[:10]} occur more than once, but system_ids "
            f"must be unique; {fix}"
        )


def _require_same_fields(batches: Sequence[Batch]) -> None:
    """Every batch having a field declares it alike: same kind, trailing shape, dtype."""
    seen: dict[str, tuple[int, tuple[str, tuple[int, ...], torch.dtype]]] = {}
    for k, b in enumerate(batches):
        for kind in ("atom", "system"):
            for name, value in getattr(b, kind).items():
                spec = (kind, tuple(value.shape[1:]), value.dtype)
                first, ref = seen.setdefault(name, (k, spec))
                if ref != spec:
                    raise BatchError(
                        f"concatenate: field {name!r} is {_describe(ref)} in batch {first} "
                        f"but {_describe(spec)} in batch {k}; declare it alike in every batch "
                        f"(ensure_field with the same kind, shape and dtype; "
                        f".to(dtype=...) for a different precision) or drop_field it"
                    )


def _describe(spec: tuple[str, tuple[int, ...], torch.dtype]) -> str:
    kind, shape, dtype = spec
    return f"a per-{kind} field of shape [n, {', '.join(map(str, shape))}] ({dtype})".replace(
        ", ]", "]"
    )


# ---------------------------------------------------------------------- ASE conversion
def _free_momenta(atoms: Any, fixed: np.ndarray, index: int, system_id: int) -> np.ndarray:
    """The momenta with those of fixed atoms zeroed: integrators and the temperature
    count fixed atoms as at rest, and ASE's ``set_momenta`` zeroes them too."""
    momenta = np.array(atoms.get_momenta(), dtype=np.float64)
    moving = np.flatnonzero(fixed & np.any(momenta != 0, axis=1))
    if moving.size:
        _warn(
            f"{system_name(index, system_id)}: fixed atom(s) {_first(moving)} have nonzero "
            f"momenta, which are set to zero (as atoms.set_momenta does); zero them, or set "
            f"the momenta after the constraint, to avoid this warning",
            index,
            system_id,
        )
        momenta[fixed] = 0.0
    return momenta


def _info_of(atoms: Any, index: int, system_id: int) -> dict[str, Any]:
    """A private copy of ``atoms.info``, plus the non-core numeric per-atom arrays."""
    name = system_name(index, system_id)
    if ARRAYS_KEY in atoms.info:
        raise StructureError(
            f"{name}: atoms.info key {ARRAYS_KEY!r} is reserved (per-atom arrays travel "
            f"under it); rename that key",
            index,
        )
    info = copy.deepcopy(atoms.info)
    arrays = {k: v for k, v in atoms.arrays.items() if k not in _CORE_ARRAYS}
    numeric = {k: np.array(v) for k, v in arrays.items() if np.asarray(v).dtype.kind in "biuf"}
    if len(numeric) < len(arrays):
        _warn(
            f"{name}: per-atom array(s) {sorted(set(arrays) - set(numeric))} are not numeric "
            f"and are not kept; store them in atoms.info if you need them back",
            index,
            system_id,
        )
    if numeric:
        info[ARRAYS_KEY] = numeric
    return info


def _merge_results(info: dict[str, Any], values: dict[str, Any]) -> list[str]:
    """Write a run's result ``values`` into ``info``; returns the keys whose input value
    had to move to ``input_<key>``.  The info of an earlier run's result (it has every
    result key) is updated in place: feeding results back in is normal."""
    earlier_result = all(k in info for k in RESULT_INFO_KEYS)
    moved = []
    for key, value in values.items():
        if key in info and not earlier_result and not _equal(info[key], value):
            target = f"input_{key}"
            while target in info:  # never replace a user's key either
                target = f"input_{target}"
            info[target] = info[key]
            moved.append(key)
        info[key] = value
    return moved


def _equal(a: Any, b: Any) -> bool:
    """Value equality for info entries of any type (NaN equals NaN)."""
    try:
        return bool(np.array_equal(a, b, equal_nan=True))
    except (TypeError, ValueError):
        try:
            return bool(a == b)
        except Exception:
            return False


# ---------------------------------------------------------------------- validation
#: Atoms closer than this (Å) are one atom given twice: an error whatever ``min_distance``.
COINCIDENT_DISTANCE = 1e-4
#: A periodic cell thinner than this (Å) along a periodic direction is (nearly) singular:
#: the neighbour search would need about cutoff/thickness images of it.
MIN_CELL_HEIGHT = 1e-3


def system_name(index: int, system_id: int | None = None) -> str:
    """How every message names a system: ``system 2 (system_id 30)``.

    ``index`` is the position in the caller's input, ``system_id`` the global id; the id
    is left out when unknown or equal to the index (the default ids): ``system 2``.
    """
    if system_id is None or int(system_id) == int(index):
        return f"system {index}"
    return f"system {index} (system_id {int(system_id)})"


def _warn(message: str, index: int | None = None, system_id: int | None = None) -> None:
    """A :class:`StructureWarning` (filterable, testable); the CLI routes warnings to
    its log."""
    warnings.warn(StructureWarning(message, index, system_id), stacklevel=_outside_level())


def _outside_level() -> int:
    """``stacklevel`` for :func:`_warn` that points at the first caller outside this
    package (user code), wherever in alchemi_lit the warning came from."""
    package = os.path.dirname(os.path.abspath(__file__))
    frame, level = sys._getframe(2), 2  # the caller of _warn
    while frame is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def _first(indices: np.ndarray) -> list[int]:
    """The first few of ``indices`` for a message."""
    return np.asarray(indices)[:10].tolist()


def _fixed_mask(atoms: Any, index: int, system_id: int | None = None) -> np.ndarray:
    """Atoms fixed by ``FixAtoms`` or by a ``FixCartesian`` of all three directions.

    Any other constraint is a :class:`StructureError`: dropping it would silently change
    the physics.
    """
    from ase.constraints import FixAtoms, FixCartesian

    name = system_name(index, system_id)
    mask = np.zeros(len(atoms), dtype=bool)
    for c in atoms.constraints:
        if isinstance(c, FixAtoms):
            mask[c.index] = True
        elif isinstance(c, FixCartesian):
            mask[_fully_fixed(c, name, index)] = True
        else:
            raise StructureError(
                f"{name}: constraint {type(c).__name__} is not supported; only FixAtoms (and "
                f"FixCartesian of all of x, y, z) is. Remove it (atoms.set_constraint()) or "
                f"express it with FixAtoms.",
                index,
            )
    return mask


def _fully_fixed(constraint: Any, name: str, index: int) -> np.ndarray:
    """Atoms a ``FixCartesian`` fixes in x, y and z; fixing only some directions raises."""
    kwargs = constraint.todict()["kwargs"]  # True = fixed here in every ASE version
    atoms = np.atleast_1d(np.asarray(kwargs["a"], dtype=np.int64))
    mask = np.asarray(kwargs["mask"], dtype=bool).reshape(-1, 3)
    mask = np.broadcast_to(mask, (len(atoms), 3))
    partial = mask.any(axis=1) & ~mask.all(axis=1)
    if partial.any():
        raise StructureError(
            f"{name}: FixCartesian fixes only some of x, y, z of atom(s) "
            f"{_first(atoms[partial])} (mask {mask[partial][0].tolist()}); partial fixing is "
            f"not supported. Fix those atoms completely (FixAtoms, or FixCartesian with "
            f"mask=(True, True, True)) or remove the constraint (atoms.set_constraint()).",
            index,
        )
    return atoms[mask.all(axis=1)]


def validate_atoms(
    atoms: Any, index: int, min_distance: float = 0.5, system_id: int | None = None
) -> None:
    """Check one structure; raise :class:`StructureError` naming the system and the fix.

    Errors: no atoms; non-finite coordinates, momenta or cell; zero, negative or
    non-finite masses; a cell that is singular, or thinner than :data:`MIN_CELL_HEIGHT`,
    along a periodic direction; unsupported constraints; two atoms (periodic images
    count) within :data:`COINCIDENT_DISTANCE`.  Atoms closer than
    ``min_distance`` Å (periodic images count; 0 turns this off) are only a
    :class:`StructureWarning`: such structures are sometimes meant.
    """
    name = system_name(index, system_id)
    if len(atoms) == 0:
        raise StructureError(f"{name} has no atoms: remove it from the input", index)

    def fail(problem: str) -> NoReturn:
        raise StructureError(f"{name}: {problem}", index)

    pos = np.asarray(atoms.positions, dtype=np.float64)
    bad = _bad_rows(~np.isfinite(pos))
    if bad.size:
        fail(
            f"non-finite (NaN/inf) coordinates at atom(s) {_first(bad)}; fix or drop this structure"
        )
    bad = _bad_rows(~np.isfinite(np.asarray(atoms.get_momenta(), dtype=np.float64)))
    if bad.size:
        fail(f"non-finite (NaN/inf) momenta at atom(s) {_first(bad)}; fix or zero them")
    masses = np.asarray(atoms.get_masses(), dtype=np.float64)
    bad = np.flatnonzero(~(np.isfinite(masses) & (masses > 0)))
    if bad.size:
        fail(
            f"zero, negative or non-finite mass at atom(s) {_first(bad)} (element X or "
            f"atoms.set_masses); set positive masses"
        )
    cell = np.asarray(atoms.cell.array, dtype=np.float64)
    if not np.all(np.isfinite(cell)):
        fail("cell has non-finite entries; fix the cell")
    pbc = np.asarray(atoms.pbc, dtype=bool)
    heights = periodic_heights(cell, pbc)
    thin = np.flatnonzero(heights < MIN_CELL_HEIGHT)
    if thin.size:
        fail(
            f"the cell is singular or nearly so along periodic direction(s) "
            f"{np.flatnonzero(pbc)[thin].tolist()} (thickness {heights[thin].min():.3g} Å < "
            f"{MIN_CELL_HEIGHT} Å; pbc={pbc.tolist()}); give a full cell or set pbc=False "
            f"along directions without a lattice vector (periodic directions need independent "
            f"lattice vectors of sensible length)"
        )
    _fixed_mask(atoms, index, system_id)
    _check_distances(pos, cell, pbc, heights, min_distance, name, index, system_id)


def _bad_rows(bad: np.ndarray) -> np.ndarray:
    """Rows of an ``[n, 3]`` mask with any entry set."""
    return np.flatnonzero(bad.any(axis=1))


def periodic_heights(cell: np.ndarray, pbc: np.ndarray) -> np.ndarray:
    """Thickness of the cell along each periodic direction (Å), in ``pbc`` order.

    How far periodic lattice vector i reaches out of the span of the other periodic
    vectors: the spacing of the lattice planes, 0 where the vectors are dependent.  A
    periodic image of an atom is at least the smallest of these away, and a neighbour
    search needs about cutoff/thickness images.
    """
    vectors = cell[np.asarray(pbc, dtype=bool)]
    heights = np.empty(len(vectors))
    for i, v in enumerate(vectors):
        others = np.delete(vectors, i, axis=0).T
        if others.size:
            v = v - others @ np.linalg.lstsq(others, v, rcond=None)[0]
        heights[i] = np.linalg.norm(v)
    return heights


def _check_distances(
    pos: np.ndarray,
    cell: np.ndarray,
    pbc: np.ndarray,
    heights: np.ndarray,
    min_distance: float,
    name: str,
    index: int,
    system_id: int | None,
) -> None:
    """Coincident atoms raise; atoms (or periodic images) closer than ``min_distance`` warn.

    A cell much thinner than ``min_distance`` would make the pair search enumerate
    thousands of images, so there only coincidence is searched and the thinness is
    reported instead.
    """
    if len(pos) < 2 and not pbc.any():
        return
    thin = heights.size > 0 and heights.min() * 4 < min_distance
    pair = _closest_pair(pos, cell, pbc, COINCIDENT_DISTANCE if thin else min_distance, heights)
    if pair is not None and pair[0] < COINCIDENT_DISTANCE:  # never an atom and its own
        d, i, j, image = pair  # image: the cell is at least MIN_CELL_HEIGHT thick
        raise StructureError(
            f"{name}: atoms {i} and {j} coincide{' through a periodic image' if image else ''} "
            f"(distance {d:.2g} Å); remove the duplicate atom (or fix the cell)",
            index,
        )
    if thin:
        _warn(
            f"{name}: the cell is only {heights.min():.3f} Å thick along a periodic direction "
            f"(< min_distance={min_distance} Å), so atoms may be that close to their own "
            f"periodic images; use a larger cell (atoms.repeat), or pass a smaller "
            f"min_distance= (0 turns this check off)",
            index,
            system_id,
        )
    elif pair is not None and pair[0] < min_distance:
        d, i, j, image = pair
        what = (
            f"atom {i} is only {d:.3f} Å from its own periodic image"
            if i == j
            else f"atoms {i} and {j} are only {d:.3f} Å apart"
            f"{' (through a periodic image)' if image else ''}"
        )
        _warn(
            f"{name}: {what} (< min_distance={min_distance} Å); check the structure "
            f"(duplicate atoms? a too small cell?), or pass a smaller min_distance= (0 turns "
            f"this check off)",
            index,
            system_id,
        )


def _closest_pair(
    pos: np.ndarray,
    cell: np.ndarray,
    pbc: np.ndarray,
    cutoff: float,
    heights: np.ndarray | None = None,
) -> tuple[float, int, int, bool] | None:
    """Closest pair within ``cutoff`` (an atom and its own periodic images included) as
    (distance, i, j, through a periodic image), or None.  ``heights``: the periodic
    heights of the cell (:func:`periodic_heights`), when the caller has them."""
    import vesin  # vesin accepts degenerate cell vectors along non-periodic axes

    from .models.neighbors import all_pairs_suit, molecule_pairs

    cutoff = max(cutoff, COINCIDENT_DISTANCE)
    if all_pairs_suit(len(pos), pbc):  # a small molecule: one vectorised test
        i, j, r2 = molecule_pairs(pos, cutoff)
        if len(r2) == 0:
            return None
        k = int(np.argmin(r2))
        return float(np.sqrt(r2[k])), int(i[k]), int(j[k]), False
    # vesin bins space by its cutoff: searching 0.5 Å in a 21 Å crystal means 80 000 bins
    # for 256 atoms (12 ms, against 0.15 ms within 3 Å), so search wider and keep the
    # closest -- no wider than twice the thinnest periodic height, which bounds the images
    if heights is None:
        heights = periodic_heights(cell, pbc)
    reach = min(_CLOSEST_PAIR_SEARCH, 2 * heights.min()) if heights.size else _CLOSEST_PAIR_SEARCH
    i, j, shifts, d = vesin.NeighborList(
        cutoff=max(cutoff, reach), full_list=False, n_threads=1
    ).compute(pos, cell, pbc.tolist(), "ijSd")
    if len(d) == 0:
        return None
    k = int(np.argmin(d))
    if d[k] >= cutoff:
        return None
    return float(d[k]), int(i[k]), int(j[k]), bool(np.any(shifts[k]))


#: radius (Å) of the closest-pair search of structure validation (see _closest_pair)
_CLOSEST_PAIR_SEARCH = 3.0
