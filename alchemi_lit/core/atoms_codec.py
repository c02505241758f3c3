"""Conversion between ``ase.Atoms`` and the fields of a Batch.

ASE is the field's common structure format, so a Batch is built from and returned as
``ase.Atoms`` (:meth:`Batch.from_atoms`, :meth:`Batch.to_atoms`); the details -- which
arrays, constraints and ``info`` travel, how results are written into ``info`` -- live
here, apart from the Batch's own bookkeeping.
"""

from __future__ import annotations

import copy
import itertools
import numbers
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from . import symmetrize, symmetry  # noqa: F401  (symmetrize registers FixSymmetry)
from .batched_validation import validate_structures
from .constraint_io import decode_system, stack_fields
from .constraints import fixed_mask
from .errors import StructureError
from .fields import ARRAYS_KEY, CORE_ARRAYS, EXIT_REASONS, RESULT_INFO_KEYS
from .symmetry_invariance import check_structures
from .validation import (
    constraint_host,
    first_few,
    require_atoms,
    require_unique_ids,
    system_name,
    warn_structure,
)


def fields_from_atoms(
    atoms: Iterable[Any],
    system_ids: Sequence[int] | None = None,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str = "cpu",
    validate: bool = True,
    min_distance: float = 0.5,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[int, dict[str, Any]]]:
    """The fields of a batch of ``ase.Atoms`` (see :meth:`Batch.from_atoms`).

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
    ids = integral_ids(system_ids)
    require_unique_ids(ids, "from_atoms", "give every structure its own id", StructureError)

    pos, num, mass, mom, tags, fixed = [], [], [], [], [], []
    cells, pbcs, counts, info = [], [], [], {}
    if validate:
        validate_structures(atoms, ids, min_distance)
    hosts = []
    for k, (a, sid) in enumerate(zip(atoms, ids)):
        fixed.append(fixed_mask(a, k, sid))
        hosts.append(constraint_host(a, k, sid, fixed[-1]) if a.constraints else None)
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
        symmetry.INITIAL: torch.zeros(n_sys, dtype=torch.int64, device=device),  # (feeds)
    }
    constrained = stack_fields(hosts, counts, dtype, device)
    atom.update(constrained["atom"])
    system.update(constrained["system"])
    packed = symmetry.pack(atoms, ids, fixed)  # FixSymmetry's operations (own fields), checked
    check_structures(atoms, ids, fixed, hosts)  # the other kinds: a set its operations keep
    if packed is not None:
        for store, values in zip((atom, system), packed):
            for k, v in values.items():
                kind = {"f": dtype, "b": torch.bool, "i": torch.int64}[v.dtype.kind]
                store[k] = t(v, torch.int32 if k == symmetry.SOURCE else kind)
    return atom, system, info


def atoms_from_host(
    host_atom: dict[str, np.ndarray],
    host_system: dict[str, np.ndarray],
    host_info: dict[int, dict[str, Any]],
    results: bool = True,
) -> list[Any]:
    """``ase.Atoms`` from a batch's host arrays and (private) info, sorted by ``system_id``
    (see :meth:`Batch.to_atoms`).

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
    from ase.stress import full_3x3_to_voigt_6_stress

    a, s = host_atom, host_system
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
        kept = decode_system(a, s, lo, hi, b, atoms)  # (in memory or read from a store)
        if kept:
            atoms.set_constraint(kept)
        atoms.info.update(host_info.get(sid, {}))
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
                forces = a["forces"][lo:hi].copy()
                energy, forces = _calculator_values(atoms, energy, forces)
                props: dict[str, Any] = {"energy": energy, "forces": forces}
                stress = s["stress"][b]  # (NaN: not computed by the run)
                if abs(np.linalg.det(s["cell"][b])) > 1e-12 and np.isfinite(stress).all():
                    props["stress"] = full_3x3_to_voigt_6_stress(stress)
                atoms.calc = SinglePointCalculator(atoms, **props)
        out.append(atoms)
    if moved:
        keys = sorted(set(itertools.chain.from_iterable(moved.values())))
        warn_structure(
            f"to_atoms: the input info of system_id(s) {list(moved)[:10]} has key(s) "
            f"{keys}, which hold this run's results; the input values were kept as "
            f"{[f'input_{k}' for k in keys]}. Rename those keys in atoms.info to avoid "
            f"this, or call to_atoms(results=False)"
        )
    return out


def _calculator_values(atoms: Any, energy: float, forces: np.ndarray) -> tuple[float, Any]:
    """The energy and forces a calculator would hold (ASE adds Hookean and
    ExternalForce terms on every ``get_potential_energy`` / ``get_forces``): the run's
    values, which include them, less those terms -- so the result Atoms return the
    run's values, not the terms twice."""
    for c in atoms.constraints:
        if hasattr(c, "adjust_potential_energy"):
            energy -= float(c.adjust_potential_energy(atoms))
            added = np.zeros_like(forces)
            c.adjust_forces(atoms, added)
            forces -= added
    return energy, forces


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


def integral_ids(system_ids: Iterable[Any]) -> list[int]:
    """``system_ids`` as ints; an id that is not a whole number (``1.5``, NaN, ``"a"``,
    ``True``) is a :class:`StructureError` -- ``int()`` alone would truncate 1.5 to 1,
    silently giving a system another's identity (its results row, its random stream)."""
    ids, bad = [], []
    for s in system_ids:
        try:
            i = int(s)
            whole = not isinstance(s, bool) and bool(i == s)
        except (TypeError, ValueError, OverflowError):
            whole = False
        if whole:
            ids.append(i)
        else:
            bad.append(s)
    if bad:
        raise StructureError(
            f"system_ids must be whole numbers (they are the systems' identity), got "
            f"{bad[:5]!r}{' ...' if len(bad) > 5 else ''}; pass integers"
        )
    return ids


def default_system_ids(atoms: Sequence[Any]) -> list[int]:
    """Ids of structures given without explicit ``system_ids``: the ``info["system_id"]``
    each carries when all carry distinct integers (results of an earlier run read back,
    so a system keeps its identity from run to run), else positions ``0..n-1``."""
    ids = [a.info.get("system_id") for a in atoms]
    integral = all(isinstance(i, numbers.Integral) and not isinstance(i, bool) for i in ids)
    if ids and integral and len(set(ids)) == len(ids):
        return [int(i) for i in ids]
    return list(range(len(atoms)))


def _free_momenta(atoms: Any, fixed: np.ndarray, index: int, system_id: int) -> np.ndarray:
    """The momenta with those of fixed atoms zeroed: integrators and the temperature
    count fixed atoms as at rest, and ASE's ``set_momenta`` zeroes them too."""
    momenta = np.array(atoms.get_momenta(), dtype=np.float64)
    moving = np.flatnonzero(fixed & np.any(momenta != 0, axis=1))
    if moving.size:
        warn_structure(
            f"{system_name(index, system_id)}: fixed atom(s) {first_few(moving)} have nonzero "
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
    arrays = {k: v for k, v in atoms.arrays.items() if k not in CORE_ARRAYS}
    numeric = {k: np.array(v) for k, v in arrays.items() if np.asarray(v).dtype.kind in "biuf"}
    if len(numeric) < len(arrays):
        warn_structure(
            f"{name}: per-atom array(s) {sorted(set(arrays) - set(numeric))} are not real "
            f"numbers, integers or booleans (text, complex, objects) and are not kept; store "
            f"them in atoms.info if you need them back",
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
