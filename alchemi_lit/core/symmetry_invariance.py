"""Which constraints may go with ``FixSymmetry``: those whose set every symmetry
operation of the structure maps onto itself (G-invariant), checked per kind on the host
when a structure enters a run (:func:`check_structures`, right after
:func:`~.symmetry.pack` has checked the operations themselves).

Why that condition.  Operation ``k`` carries atom ``i`` onto ``m_k(i)`` (ASE's
``symm_map``) and rotates vectors by ``C_k = L^T R_k L^-T`` (``L``: the cell's rows,
``R_k``: the fractional rotation).  The symmetrisation ``S`` of a force or a step is the
average of the operations' images.  A per-atom projection ``P`` (fixed atoms,
``FixCartesian``, ``FixedPlane``, ``FixedLine``) commutes with every operation, hence
with ``S``, when ``P_{m_k(i)} = C_k P_i C_k^T`` for every ``k`` and ``i``: the projector
onto an atom's free directions, rotated, is its image's (for fixed atoms: whole orbits,
:func:`~.symmetry.check_fixed_orbits`).  Forces a kind adds (``Hookean``,
``ExternalForce``) are symmetric at a symmetric configuration when the set of springs
or pulls maps onto itself, rotated; rigid bonds (SHAKE, RATTLE) keep a symmetric
configuration symmetric when the bonds do.  Springs to points and planes are fixed in
space, so this holds for the input cell only: cell filters refuse them with FixSymmetry
(:func:`~alchemi_lit.integrators.constrain.space_fixed_tethers`).  ``FixCom`` always
commutes, given equal masses within each orbit: with ``Pi = (1/K) sum_k C_k``, ``S``
takes a force field's mass-weighted sum ``sum m F`` to ``Pi sum m F`` and a uniform
field ``m lambda`` to ``m Pi lambda``, so both orders give ``S F - m Pi lambda`` (the
step's centre of mass likewise).  Then ASE's result is the same whatever the order of
its list, the relaxation keeps the space group, and the batched kinds need no new field
(they apply in their order, symmetrisation before the projections).  Otherwise ASE's
result depends on the order and the group breaks, so the structure is refused before
the run, naming the constraint, an atom (or pair) and operation that break it, and the
fix.

Tolerances: directions (masks, normals) are compared to :data:`TOL` plus how far the cell
is from holding the operations exactly (``|C_k^T C_k - I|``); positions-derived vectors
(bond images, tethers, plane distances) to :data:`TOL` Å plus how far the positions are
from symmetric; parameters (lengths, ``k``, ``rt``, forces) to :data:`TOL` relative.  A
constraint off by ``TOL`` makes ASE's two orders differ by that much per step, far below
what a relaxation resolves; one typed or derived from the refined structure is exact to
rounding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .constraint_forces import SPRING_ATOM, SPRING_PLANE, SPRING_POINT
from .constraint_kinds import AXIS_CARTESIAN, AXIS_LINE, AXIS_PLANE
from .errors import StructureError, system_name
from .symmetry import symmetry_constraint

#: relative (directions, parameters) and absolute (Å) slack of the invariance checks
TOL = 1e-9


@dataclass
class _Operations:
    """A structure's symmetry operations as the checks read them."""

    rotations: np.ndarray  # [K, 3, 3] fractional (integers)
    cartesian: np.ndarray  # [K, 3, 3] C_k
    maps: np.ndarray  # [K, n] symm_map
    positions: np.ndarray  # [n, 3]
    cell: np.ndarray  # [3, 3] rows
    direction_tol: float
    length_tol: float
    name: str
    index: int

    @classmethod
    def of(
        cls, atoms: Any, rotations: np.ndarray, maps: np.ndarray, name: str, index: int
    ) -> _Operations:
        cell = np.asarray(atoms.cell.array, dtype=np.float64)
        inv = np.linalg.inv(cell)
        rot = np.asarray(rotations, dtype=np.float64)
        cart = np.einsum("ab,kbc,cd->kad", cell.T, rot, inv.T)  # L^T R L^-T
        off = np.abs(np.einsum("kba,kbc->kac", cart, cart) - np.eye(3)).max()
        r = np.asarray(atoms.positions, dtype=np.float64)
        # how far the positions are from symmetric: each operation's image of every
        # atom against atom 0's translation, up to lattice vectors
        shift = (r[maps] - np.einsum("kab,nb->kna", cart, r)) @ inv  # [K, n, 3] fractional
        d = shift - shift[:, :1]
        slack = np.linalg.norm((d - np.round(d)) @ cell, axis=-1).max()
        return cls(np.asarray(rotations), cart, np.asarray(maps), r, cell,
                   TOL + 4 * float(off), TOL + 4 * float(slack), name, index)  # fmt: skip

    def orbit(self, i: int) -> list[int]:
        return np.unique(self.maps[:, i]).tolist()

    def pair_orbit(self, a: int, b: int) -> list[tuple[int, int]]:
        pairs = {tuple(sorted((int(x), int(y)))) for x, y in zip(self.maps[:, a], self.maps[:, b])}
        return sorted(pairs)  # type: ignore[arg-type]

    def mic(self, d: np.ndarray) -> np.ndarray:
        """ASE's ``find_mic`` of vectors ``d`` ``[..., 3]`` (the cell is periodic in x, y, z)."""
        from ase.geometry import find_mic

        flat = np.asarray(d, dtype=np.float64).reshape(-1, 3)
        return find_mic(flat, self.cell, True)[0].reshape(np.shape(d))

    def refuse(self, kind: str, need: str, k: int, what: str, fix: str) -> StructureError:
        rot = self.rotations[k].astype(int).tolist()
        return StructureError(
            f"{self.name}: FixSymmetry with {kind} needs {need} (else ASE's result depends "
            f"on the order of its list and the relaxation breaks the group): operation {k} "
            f"(fractional rotation {rot}) {what}; {fix}, or drop FixSymmetry",
            self.index,
        )


