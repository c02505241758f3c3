"""Elastic tensors of many materials from stress-strain fits, in one batched run.

Each material gets the six Voigt strains at each magnitude (± 0.5 % and ± 1 % by
default), optionally relaxes its atoms in every strained cell (ionic relaxation: the
clamped-ion tensor misses internal strain), and each column ``j`` of ``C`` is the
least-squares slope of the stress against strain ``j``: the finite-difference fit
matcalc, atomate2 and pymatgen's ``ElasticTensor.from_independent_strains`` make, here
over every strained cell of every material at once.  Moduli: :mod:`.moduli`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.errors import ConfigError
from ..models.base import Model
from .base import MaterialResults
from .jobs import Job, as_structures, check_materials, fresh_atoms, relax_plan, run_jobs
from .moduli import moduli
from .prerelax import prerelax as run_prerelax
from .prerelax import prerelax_plan

#: Voigt order of the strain and stress components (ASE's): xx, yy, zz, yz, xz, xy
VOIGT = ((0, 0), (1, 1), (2, 2), (1, 2), (0, 2), (0, 1))
#: the 21 independent components, ``C11`` ... ``C66`` (upper triangle, row by row)
CIJ = tuple(f"C{i + 1}{j + 1}" for i in range(6) for j in range(i, 6))


class ElasticResults(MaterialResults):
    """Per material: the 21 ``C11`` ... ``C66`` (GPa, symmetrised), ``K_VRH``,
    ``G_VRH``, ``E_VRH`` (GPa), ``poisson``, ``born_stable``; the 6 x 6 tensor from
    :meth:`elastic_tensor`, the Voigt and Reuss bounds in :meth:`moduli`."""

    columns = (*CIJ, "K_VRH", "G_VRH", "E_VRH", "poisson", "born_stable")
    name = "elastic"

    def elastic_tensor(self, i: int) -> np.ndarray:
        """Material ``i``'s ``C`` (6 x 6, GPa, Voigt order xx yy zz yz xz xy)."""
        return np.asarray(self.values[self._check(i)]["C"])

    def moduli(self, i: int) -> dict[str, float]:
        """Voigt, Reuss and Hill bulk and shear moduli, Young's modulus, Poisson's ratio
        and the Born test of material ``i`` (:func:`.moduli.moduli`)."""
        return moduli(self.elastic_tensor(i))

    def record(self, i: int) -> dict[str, Any]:
        return dict(self.values[i])


def elastic(
    structures: Any,
    model: Model,
    *,
    strains: tuple[float, ...] = (-0.01, -0.005, 0.005, 0.01),
    relax: Any = None,
    max_atoms: int | str | None = None,
    max_systems: int | None = None,
    resume: Any = None,
    prerelax: Any = None,
    fix_symmetry: bool = True,
    prerelax_symprec: float = 0.01,
    **simulator: Any,
) -> ElasticResults:
    """Elastic tensors of every structure in one batched run.

    Args:
        structures: ``ase.Atoms`` periodic in x, y and z, relaxed (cell and atoms): the
            fit gives the tangent at the given cell, which is the elastic tensor only
            where the stress is zero.
        model: any alchemi_lit model.
        strains: the magnitudes applied to each of the six Voigt components (shear as
            engineering strain, ``2 eps_ij``); at least two distinct, none zero.
        relax: relax the atoms in every strained cell (clamped cell): ``True`` (FIRE to
            0.01 eV/Å), an optimizer or a fused plan of them.  Without it the tensor is
            the clamped-ion one (exact for one atom per cell and for atoms on inversion
            centres).
        max_atoms, max_systems: inflight batching budgets (None: one batch; on a CPU,
            chunks of the model's ``cpu_batch_atoms`` where it sets one).
        resume: continue an interrupted run (as ``Simulator.run``).
        prerelax: relax every input structure (cell and atoms) before the jobs: ``True``
            (FIRE on a Frechet cell filter to 0.01 eV/Å), or optimizers with ``cell=``;
            None: the structures are used as given (relaxed already).
        fix_symmetry: keep each structure's space group through the pre-relaxation
            (ASE's ``FixSymmetry`` at ``prerelax_symprec`` Å, which refines it first);
            the table's ``spacegroup_initial``/``spacegroup_final``/``symmetry`` say
            whether it held (:mod:`~.prerelax`).
        prerelax_symprec: FixSymmetry's spglib tolerance (Å, > 0).
        **simulator: more ``Simulator`` arguments (``sinks``, ``callbacks`` ...).

    Returns:
        :class:`ElasticResults`.
    """
    magnitudes = _check_strains(strains)
    materials = as_structures(structures, "elastic")
    check_materials(materials, model, "elastic")
    inputs, plan0 = materials, prerelax_plan(prerelax, "elastic")
    materials, symmetry = run_prerelax(
        materials, model, plan0, fix_symmetry, prerelax_symprec, "elastic", simulator
    )
    plan = relax_plan(relax, "elastic")
    jobs = [
        Job(i, f"{i}:e{j + 1}={d:+g}", _strained(atoms, j, d, {"material": i, "voigt": j}))
        for i, atoms in enumerate(materials)
        for j in range(6)
        for d in magnitudes
    ]
    run = run_jobs(jobs, model, plan, "elastic", max_atoms, max_systems, resume, simulator)
    values, errors = [], []
    for i in range(len(materials)):
        ks = run.of(i)
        sigma = _voigt(run.stress[ks]).reshape(6, len(magnitudes), 6)  # [strain j, d, sigma]
        record: dict[str, Any] = {"strains": magnitudes.tolist(), "stresses_GPa": sigma / _GPa()}
        error = run.failure(i)
        if error is None:
            c = fit_tensor(magnitudes, sigma) / _GPa()
            record["C"] = c
            record.update({name: float(c[int(name[1]) - 1, int(name[2]) - 1]) for name in CIJ})
            m = moduli(c)
            record.update({k: m[k] for k in ("K_VRH", "G_VRH", "E_VRH", "poisson", "born_stable")})
        values.append(record)
        errors.append(error)
    settings = {"strains": magnitudes.tolist(), "relax": repr(plan) if plan is not None else None}
    settings.update(prerelax=repr(plan0) if plan0 is not None else None,
                    fix_symmetry=bool(fix_symmetry), prerelax_symprec=float(prerelax_symprec))
    return ElasticResults(inputs, values, errors, run, settings, symmetry)


