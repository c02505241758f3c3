"""Crystal symmetry on the host: ASE's ``FixSymmetry`` read into batch fields, written
back onto result ``ase.Atoms``, and the space group a results table reports.

Why on the host and once per system: spglib finds a structure's operations in
microseconds to milliseconds, but only in NumPy; the step then needs the operations as
tensors.  So when a system enters a run (its ``ase.Atoms`` become batch rows) its
``FixSymmetry`` -- whose constructor already refined the structure, exactly as ASE
relaxes it -- is checked and packed as

* ``symmetry_rotations`` ``[B, W, 3, 3]``: each operation's rotation in fractional
  coordinates (spglib's integer matrices, as floats), zero past the system's count;
* ``symmetry_count`` ``[B]``: the number of operations (0: the system is free);
* ``symmetry_source`` ``[N, W]``: for atom ``j`` and operation ``k`` the atom (index in
  its own system) that ``k`` carries onto ``j`` -- the inverse of ASE's ``symm_map`` --
  so a symmetrised force is a gather and a sum in operation order, no scatter;
* ``symmetry_symprec`` ``[B]`` and ``symmetry_adjust`` ``[B, 2]`` (ASE's
  ``adjust_positions``, ``adjust_cell``), for the step and the way back.

``W`` = :data:`MAX_OPERATIONS` for every batch (a field's shape is a run's constant):
the 48 operations of a cubic point group times up to 4 lattice translations (a
conventional fcc or rock-salt cell); a larger supercell is refused with the fix (relax
the primitive cell).  The batched arithmetic is :mod:`alchemi_lit.core.symmetrize`.

Fixed atoms (``FixAtoms``, ``FixCartesian`` of x, y, z) may go with it as whole orbits
(:func:`check_fixed_orbits`): then they need no field of their own (the core ``fixed``
mask) and commute with the symmetrisation.  Every other kind may go with it when the
operations map its set onto itself, the general form of that rule, checked when the
structure enters (:mod:`.symmetry_invariance`, called by the batch's codec right after
:func:`pack`, since it reads the kinds' encoded arrays).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from .constraints import fixed_mask
from .errors import StructureError, system_name

#: operations a system may carry (the width of the symmetry fields)
MAX_OPERATIONS = 192
#: symprec of the space-group columns of a results table (ASE's and spglib's usual 0.01 ... 1e-5
#: span; 1e-3 Å reads a relaxed crystal's group through round-off but not a real distortion)
SPACEGROUP_SYMPREC = 1e-3

#: system field: the space-group number each structure entered the run with
INITIAL = "spacegroup_initial"
#: system field: the space-group number each structure left a relaxation with
FINAL = "spacegroup_final"
ROTATIONS, COUNT, SOURCE = "symmetry_rotations", "symmetry_count", "symmetry_source"
SYMPREC, ADJUST = "symmetry_symprec", "symmetry_adjust"
#: batch fields of the constraint, with kind and trailing shape
FIELDS: dict[str, tuple[str, tuple[int, ...]]] = {
    ROTATIONS: ("system", (MAX_OPERATIONS, 3, 3)),
    COUNT: ("system", ()),
    SOURCE: ("atom", (MAX_OPERATIONS,)),
    SYMPREC: ("system", ()),
    ADJUST: ("system", (2,)),
}


def is_fix_symmetry(constraint: Any) -> bool:
    """Whether ``constraint`` is ASE's ``FixSymmetry``."""
    from ase.constraints import FixSymmetry

    return isinstance(constraint, FixSymmetry)


def symmetry_constraint(atoms: Any, index: int, system_id: int) -> Any | None:
    """The one ``FixSymmetry`` of ``atoms`` (None without); two are refused."""
    found = [c for c in atoms.constraints if is_fix_symmetry(c)]
    if len(found) > 1:
        raise StructureError(
            f"{system_name(index, system_id)}: {len(found)} FixSymmetry constraints; keep one",
            index,
        )
    return found[0] if found else None


def check_symprec(symprec: Any, owner: str) -> float:
    """``symprec`` (Å) as a float, > 0, else a :class:`StructureError` naming ``owner``."""
    try:
        value = float(symprec)
    except (TypeError, ValueError):
        value = float("nan")
    if not value > 0:
        raise StructureError(
            f"{owner}: FixSymmetry symprec must be > 0 Å (spglib's distance tolerance; ASE's "
            f"default is 0.01), got {symprec!r}"
        )
    return value