def _vec(v: np.ndarray) -> str:
    return "(" + ", ".join(f"{x:.4g}" for x in np.where(np.abs(v) < 5e-13, 0.0, v)) + ")"


def _same(a: float, b: float) -> bool:
    return abs(a - b) <= TOL * max(abs(a), abs(b), 1e-300)


# ----------------------------------------------------------------- per-atom projections
def _projectors(kinds: np.ndarray, vectors: np.ndarray, fixed: np.ndarray) -> np.ndarray:
    """Each atom's projector onto its free directions ``[n, 3, 3]``."""
    n = len(kinds)
    p = np.broadcast_to(np.eye(3), (n, 3, 3)).copy()
    cart, plane, line = kinds == AXIS_CARTESIAN, kinds == AXIS_PLANE, kinds == AXIS_LINE
    p[cart] = np.eye(3) - np.einsum("na,ab->nab", vectors[cart], np.eye(3))
    p[plane] -= np.einsum("na,nb->nab", vectors[plane], vectors[plane])
    p[line] = np.einsum("na,nb->nab", vectors[line], vectors[line])
    p[fixed] = 0.0
    return p


_AXES = "xyz"


def _describe(kind: int, vector: np.ndarray, fixed: bool, rotation: np.ndarray) -> str:
    """An atom's constraint (``rotation`` applied: its image), in ASE's terms."""
    if fixed:
        return "fixed (FixAtoms)"
    if kind == AXIS_CARTESIAN:
        dirs = [rotation[:, a] for a in range(3) if vector[a]]
        axes = [int(np.argmax(np.abs(d))) for d in dirs]
        if all(abs(abs(d[a]) - 1) < 1e-9 for d, a in zip(dirs, axes)):
            return f"FixCartesian of {', '.join(_AXES[a] for a in sorted(axes))}"
        return f"fixed along {', '.join(_vec(d) for d in dirs)} (no FixCartesian mask)"
    if kind in (AXIS_PLANE, AXIS_LINE):
        label = "FixedPlane with normal" if kind == AXIS_PLANE else "FixedLine along"
        return f"{label} {_vec(rotation @ vector)}"
    return "free"


