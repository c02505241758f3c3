"""Before a phonon run: phonopy present, supercells chosen and checked, displacements made.

Everything that can be wrong with a phonon campaign's set-up is found here, before any
force is computed: a missing package (named, with the command), a supercell too thin for
the model's range (named per material, with the size that would do).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..core.errors import ConfigError, StructureError
from ..core.geometry import periodic_heights
from .jobs import fresh_atoms

#: how to get phonopy, in every message that needs it
INSTALL = "pip install 'alchemi_lit[phonons]' (or: pip install phonopy seekpath)"


def require_phonopy(seekpath: bool) -> None:
    """phonopy (and seekpath, for ``band_path="seekpath"``) importable, else one line
    naming the package and the command."""
    import importlib.util

    for name, needed in (("phonopy", True), ("seekpath", seekpath)):
        if needed and importlib.util.find_spec(name) is None:
            why = (
                "phonons need phonopy"
                if name == "phonopy"
                else "band_path='seekpath' needs seekpath"
            )
            raise ConfigError(f"phonons: {why}, which is not installed: {INSTALL}")


def supercell_matrices(
    spec: Any, materials: Sequence[Any], min_width: float, model: Any
) -> list[np.ndarray]:
    """One 3 x 3 integer supercell matrix per material (see ``phonons(supercell=)``),
    each checked to be at least ``min_width`` thick."""
    n = len(materials)
    specs = _specs(spec, n)
    out = []
    for i, (atoms, s) in enumerate(zip(materials, specs)):
        heights = periodic_heights(np.asarray(atoms.cell), np.ones(3, bool))
        m = _auto(heights, min_width) if isinstance(s, str) and s == "auto" else _matrix(s, i)
        # phonopy's convention: supercell lattice vectors (columns) = unit ones (columns) @ m
        thick = periodic_heights(m.T @ np.asarray(atoms.cell), np.ones(3, bool)).min()
        if min_width > 0 and thick < min_width - 1e-9:
            enough = np.diag(_auto(heights, min_width)).tolist()
            raise StructureError(
                f"phonons: structure {i} ({atoms.get_chemical_formula()}): the supercell "
                f"{m.tolist()} is {thick:.2f} Å thick, less than {min_width:.2f} Å (twice "
                f"{type(model).__name__}'s cutoff, {float(model.cutoff):.2f} Å); use "
                f"supercell={enough} or 'auto' (or lower min_width)",
                i,
            )
        out.append(m)
    return out


def build_phonopys(
    materials: Sequence[Any], matrices: Sequence[np.ndarray], primitive_matrix: Any,
    symprec: float, distance: float, workers: int, costs: Sequence[float],
) -> list[tuple[Any, list[Any]]]:  # fmt: skip
    """Per material phonopy's ``Phonopy`` with its displacements generated, and the
    displaced supercells as ``ase.Atoms`` (the jobs), made in ``workers`` processes
    (dearest first by ``costs``, :func:`setup_costs`); phonopy refusing a structure
    (a primitive matrix that does not fit it ...) is an error naming it, before any
    force is computed."""
    from ..core.workers import map_in_workers
    from . import phonopy_calls

    calls = [
        (atoms.numbers, np.asarray(atoms.cell), atoms.get_scaled_positions(wrap=False),
         atoms.get_masses(), m, primitive_matrix, symprec, distance)
        for atoms, m in zip(materials, matrices)
    ]  # fmt: skip
    built = map_in_workers(phonopy_calls, "build", calls, workers, costs)
    for i, (atoms, got) in enumerate(zip(materials, built)):
        if isinstance(got, Exception):
            raise StructureError(
                f"phonons: structure {i} ({atoms.get_chemical_formula()}): phonopy cannot "
                f"set it up ({type(got).__name__}: {got}); check primitive_matrix and symprec",
                i,
            ) from got
    info = {"workflow": "phonons"}
    return [
        (ph, [fresh_atoms(n, w, cell, pos, info) for n, w, cell, pos in supercells])
        for ph, supercells in built
    ]


def setup_costs(materials: Sequence[Any], matrices: Sequence[np.ndarray]) -> list[float]:
    """Per material, a rough upper bound of phonopy's set-up time on one core (s): its
    supercell symmetry pairs every atom with every operation, ~1e-4 s x atoms^2 for a
    cubic supercell (the fit: docs/design/46-materials-property-workflows.md)."""
    atoms = [len(a) * abs(round(np.linalg.det(m))) for a, m in zip(materials, matrices)]
    return [1e-4 * n * n for n in atoms]


def _specs(spec: Any, n: int) -> list[Any]:
    """One supercell spec per material: ``spec`` for all, or a dict of material index ->
    spec with "auto" for the others (a list would be ambiguous: [[3, 3, 3], ...] is also
    a 3 x 3 matrix)."""
    if not isinstance(spec, dict):
        return [spec] * n
    bad = [k for k in spec if not (isinstance(k, int) and 0 <= k < n)]
    if bad:
        raise ConfigError(
            f"phonons: supercell keys are structure indices 0..{n - 1}, got {bad[0]!r}; give "
            f"{{index: supercell}} for the structures that need their own"
        )
    return [spec.get(i, "auto") for i in range(n)]


def _auto(heights: np.ndarray, min_width: float) -> np.ndarray:
    """The smallest diagonal multiples reaching ``min_width`` along each lattice vector."""
    return np.diag([max(1, math.ceil(min_width / h - 1e-9)) for h in heights]).astype(np.int64)


def _matrix(spec: Any, i: int) -> np.ndarray:
    """An int, 3 ints or a 3 x 3 matrix as a 3 x 3 integer matrix."""
    m = np.asarray(spec)
    if m.ndim == 0:
        m = np.eye(3) * m
    elif m.shape == (3,):
        m = np.diag(m)
    if m.shape != (3, 3) or not np.all(np.round(m) == m) or round(abs(np.linalg.det(m))) < 1:
        raise ConfigError(
            f"phonons: supercell of structure {i} must be 'auto', an int, 3 ints or a 3 x 3 "
            f"integer matrix with non-zero determinant, got {spec!r}"
        )
    return np.round(m).astype(np.int64)