def operation_maps(constraint: Any, atoms: Any, name: str) -> tuple[np.ndarray, np.ndarray]:
    """``(rotations [K, 3, 3] int, symm_map [K, n])`` of an ASE ``FixSymmetry`` on
    ``atoms``, checked to hold: every operation must carry the structure onto itself
    within the constraint's ``symprec`` (positions) and keep the cell's metric, else the
    structure was moved after the constraint was made (ASE would then symmetrise towards
    a group the structure does not have)."""
    symprec = check_symprec(constraint.symprec, name)
    rotations = np.asarray(constraint.rotations, dtype=np.int64)
    translations = np.asarray(constraint.translations, dtype=np.float64)
    maps = np.asarray(constraint.symm_map, dtype=np.int64)
    n = len(atoms)
    if maps.ndim != 2 or maps.shape != (len(rotations), n):
        raise StructureError(
            f"{name}: its FixSymmetry was made for {maps.shape[-1]} atoms, the structure has "
            f"{n}; make the constraint on this structure (FixSymmetry(atoms, symprec))"
        )
    if len(rotations) > MAX_OPERATIONS:
        raise StructureError(
            f"{name}: FixSymmetry has {len(rotations)} operations (a supercell's lattice "
            f"translations count too) > {MAX_OPERATIONS}; relax the primitive cell "
            f"(spglib.standardize_cell(..., to_primitive=True)) and build the supercell after"
        )
    if any(len(np.unique(m)) != n for m in maps):
        raise StructureError(
            f"{name}: an operation of its FixSymmetry maps two atoms onto one: the structure "
            f"is not symmetric at symprec={symprec}; refine it (FixSymmetry(atoms, symprec) "
            f"does) or raise symprec"
        )
    cell = np.asarray(atoms.cell.array, dtype=np.float64)
    frac = atoms.cell.scaled_positions(atoms.positions)
    metric = cell @ cell.T
    worst_pos, worst_metric = 0.0, 0.0
    for rot, trans, m in zip(rotations, translations, maps):
        d = frac[m] - (frac @ rot.T + trans)
        worst_pos = max(worst_pos, float(np.linalg.norm((d - np.round(d)) @ cell, axis=1).max()))
        rotated = rot.T @ metric @ rot  # the metric in the rotated lattice basis
        worst_metric = max(worst_metric, float(np.abs(rotated - metric).max()))
    if worst_pos > symprec or worst_metric > 2 * symprec * max(float(np.sqrt(metric.max())), 1):
        raise StructureError(
            f"{name}: the structure is not symmetric under its FixSymmetry at symprec="
            f"{symprec} Å (an operation moves an atom {worst_pos:.3g} Å off its image, the "
            f"cell's metric by {worst_metric:.3g} Å^2): it was moved or strained after the "
            f"constraint was made; make FixSymmetry(atoms, symprec) on the final input "
            f"structure (it refines it), or raise symprec"
        )
    return rotations, maps


def fix_symmetry(
    atoms: Any, symprec: float = 0.01, adjust_positions: bool = True, adjust_cell: bool = True
) -> list[Any]:
    """Copies of ``ase.Atoms`` (one or a list) with ASE's ``FixSymmetry(atoms, symprec)``
    set -- whose constructor refines each structure to its group at ``symprec`` Å -- for
    a symmetry-preserving relaxation (cell filters and optimizers honour it).  The
    structure's other constraints are kept, before FixSymmetry; the refinement runs with
    them lifted, so it moves constrained atoms onto their symmetric sites too.  Fixed
    atoms must be whole symmetry orbits (:func:`check_fixed_orbits`, here); every other
    kind must be a set the operations map onto itself, checked when the structures enter
    a run (:mod:`.symmetry_invariance`: it reads the kinds' encoded arrays).

    Refused before any run, naming the structure: ``symprec <= 0``, a structure not
    periodic in x, y and z, one already carrying FixSymmetry, fixed atoms that are not
    whole orbits, and one whose refinement lands in another space group than spglib
    finds at ``symprec`` (ASE's ``IntermediateDatasetError``: ``symprec`` straddles a
    distortion; choose it above or below)."""
    from ase import Atoms
    from ase.constraints import FixSymmetry

    many = [atoms] if isinstance(atoms, Atoms) else list(atoms)
    out = []
    for k, a in enumerate(many):
        name = system_name(k, None)
        value = check_symprec(symprec, name)
        if not np.asarray(a.pbc).all() or abs(a.cell.volume) <= 1e-12:
            raise StructureError(
                f"{name}: FixSymmetry needs a crystal periodic in x, y and z (pbc "
                f"{np.asarray(a.pbc).tolist()}, volume {abs(a.cell.volume):.3g} Å^3)", k
            )
        if any(is_fix_symmetry(c) for c in a.constraints):
            raise StructureError(
                f"{name}: already has a FixSymmetry; remove it first (fix_symmetry makes "
                f"it anew, refining the structure)", k
            )  # fmt: skip
        before = spacegroup(a.cell.array, a.positions, a.numbers, value)
        copy, kept = a.copy(), [c.copy() for c in a.constraints]
        copy.set_constraint()  # (ASE's refinement would otherwise leave fixed atoms off-site)
        made = FixSymmetry(copy, symprec=value, adjust_positions=adjust_positions,
                           adjust_cell=adjust_cell)  # fmt: skip
        after = spacegroup(copy.cell.array, copy.positions, copy.numbers, value)
        if after[1] != before[1]:
            raise StructureError(
                f"{name}: refined at symprec={value} Å it is {after[0]} ({after[1]}), not the "
                f"{before[0]} ({before[1]}) spglib finds at that symprec: the tolerance "
                f"straddles a distortion; choose symprec clearly above or below it", k
            )
        check_fixed_orbits(np.asarray(made.symm_map), fixed_mask(a, k), name, k)
        copy.set_constraint([*kept, made])
        out.append(copy)
    return out