def _check_axes(ops: _Operations, arrays: dict[str, np.ndarray], fixed: np.ndarray) -> None:
    """FixCartesian (some axes), FixedPlane and FixedLine (with the fixed atoms): every
    operation carries each atom's free-direction projector onto its image's."""
    kinds = arrays.get("axis_kind")
    if kinds is None or not kinds.any():
        return
    names = {AXIS_CARTESIAN: "FixCartesian", AXIS_PLANE: "FixedPlane", AXIS_LINE: "FixedLine"}
    vectors = arrays["axis_vector"]
    p = _projectors(kinds, vectors, fixed)
    for k, (c, m) in enumerate(zip(ops.cartesian, ops.maps)):
        image = np.einsum("ab,nbc,dc->nad", c, p, c)  # C P_i C^T, to compare with P_{m(i)}
        bad = np.flatnonzero(np.abs(image - p[m]).max(axis=(1, 2)) > ops.direction_tol)
        if bad.size:
            i = int(bad[np.argmax(kinds[bad] != 0)])  # (name a constrained atom if one is)
            j = int(m[i])
            kind = names[int(kinds[i] or kinds[j])]
            raise ops.refuse(
                kind, "every symmetry operation to carry each atom's constraint onto its "
                "image's", k,
                f"carries atom {i} ({_describe(kinds[i], vectors[i], fixed[i], np.eye(3))}) "
                f"onto atom {j}, where it would be {_describe(kinds[i], vectors[i], fixed[i], c)}"
                f", but atom {j} is {_describe(kinds[j], vectors[j], fixed[j], np.eye(3))}",
                f"constrain whole orbits (atom {i}'s orbit is {ops.orbit(i)}) with axes or "
                f"directions the operations map onto each other (up to sign)",
            )  # fmt: skip


def _check_com(ops: _Operations, arrays: dict[str, np.ndarray], masses: np.ndarray) -> None:
    """FixCom: equal masses within each orbit (see the module docstring)."""
    com = arrays.get("com_fixed")
    if com is None or not com.any():
        return
    for k, m in enumerate(ops.maps):
        bad = np.flatnonzero(np.abs(masses[m] - masses) > TOL * masses)
        if bad.size:
            i = int(bad[0])
            raise ops.refuse(
                "FixCom", "equal masses within each symmetry orbit", k,
                f"carries atom {i} (mass {masses[i]:.6g}) onto atom {int(m[i])} (mass "
                f"{masses[m[i]]:.6g})",
                f"give the orbit {ops.orbit(i)} one mass (atoms.set_masses)",
            )  # fmt: skip


# ----------------------------------------------------------------- pairs of atoms
Pairs = dict[tuple[int, int], list[tuple[float, ...]]]


def _add(pairs: Pairs, a: int, b: int, params: tuple[float, ...]) -> None:
    """One link of an unordered pair (every kind here acts on both ends alike)."""
    pairs.setdefault((min(a, b), max(a, b)), []).append(params)


def _alike(want: list[tuple[float, ...]], have: list[tuple[float, ...]] | None) -> bool:
    return (
        have is not None
        and len(want) == len(have)
        and all(all(_same(x, y) for x, y in zip(u, v)) for u, v in zip(sorted(want), sorted(have)))
    )


