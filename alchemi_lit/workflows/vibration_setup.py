"""Before and after a vibrations run: inputs checked, ASE's displacements made, ASE's
finite-difference Hessian assembled from the forces.

The displacements and the Hessian follow ``ase.vibrations.Vibrations`` line by line
(``delta``, ``nfree`` 2 or 4, ``indices``; the order of ``Vibrations.displacements()``:
the reference geometry, then per selected atom and axis ``-delta .. +delta``), so the
frequencies are ASE's, not a near relative of them; only the force evaluations change:
every displaced geometry of every system is one job of one batched run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..core.errors import ConfigError, StructureError
from ..models.base import Model, unsupported_elements

#: ``geometry=`` values ASE's ``IdealGasThermo`` knows
GEOMETRIES = ("monatomic", "linear", "nonlinear")


def per_system(value: Any, n: int, name: str, workflow: str) -> list[Any]:
    """One value per system: ``value`` for all, a list of ``n``, or a dict of system
    index -> value (None for the others)."""
    if isinstance(value, dict):
        bad = [k for k in value if not (isinstance(k, int) and 0 <= k < n)]
        if bad:
            raise ConfigError(
                f"{workflow}: {name} keys are structure indices 0..{n - 1}, got {bad[0]!r}"
            )
        return [value.get(i) for i in range(n)]
    if isinstance(value, (list, tuple)) and name != "indices":
        if len(value) != n:
            raise ConfigError(
                f"{workflow}: {name} has {len(value)} entries for {n} structures; give one "
                f"value, one per structure, or a dict of index -> value"
            )
        return list(value)
    return [value] * n


def check_parameters(delta: float, nfree: int, temperatures: Any, pressures: Any) -> None:
    """``delta`` > 0, ``nfree`` 2 or 4 (ASE's choices), temperatures >= 0 K, pressures > 0."""
    if not float(delta) > 0:
        raise ConfigError(f"vibrations: delta is a displacement in Å and must be > 0, got {delta}")
    if float(delta) > 0.1:
        from loguru import logger

        logger.warning(f"vibrations: delta={delta} Å is large (ASE's default: 0.01 Å); "
                       f"the harmonic Hessian then mixes in anharmonic terms")  # fmt: skip
    if nfree not in (2, 4):
        raise ConfigError(
            f"vibrations: nfree must be 2 or 4 (ASE's central differences with 2 or 4 "
            f"displacements per coordinate), got {nfree!r}"
        )
    t = np.asarray(temperatures, dtype=np.float64).ravel()
    if t.size == 0 or not np.all(np.isfinite(t)) or t.min() < 0:
        raise ConfigError(f"vibrations: temperatures are in K and must be >= 0, got {t.tolist()}")
    p = np.asarray(pressures, dtype=np.float64).ravel()
    if p.size == 0 or not np.all(np.isfinite(p)) or p.min() <= 0:
        raise ConfigError(f"vibrations: pressures are in Pa and must be > 0, got {p.tolist()}")


def check_systems(structures: Sequence[Any], model: Model, indices: list[Any]) -> list[np.ndarray]:
    """Refuse before the run what ASE's ``Vibrations`` could not use, naming the system:
    fewer than 2 atoms (nothing to vibrate), a bad ``indices`` (out of range, repeated,
    empty), zero masses on vibrated atoms, an invalid structure, elements the model lacks.
    Returns each system's selected atom indices."""
    from ..core.validation import is_element, validate_atoms

    if not isinstance(model, Model):
        raise ConfigError(
            f"vibrations: model must be an alchemi_lit Model (EMT(), SevenNet() ...), got "
            f"{type(model).__name__}; wrap an ASE calculator with ASECalculatorModel"
        )
    allowed, lacking, out = model.supported_elements, {}, []
    for i, (atoms, sel) in enumerate(zip(structures, indices)):
        known = bool(is_element(np.asarray(atoms.numbers)).all())
        name = f"vibrations: structure {i} ({atoms.get_chemical_formula() if known else '?'})"
        if len(atoms) < 2:
            raise StructureError(
                f"{name} has {len(atoms)} atom(s); a molecule or adsorbate system needs at "
                f"least 2 atoms to have vibrations (a free atom has none)",
                i,
            )
        try:
            validate_atoms(atoms, i)
        except StructureError as exc:
            raise StructureError(f"vibrations: {exc}", i) from exc
        chosen = np.arange(len(atoms)) if sel is None else np.asarray(sel, dtype=np.int64)
        if chosen.ndim != 1 or chosen.size == 0 or len(set(chosen.tolist())) != chosen.size:
            raise ConfigError(f"{name}: indices must be distinct atom indices, got {sel!r}")
        if chosen.min() < -len(atoms) or chosen.max() >= len(atoms):
            raise ConfigError(f"{name}: indices {sel!r} out of range for {len(atoms)} atoms")
        chosen = chosen % len(atoms)
        if np.any(atoms.get_masses()[chosen] <= 0):
            raise StructureError(f"{name} has zero masses on vibrated atoms; set_masses()", i)
        for z in set(atoms.numbers.tolist()) - set(allowed) if allowed is not None else ():
            lacking.setdefault(z, []).append(i)
        out.append(chosen)
    if lacking:
        first = min(i for ids in lacking.values() for i in ids)
        raise StructureError(
            f"vibrations: {unsupported_elements(model, lacking, 'structure')}", first
        )
    return out


def displacements(indices: np.ndarray, nfree: int) -> list[tuple[int, int, int]]:
    """(atom, axis, step in units of delta) in ``Vibrations.displacements()``'s order;
    the first, (0, 0, 0), is the reference geometry."""
    steps = [(0, 0, 0)]
    for a in indices.tolist():
        for axis in range(3):
            for sign in (-1, 1):
                for n in range(1, nfree // 2 + 1):
                    steps.append((a, axis, sign * n))
    return steps


def displaced(atoms: Any, a: int, axis: int, step: int, delta: float, info: dict) -> Any:
    """A job: ``atoms`` (cell, pbc, masses kept; no constraints, results or momenta) with
    atom ``a`` moved by ``step * delta`` along ``axis``, as ASE's ``Vibrations`` does."""
    from ase import Atoms

    positions = atoms.positions.copy()
    positions[a, axis] += step * float(delta)
    return Atoms(
        numbers=atoms.numbers, positions=positions, cell=atoms.cell, pbc=atoms.pbc,
        masses=atoms.get_masses(), info=dict(info),
    )  # fmt: skip


def hessian(
    forces: Sequence[np.ndarray], indices: np.ndarray, nfree: int, delta: float
) -> np.ndarray:
    """ASE's ``Vibrations.read`` (method 'standard', direction 'central'): the symmetrised
    (3n, 3n) Hessian (eV/Å^2) of the selected atoms from the forces of
    :func:`displacements` (the reference geometry's first, unused)."""
    n = 3 * len(indices)
    h = np.empty((n, n))
    half = nfree // 2
    by_step = {}
    k = 1
    for a in indices.tolist():
        for axis in range(3):
            for sign in (-1, 1):
                for m in range(1, half + 1):
                    by_step[(a, axis, sign * m)] = forces[k]
                    k += 1
    r = 0
    for a in indices.tolist():
        for axis in range(3):
            fminus, fplus = by_step[(a, axis, -1)], by_step[(a, axis, 1)]
            if nfree == 2:
                h[r] = 0.5 * (fminus - fplus)[indices].ravel()
            else:
                fmm, fpp = by_step[(a, axis, -2)], by_step[(a, axis, 2)]
                h[r] = (-fmm + 8 * fminus - 8 * fplus + fpp)[indices].ravel() / 12.0
            h[r] /= 2 * float(delta)
            r += 1
    h += h.copy().T
    return h


def mass_weighted(h: np.ndarray, masses: np.ndarray) -> np.ndarray:
    """``H_ij / sqrt(m_i m_j)`` (eV/Å^2/amu), the matrix whose eigenvalues are omega^2."""
    im = np.repeat(np.asarray(masses, dtype=np.float64) ** -0.5, 3)
    return im[:, None] * h * im[None, :]


def is_linear(atoms: Any, tolerance: float = 1e-3) -> bool:
    """All atoms on one line (within ``tolerance`` Å): ``IdealGasThermo``'s 'linear'."""
    x = atoms.positions - atoms.positions.mean(axis=0)
    return bool(np.linalg.svd(x, compute_uv=False)[1] < tolerance) if len(atoms) > 1 else False


def symmetry_number(atoms: Any) -> int:
    """The rotational symmetry number of a molecule (pymatgen's ``PointGroupAnalyzer``:
    the order of its proper-rotation subgroup), what ``IdealGasThermo`` needs."""
    try:
        from pymatgen.core import Molecule
        from pymatgen.symmetry.analyzer import PointGroupAnalyzer
    except ImportError as exc:
        raise ConfigError(
            f"vibrations: symmetry_number='auto' needs pymatgen, which is not installed "
            f"({atoms.get_chemical_formula()}): pip install 'alchemi_lit[vibrations]', or "
            f"give symmetry_number (2 for H2O, 3 for NH3, 12 for CH4 ...)"
        ) from exc

    # species and positions only: the point group does not depend on the spin, and
    # pymatgen's adaptor refuses a radical whose atoms carry no magnetic moments
    mol = Molecule(atoms.get_chemical_symbols(), atoms.positions)
    return int(PointGroupAnalyzer(mol).get_rotational_symmetry_number())