def check_fixed_orbits(maps: np.ndarray, fixed: np.ndarray, name: str, index: int) -> None:
    """Refuse fixed atoms that are not whole orbits of the operations ``maps``
    (``symm_map [K, n]``).  Why: only then does every operation send fixed atoms onto
    fixed atoms, so the symmetrised step and the fixed atoms commute (in either order
    of ASE's list) and the relaxation keeps the group; otherwise ASE's result depends
    on the list's order and breaks the symmetry."""
    if not fixed.any():
        return
    images = fixed[maps]  # [K, n]: the image of atom i under operation k is fixed
    bad = np.flatnonzero(fixed & ~images.all(axis=0))
    if bad.size:
        loose = np.unique(maps[:, bad][~images[:, bad]])
        orbit = np.unique(maps[:, bad[0]]).tolist()
        raise StructureError(
            f"{name}: FixSymmetry with fixed atoms needs the fixed set to be whole symmetry "
            f"orbits: fixed atom(s) {bad[:8].tolist()} have images {loose[:8].tolist()} "
            f"that are not fixed; fix whole orbits (atom {int(bad[0])}'s orbit is {orbit}) "
            f"or drop FixSymmetry",
            index,
        )


def pack(
    atoms: list[Any], ids: list[int], fixed: list[np.ndarray]
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]] | None:
    """The constraint's fields (atom, system) of a list of ``ase.Atoms`` (``fixed``: each
    one's fixed atoms), or None when none carries ``FixSymmetry`` (the fields then stay
    out of the batch).  Fixed atoms may go with it when they are whole orbits
    (:func:`check_fixed_orbits`); the other kinds are checked after it
    (:func:`.symmetry_invariance.check_structures`)."""
    found = [symmetry_constraint(a, k, sid) for k, (a, sid) in enumerate(zip(atoms, ids))]
    if all(c is None for c in found):
        return None
    b, w = len(atoms), MAX_OPERATIONS
    rot = np.zeros((b, w, 3, 3))
    count = np.zeros(b, dtype=np.int64)
    symprec = np.zeros(b)
    adjust = np.zeros((b, 2), dtype=bool)
    sources = []
    for k, (a, c, sid) in enumerate(zip(atoms, found, ids)):
        local = np.arange(len(a))
        source = np.broadcast_to(local[:, None], (len(a), w)).copy()
        if c is not None:
            name = system_name(k, sid)
            rotations, maps = operation_maps(c, a, name)
            if not np.asarray(a.pbc).all():
                raise StructureError(
                    f"{name}: FixSymmetry needs a crystal periodic in x, y and z (pbc "
                    f"{np.asarray(a.pbc).tolist()}); remove the constraint", k
                )
            check_fixed_orbits(maps, fixed[k], name, k)
            kk = len(rotations)
            rot[k, :kk] = rotations
            count[k] = kk
            symprec[k] = float(c.symprec)
            adjust[k] = (bool(c.do_adjust_positions), bool(c.do_adjust_cell))
            inverse = np.argsort(maps, axis=1)  # inverse[k][map[k][i]] = i
            source[:, :kk] = inverse.T
        sources.append(source)
    atom = {SOURCE: np.concatenate(sources)}
    system = {ROTATIONS: rot, COUNT: count, SYMPREC: symprec, ADJUST: adjust}
    return atom, system


def restore(
    atom: dict[str, np.ndarray], system: dict[str, np.ndarray], lo: int, hi: int, b: int,
    atoms: Any,
) -> Any:
    """The ASE ``FixSymmetry`` of system row ``b`` (atoms ``lo:hi``) of a batch's host
    arrays, for its result ``atoms``."""
    k = int(system[COUNT][b])
    return constraint_of(
        atoms, system[ROTATIONS][b, :k], atom[SOURCE][lo:hi, :k], float(system[SYMPREC][b]),
        system[ADJUST][b],
    )  # fmt: skip