def _check_pairs(
    ops: _Operations, kind: str, noun: str, need: str, pairs: Pairs, describe: str, mic: bool,
    fix: str,
) -> None:  # fmt: skip
    """Pairs with parameters map onto pairs with the same parameters, and the vector
    between them (its minimum image with ``mic``; else as the positions give it) onto
    the image pair's vector."""
    if not pairs:
        return
    keys = np.array(list(pairs), dtype=np.int64)  # [P, 2]
    r = ops.positions
    vec = r[keys[:, 1]] - r[keys[:, 0]]
    vec = ops.mic(vec) if mic else vec
    for k, (c, m) in enumerate(zip(ops.cartesian, ops.maps)):
        img = m[keys]
        img_vec = r[img[:, 1]] - r[img[:, 0]]
        img_vec = ops.mic(img_vec) if mic else img_vec
        drift = np.linalg.norm(vec @ c.T - img_vec, axis=-1)
        for p, (a, b) in enumerate(keys.tolist()):
            ia, ib = int(img[p, 0]), int(img[p, 1])
            want, have = pairs[(a, b)], pairs.get((min(ia, ib), max(ia, ib)))
            orbit = f"the orbit of ({a}, {b}) is {ops.pair_orbit(a, b)}"
            if not _alike(want, have):
                what = "no such link" if have is None else describe.format(*have[0])
                raise ops.refuse(
                    kind, need, k,
                    f"carries the {noun} ({a}, {b}) ({describe.format(*want[0])}) onto atoms "
                    f"({ia}, {ib}), which have {what}",
                    f"{fix} ({orbit})",
                )  # fmt: skip
            if drift[p] > ops.length_tol:
                where = (
                    "onto another periodic image of the pair than its minimum image (the "
                    "pair is as far apart as an image across the cell: use a larger cell)"
                    if mic
                    else "onto a vector that is not the image pair's separation (the two "
                    "atoms' images lie in different periodic cells: ASE takes no minimum "
                    "image here)"
                )
                raise ops.refuse(
                    kind, need, k,
                    f"carries the vector {_vec(vec[p])} Å of ({a}, {b}) to {_vec(c @ vec[p])} "
                    f"Å, {where}; the image pair ({ia}, {ib}) is {_vec(img_vec[p])} Å apart",
                    f"{fix} ({orbit})",
                )  # fmt: skip


def _check_bonds(ops: _Operations, arrays: dict[str, np.ndarray]) -> None:
    """FixBondLengths: the rigid bonds map onto rigid bonds of the same length."""
    length = arrays.get("bond_length")
    if length is None or not length.any():
        return
    rows, cols = np.nonzero(length)
    off, pairs = arrays["bond_offset"], {}
    for i, c in zip(rows.tolist(), cols.tolist()):
        _add(pairs, i, i + int(off[i, c]), (float(length[i, c]),))
    _check_pairs(
        ops, "FixBondLengths", "rigid bond", "every symmetry operation to carry the rigid "
        "bonds onto rigid bonds of the same length", pairs, "length {:.6g} Å", True,
        "bond whole orbits of bonds with one length each (bondlengths=...)",
    )  # fmt: skip


def _check_pulls(ops: _Operations, arrays: dict[str, np.ndarray]) -> None:
    """ExternalForce: the pulled pairs map onto pulled pairs with the same force, their
    separation (no minimum image, as ASE) rotated onto the image pair's."""
    off = arrays.get("pull_offset")
    if off is None or not off.any():
        return
    f, pairs = arrays["pull_force"], {}
    for i in np.flatnonzero(off).tolist():
        _add(pairs, i, i + int(off[i]), (float(f[i]),))
    _check_pairs(
        ops, "ExternalForce", "pull", "every symmetry operation to carry the pulled pairs onto "
        "pulled pairs with the same force, rotated with them", pairs, "f_ext {:.6g} eV/Å",
        False, "pull whole orbits of pairs with one force, each pair's atoms placed as "
        "the periodic images the operations carry onto each other (shift positions by "
        "lattice vectors)",
    )  # fmt: skip


def _tether(kind: int, target: np.ndarray, k: float, rt: float) -> str:
    """A tether (a Hookean spring to a point or plane) in words; "" for none."""
    if kind == SPRING_POINT:
        return f"tether to point {_vec(target[:3])} (k {k:.6g}, rt {rt:.6g})"
    return f"spring to plane {_vec(target)} (k {k:.6g})" if kind == SPRING_PLANE else ""