def fit_tensor(magnitudes: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """``C`` (stress units) from the stresses ``sigma[j, d, :]`` (Voigt) at strain
    ``magnitudes[d]`` of component ``j``: column j is the least-squares slope of the
    stress along strain j, then symmetrised (``(C + C^T) / 2``, as pymatgen and matcalc)."""
    d = magnitudes - magnitudes.mean()
    c = np.empty((6, 6))
    for j in range(6):
        s = sigma[j] - sigma[j].mean(axis=0)
        c[:, j] = d @ s / (d @ d)
    return 0.5 * (c + c.T)


def strain_matrix(j: int, magnitude: float) -> np.ndarray:
    """The symmetric strain tensor of Voigt component ``j`` at ``magnitude`` (shear:
    engineering strain, so each off-diagonal entry is half of it)."""
    eps = np.zeros((3, 3))
    a, b = VOIGT[j]
    value = magnitude if a == b else 0.5 * magnitude
    eps[a, b] = eps[b, a] = value
    return eps


def _strained(atoms: Any, j: int, magnitude: float, info: dict[str, Any]) -> Any:
    """``atoms`` deformed by ``F = I + eps`` (rows of the cell are lattice vectors, so
    both cell and positions are multiplied by ``F^T`` on the right)."""
    f = np.eye(3) + strain_matrix(j, magnitude)
    info = {"workflow": "elastic", **info, "strain": float(magnitude)}
    cell, positions = np.asarray(atoms.cell) @ f.T, atoms.positions @ f.T
    return fresh_atoms(atoms.numbers, atoms.get_masses(), cell, positions, info)


def _voigt(stress: np.ndarray) -> np.ndarray:
    """``[..., 3, 3]`` stresses as ``[..., 6]`` in Voigt order."""
    return np.stack([stress[..., a, b] for a, b in VOIGT], axis=-1)


def _GPa() -> float:
    from ase.units import GPa

    return float(GPa)


def _check_strains(strains: Any) -> np.ndarray:
    values = np.asarray([float(s) for s in strains], dtype=np.float64)
    if len(np.unique(values)) < 2 or len(np.unique(values)) != len(values):
        raise ConfigError(
            f"elastic: strains needs at least two distinct values and no repeats, got "
            f"{list(strains)}"
        )
    if np.any(values == 0) or np.any(np.abs(values) > 0.1) or not np.all(np.isfinite(values)):
        raise ConfigError(
            f"elastic: strains are fractions, non-zero and at most 0.1 in size, got "
            f"{list(strains)}; (-0.01, -0.005, 0.005, 0.01) is ± 1 % and ± 0.5 %"
        )
    return values