def constraint_of(
    atoms: Any, rotations: np.ndarray, source: np.ndarray, symprec: float, adjust: np.ndarray
) -> Any:
    """An ASE ``FixSymmetry`` holding a system's packed operations, for a result
    ``ase.Atoms`` -- built without ASE's constructor, which would refine (move) the
    result; the translations are recovered from atom 0's image."""
    from ase.constraints import FixSymmetry

    c = FixSymmetry.__new__(FixSymmetry)
    rot = np.rint(rotations).astype(np.int32)
    maps = np.argsort(source.T, axis=1)  # symm_map[k][source[j, k]] = j
    frac = atoms.cell.scaled_positions(atoms.positions)
    trans = frac[maps[:, 0]] - np.einsum("kij,j->ki", rot, frac[0])
    c.atoms, c.symprec, c.verbose = atoms.copy(), float(symprec), False
    c.rotations, c.translations = rot, trans - np.floor(trans + 1e-8)
    c.symm_map = [list(m) for m in maps]
    c.do_adjust_positions, c.do_adjust_cell = bool(adjust[0]), bool(adjust[1])
    return c


def spacegroup(
    cell: np.ndarray, positions: np.ndarray, numbers: np.ndarray, symprec: float
) -> tuple[str, int]:
    """``(international symbol, number)`` of a periodic structure at ``symprec`` Å
    (spglib); ``("", 0)`` where spglib finds none (a degenerate cell)."""
    from ase.spacegroup.symmetrize import spglib_get_symmetry_dataset

    if not (np.isfinite(cell).all() and np.isfinite(positions).all()):
        return "", 0  # (spglib crashes the process on NaN)
    try:
        frac = np.linalg.solve(cell.T, positions.T).T
        data = spglib_get_symmetry_dataset((cell, frac, numbers), symprec=symprec)
    except Exception:  # spglib raises on degenerate input (ASE's adapter: new handling)
        return "", 0
    if data is None:
        return "", 0
    return str(data.international), int(data.number)


def spacegroups_of(
    cell: np.ndarray, positions: np.ndarray, numbers: np.ndarray, n_atoms: np.ndarray,
    rows: np.ndarray,
) -> np.ndarray:
    """Space-group numbers ``[B]`` at :data:`SPACEGROUP_SYMPREC` of the systems ``rows``
    (``[B]`` bool) of a batch's host arrays, 0 elsewhere.  spglib takes about half a
    millisecond for a small rattled cell, so runs ask only where a relaxation makes the
    answer worth it (``engine/feeds.py``)."""
    out = np.zeros(len(n_atoms), dtype=np.int64)
    ptr = np.concatenate([[0], np.cumsum(n_atoms)])
    for r in np.flatnonzero(rows).tolist():
        span = slice(ptr[r], ptr[r + 1])
        out[r] = spacegroup(cell[r], positions[span], numbers[span], SPACEGROUP_SYMPREC)[1]
    return out


@functools.lru_cache(maxsize=1)
def _groups() -> dict[int, tuple[str, int]]:
    """ITA number -> (international short symbol, point-group order), from spglib's
    database (its first Hall setting of each group)."""
    import spglib
    from ase.utils import spglib_new_errorhandling

    kinds = spglib_new_errorhandling(spglib.get_spacegroup_type)
    database = spglib_new_errorhandling(spglib.get_symmetry_from_database)
    table: dict[int, tuple[str, int]] = {0: ("", 0)}
    for hall in range(1, 531):
        kind = kinds(hall)
        if kind.number not in table:
            rotations = database(hall)["rotations"]
            order = len({r.tobytes() for r in np.asarray(rotations, dtype=np.int64)})
            table[kind.number] = (kind.international_short, order)
    return table


def symbol(number: int) -> str:
    """The international (Hermann-Mauguin) short symbol of space group ``number``."""
    return _groups().get(int(number), ("", 0))[0]


def verdict(initial: int, final: int) -> str:
    """``"kept"`` (same group), ``"broken"`` (a smaller point group, or the same order
    in another group: ``"changed"``), ``"raised"`` (a larger one); ``""`` where either is
    unknown (not periodic)."""
    if not initial or not final:
        return ""
    if initial == final:
        return "kept"
    a, b = _groups()[int(initial)][1], _groups()[int(final)][1]
    return "broken" if b < a else "raised" if b > a else "changed"


__all__ = [
    "FIELDS",
    "MAX_OPERATIONS",
    "SPACEGROUP_SYMPREC",
    "check_fixed_orbits",
    "check_symprec",
    "constraint_of",
    "fix_symmetry",
    "is_fix_symmetry",
    "operation_maps",
    "pack",
    "restore",
    "spacegroup",
    "spacegroups_of",
    "symbol",
    "symmetry_constraint",
    "verdict",
]