def _check_springs(ops: _Operations, arrays: dict[str, np.ndarray]) -> None:
    """Hookean: springs between atoms map onto springs with the same ``k`` and ``rt``;
    an atom's tether to a point or plane onto its image's, the point or plane carried
    by the operation (its translation included)."""
    kinds = arrays.get("spring_kind")
    if kinds is None or not kinds.any():
        return
    k_, rt, target = arrays["spring_k"], arrays["spring_rt"], arrays["spring_target"]
    off, pairs = arrays["spring_offset"], {}
    for i in np.flatnonzero(kinds == SPRING_ATOM).tolist():
        _add(pairs, i, i + int(off[i]), (float(k_[i]), float(rt[i])))
    need = ("every symmetry operation to carry each spring onto a spring with the same k "
            "and rt (a point or plane carried by the operation)")  # fmt: skip
    _check_pairs(ops, "Hookean", "spring", need, pairs, "k {:.6g} eV/Å², rt {:.6g} Å", True,
                 "spring whole orbits of pairs with one k and rt")  # fmt: skip
    r = ops.positions
    # a tether as its force sees it: the minimum-image vector to the point, or the
    # plane's unit normal and the atom's signed distance to it
    norm = np.maximum(np.linalg.norm(target[:, :3], axis=1), 1e-300)
    unit = target[:, :3] / norm[:, None]
    tether = ops.mic(target[:, :3] - r)
    signed = np.einsum("na,na->n", r, unit) + target[:, 3] / norm
    for i in np.flatnonzero((kinds == SPRING_POINT) | (kinds == SPRING_PLANE)).tolist():
        for k, (c, m) in enumerate(zip(ops.cartesian, ops.maps)):
            j, same = int(m[i]), kinds[m[i]] == kinds[i] and _same(k_[i], k_[m[i]])
            if kinds[i] == SPRING_POINT:
                same = same and _same(rt[i], rt[j])
                same = same and np.linalg.norm(c @ tether[i] - tether[j]) <= ops.length_tol
                would = f"a tether to {_vec(r[j] + c @ tether[i])}"
            else:
                n = c @ unit[i]
                same = same and np.abs(n - unit[j]).max() <= ops.direction_tol
                same = same and abs(signed[i] - signed[j]) <= ops.length_tol
                would = f"a spring to the plane {_vec(np.append(n, signed[i] - n @ r[j]))}"
            if not same:
                has = _tether(kinds[j], target[j], k_[j], rt[j])
                raise ops.refuse(
                    "Hookean", need, k,
                    f"carries atom {i}'s {_tether(kinds[i], target[i], k_[i], rt[i])} onto "
                    f"atom {j} as {would}, but atom {j} has {f'a {has}' if has else 'none'}",
                    f"tether whole orbits (atom {i}'s orbit is {ops.orbit(i)}) to points or "
                    f"planes the operations carry onto each other",
                )  # fmt: skip


def check_invariant(
    host: Any, atoms: Any, rotations: np.ndarray, maps: np.ndarray, fixed: np.ndarray,
    name: str, index: int,
) -> None:  # fmt: skip
    """Refuse, naming the structure, a constraint of ``host`` (a structure's encoded
    constraints, :class:`~.constraints.Host`, or None) that the operations (``rotations``
    ``[K, 3, 3]`` fractional, ``maps``: ``symm_map [K, n]``) do not map onto itself.
    ``fixed`` (whole orbits: :func:`~.symmetry.check_fixed_orbits`, checked before)
    takes part in the axis check."""
    if host is None:
        return
    ops = _Operations.of(atoms, rotations, maps, name, index)
    arrays = host.arrays
    _check_axes(ops, arrays, fixed)
    _check_com(ops, arrays, np.asarray(atoms.get_masses(), dtype=np.float64))
    _check_bonds(ops, arrays)
    _check_springs(ops, arrays)
    _check_pulls(ops, arrays)


def check_structures(
    atoms: list[Any], ids: list[int], fixed: list[np.ndarray], hosts: list[Any]
) -> None:
    """:func:`check_invariant` for every structure of a batch being built that carries
    FixSymmetry (``fixed``, ``hosts``: each one's fixed atoms and encoded constraints),
    with its operations (checked to hold by :func:`~.symmetry.pack`)."""
    for k, (a, sid, host) in enumerate(zip(atoms, ids, hosts)):
        c = symmetry_constraint(a, k, sid) if host is not None else None
        if c is not None:
            rotations, maps = np.asarray(c.rotations), np.asarray(c.symm_map)
            check_invariant(host, a, rotations, maps, fixed[k], system_name(k, sid), k)


__all__ = ["TOL", "check_invariant", "check_structures"]
