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

import itertools
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import numpy as np
import torch
from loguru import logger

from .errors import StructureError
from .segments import Segments
from .tensor_ops import row_dot

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


def _count_dtype(kind: str, float_dtype: torch.dtype) -> torch.dtype:
    return {"float": float_dtype, "int64": torch.int64, "bool": torch.bool}[kind]


class Batch:
    """Ragged batch of atomic systems; see module docstring.

    Build one with :meth:`from_atoms`; read results with :meth:`to_atoms`.  Fields are
    attributes (``batch.positions``, ``batch.energy``, ``batch.fire_dt`` ...).
    """

    __slots__ = ("_segments", "atom", "info", "layout", "system")

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

        ke = self.kinetic_energy()
        free = (~self.atom["fixed"]).to(self.dtype)
        dof = 3.0 * torch.zeros_like(ke).index_add_(0, self.atom["system_idx"], free)
        return 2.0 * ke / (dof.clamp_min(1.0) * kB)

    def kinetic_energy(self) -> torch.Tensor:
        """Kinetic energy per system ``[B]`` in eV."""
        v = self.atom["velocities"]
        per_atom = 0.5 * self.atom["masses"] * row_dot(v)
        return torch.zeros(self.num_systems, dtype=self.dtype, device=self.device).index_add_(
            0, self.atom["system_idx"], per_atom
        )

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
            self.info,
        )

    def clone(self) -> Batch:
        return Batch(
            {k: v.clone() for k, v in self.atom.items()},
            {k: v.clone() for k, v in self.system.items()},
            {k: dict(v) for k, v in self.info.items()},
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
        info = {i: self.info[i] for i in ids if i in self.info}
        return Batch(atom, system, info)

    @staticmethod
    def concatenate(batches: Sequence[Batch]) -> Batch:
        """Join batches system-wise; fields missing in some batch are filled with zeros."""
        batches = [b for b in batches if b is not None]
        if not batches:
            raise ValueError("concatenate needs at least one batch")
        if len(batches) == 1:
            return batches[0].clone()
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
        pbc, ``FixAtoms`` constraints (as the ``fixed`` mask) and ``info``.  Other
        constraints raise :class:`StructureError`, because silently dropping them would
        change the physics.  ``system_ids`` default to ``0..B-1``; they are the systems'
        global identity (result order, random streams).

        With ``validate`` every system is checked (see :func:`validate_atoms`); atoms
        closer than ``min_distance`` Å give a warning, not an error.
        """
        atoms = list(atoms)
        if not atoms:
            raise StructureError("no structures given: pass a non-empty list of ase.Atoms")
        if system_ids is None:
            system_ids = list(range(len(atoms)))
        elif len(system_ids) != len(atoms):
            raise ValueError(f"got {len(system_ids)} system_ids for {len(atoms)} structures")
        if len(set(int(s) for s in system_ids)) != len(system_ids):
            raise ValueError("system_ids must be unique")

        pos, num, mass, mom, tags, fixed = [], [], [], [], [], []
        cells, pbcs, counts, info = [], [], [], {}
        for k, a in enumerate(atoms):
            if validate:
                validate_atoms(a, k, min_distance=min_distance)
            fixed.append(_fixed_mask(a, k))
            pos.append(np.asarray(a.positions, dtype=np.float64))
            num.append(np.asarray(a.numbers, dtype=np.int64))
            mass.append(np.asarray(a.get_masses(), dtype=np.float64))
            mom.append(np.asarray(a.get_momenta(), dtype=np.float64))
            tags.append(np.asarray(a.get_tags(), dtype=np.int64))
            cells.append(np.asarray(a.cell.array, dtype=np.float64))
            pbcs.append(np.asarray(a.pbc, dtype=bool))
            counts.append(len(a))
            if a.info:
                info[int(system_ids[k])] = dict(a.info)

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
        atom["velocities"][atom["fixed"]] = 0.0
        system = {
            "cell": t(np.stack(cells), dtype),
            "pbc": t(np.stack(pbcs), torch.bool),
            "energy": torch.full((n_sys,), float("nan"), dtype=dtype, device=device),
            "stress": torch.zeros((n_sys, 3, 3), dtype=dtype, device=device),
            "n_atoms": n_atoms,
            "system_id": t([int(s) for s in system_ids], torch.int64),
            "status": torch.zeros(n_sys, dtype=torch.int64, device=device),
            "step": torch.zeros(n_sys, dtype=torch.int64, device=device),
            "total_steps": torch.zeros(n_sys, dtype=torch.int64, device=device),
            "converged": torch.zeros(n_sys, dtype=torch.bool, device=device),
            "exit_code": torch.zeros(n_sys, dtype=torch.int64, device=device),
        }
        return cls(atom, system, info)

    def to_atoms(self, results: bool = True) -> list[Any]:
        """Convert back to ``ase.Atoms``, sorted by ``system_id`` (input order).

        With ``results`` each system whose energy was computed gets a
        ``SinglePointCalculator`` holding energy, forces and (3-D cells) stress, and
        ``info`` gains ``system_id``, ``status``, ``steps``, ``converged`` and
        ``exit_reason`` (and ``stage_energy``: the energy in eV when the system left each
        stage, NaN for stages it did not leave) -- so ASE tools work on the results directly.
        """
        from ase import Atoms
        from ase.calculators.singlepoint import SinglePointCalculator
        from ase.constraints import FixAtoms
        from ase.stress import full_3x3_to_voigt_6_stress

        host = self.to(device="cpu")
        a, s = (
            {k: v.numpy() for k, v in host.atom.items()},
            {k: v.numpy() for k, v in host.system.items()},
        )
        ptr = np.concatenate([[0], np.cumsum(s["n_atoms"])])
        out = []
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
            atoms.info.update(self.info.get(sid, {}))
            if results:
                atoms.info.update(
                    system_id=sid,
                    status=int(s["status"][b]),
                    steps=int(s["total_steps"][b]),
                    converged=bool(s["converged"][b]),
                    exit_reason=EXIT_REASONS.get(int(s["exit_code"][b]), "unknown"),
                )
                if "stage_energy" in s:
                    atoms.info["stage_energy"] = s["stage_energy"][b].tolist()
                energy = float(s["energy"][b])
                if np.isfinite(energy):
                    props: dict[str, Any] = {"energy": energy, "forces": a["forces"][lo:hi].copy()}
                    if abs(np.linalg.det(s["cell"][b])) > 1e-12:
                        props["stress"] = full_3x3_to_voigt_6_stress(s["stress"][b])
                    atoms.calc = SinglePointCalculator(atoms, **props)
            out.append(atoms)
        return out


# ---------------------------------------------------------------------- validation
def _fixed_mask(atoms: Any, index: int) -> np.ndarray:
    from ase.constraints import FixAtoms

    mask = np.zeros(len(atoms), dtype=bool)
    for c in atoms.constraints:
        if isinstance(c, FixAtoms):
            mask[c.index] = True
        else:
            raise StructureError(
                f"system {index}: constraint {type(c).__name__} is not supported; only FixAtoms "
                f"is. Remove it (atoms.set_constraint()) or express it with FixAtoms.",
                index,
            )
    return mask


def validate_atoms(atoms: Any, index: int, min_distance: float = 0.5) -> None:
    """Check one structure; raise :class:`StructureError` naming ``index`` and the fix."""
    n = len(atoms)
    if n == 0:
        raise StructureError(f"system {index} has no atoms: remove it from the input", index)
    pos = np.asarray(atoms.positions, dtype=np.float64)
    if not np.all(np.isfinite(pos)):
        bad = np.flatnonzero(~np.isfinite(pos).all(axis=1))
        raise StructureError(
            f"system {index}: non-finite (NaN/inf) coordinates at atom(s) {bad[:10].tolist()}; "
            f"fix or drop this structure",
            index,
        )
    masses = np.asarray(atoms.get_masses(), dtype=np.float64)
    if not np.all(np.isfinite(masses)) or np.any(masses <= 0):
        bad = np.flatnonzero(~(np.isfinite(masses) & (masses > 0)))
        raise StructureError(
            f"system {index}: zero, negative or non-finite mass at atom(s) {bad[:10].tolist()} "
            f"(element X or atoms.set_masses); set positive masses",
            index,
        )
    cell = np.asarray(atoms.cell.array, dtype=np.float64)
    if not np.all(np.isfinite(cell)):
        raise StructureError(f"system {index}: cell has non-finite entries; fix the cell", index)
    pbc = np.asarray(atoms.pbc, dtype=bool)
    if pbc.any():
        periodic = cell[pbc]
        if np.linalg.matrix_rank(periodic, tol=1e-8 * max(1.0, np.abs(cell).max())) < pbc.sum():
            raise StructureError(
                f"system {index}: the cell is singular along periodic direction(s) "
                f"{np.flatnonzero(pbc).tolist()} (pbc={pbc.tolist()}); give a full cell or set "
                f"pbc=False along directions without a lattice vector",
                index,
            )
    _fixed_mask(atoms, index)
    if min_distance > 0 and n > 1:
        dmin = _min_distance(pos, cell, pbc, min_distance)
        if dmin is not None:
            logger.warning(
                f"system {index}: atoms {dmin[1]} and {dmin[2]} are only {dmin[0]:.3f} Å apart "
                f"(< {min_distance} Å); check the structure (duplicate atoms?)"
            )


def _min_distance(
    pos: np.ndarray, cell: np.ndarray, pbc: np.ndarray, cutoff: float
) -> tuple[float, int, int] | None:
    """Closest pair below ``cutoff`` as (distance, i, j), or None."""
    import vesin  # vesin accepts degenerate cell vectors along non-periodic axes

    i, j, d = vesin.NeighborList(cutoff=cutoff, full_list=False, n_threads=1).compute(
        pos, cell, pbc.tolist(), "ijd"
    )
    if len(d) == 0:
        return None
    k = int(np.argmin(d))
    return float(d[k]), int(i[k]), int(j[k])
