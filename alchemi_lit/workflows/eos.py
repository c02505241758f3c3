"""Equation of state of many materials: E(V) on isotropic strains, fitted by ASE.

Each material's cell is scaled isotropically (``1 + strain`` on every lattice vector,
atoms scaled with it, as ``ase.eos.calculate_eos`` does) and every volume of every
material is one job of one batched run; the fit is ASE's ``EquationOfState`` (its
``eos`` choices), the object materials scientists already trust, returned per material.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from ..core.errors import ConfigError
from ..models.base import Model
from .base import MaterialResults
from .jobs import Job, as_structures, check_materials, fresh_atoms, relax_plan, run_jobs
from .prerelax import prerelax as run_prerelax
from .prerelax import prerelax_plan

#: ASE's EOS forms with B0' as a fitted parameter (``eos_parameters[2]``)
_WITH_BP = ("murnaghan", "birch", "birchmurnaghan", "pouriertarantola", "vinet")


class EOSResults(MaterialResults):
    """Per material: ``V0`` (Å^3 per input cell), ``E0`` (eV per input cell), ``B0``
    (GPa), ``B0_prime``; :meth:`eos` gives the fitted ASE ``EquationOfState``."""

    columns = ("V0", "E0", "B0", "B0_prime")
    name = "eos"

    def eos(self, i: int) -> Any:
        """Material ``i``'s fitted ``ase.eos.EquationOfState`` (``.plot()``, ``.v``, ``.e``)."""
        return self.values[self._check(i)]["_eos"]

    def volumes(self, i: int) -> np.ndarray:
        """The volumes (Å^3) material ``i`` was evaluated at, smallest first."""
        return np.asarray(self.values[i]["volumes"])

    def energies(self, i: int) -> np.ndarray:
        """The energies (eV) at :meth:`volumes`."""
        return np.asarray(self.values[i]["energies"])

    def record(self, i: int) -> dict[str, Any]:
        return {k: v for k, v in self.values[i].items() if not k.startswith("_")}


def eos(
    structures: Any,
    model: Model,
    *,
    n_points: int = 7,
    max_strain: float = 0.04,
    eos: str = "birchmurnaghan",
    relax: Any = None,
    max_atoms: int | str | None = None,
    max_systems: int | None = None,
    resume: Any = None,
    prerelax: Any = None,
    fix_symmetry: bool = True,
    prerelax_symprec: float = 0.01,
    **simulator: Any,
) -> EOSResults:
    """Fit the equation of state of every structure in one batched run.

    Args:
        structures: ``ase.Atoms`` periodic in x, y and z (a list, one, or a file
            ``read_structures`` reads); relaxed ones, ideally (the fit finds V0 anyway).
        model: any alchemi_lit model.
        n_points: volumes per material (at least 5: the fits have 4 parameters).
        max_strain: largest linear strain of the lattice vectors; the strains are
            ``linspace(-max_strain, max_strain, n_points)`` (ASE's ``calculate_eos``
            default: 0.04).
        eos: the form ASE fits: ``birchmurnaghan`` (default), ``sj``, ``taylor``,
            ``murnaghan``, ``birch``, ``pouriertarantola``, ``vinet``,
            ``anton-schmidt`` or ``p3``.
        relax: relax the atoms at each volume: ``True`` (FIRE to 0.01 eV/Å), an
            optimizer or a fused plan of them; a cell filter only with
            ``constant_volume=True``.
        max_atoms, max_systems: inflight batching budgets (None: one batch of all jobs,
            or on a CPU chunks of the model's ``cpu_batch_atoms`` where it sets one;
            ``"auto"`` measures the device's memory).
        resume: continue an interrupted run (as ``Simulator.run``: True or a checkpoint).
        prerelax: relax every input structure (cell and atoms) before the jobs: ``True``
            (FIRE on a Frechet cell filter to 0.01 eV/Å), or optimizers with ``cell=``;
            None: the structures are used as given (relaxed already).
        fix_symmetry: keep each structure's space group through the pre-relaxation
            (ASE's ``FixSymmetry`` at ``prerelax_symprec`` Å, which refines it first);
            the table's ``spacegroup_initial``/``spacegroup_final``/``symmetry`` say
            whether it held (:mod:`~.prerelax`).
        prerelax_symprec: FixSymmetry's spglib tolerance (Å, > 0).
        **simulator: more ``Simulator`` arguments: ``sinks``, ``callbacks``,
            ``precision``, ``seed``, ``accelerator`` ...

    Returns:
        :class:`EOSResults`: ``to_pandas()`` with ``V0``, ``E0``, ``B0`` (GPa),
        ``B0_prime``; ``eos(i)``; a material whose fit or jobs failed has NaN values and
        its reason in ``error``.
    """
    from ase.eos import eos_names

    if eos not in eos_names:
        raise ConfigError(f"eos: eos must be one of ASE's {', '.join(eos_names)}; got {eos!r}")
    if int(n_points) < 5:
        raise ConfigError(
            f"eos: n_points must be >= 5 (the fits have 4 parameters), got {n_points}"
        )
    if not 0.0 < float(max_strain) <= 0.25:
        raise ConfigError(
            f"eos: max_strain is a fraction of the lattice vectors in (0, 0.25], got "
            f"{max_strain}; 0.04 is 4 %"
        )
    materials = as_structures(structures, "eos")
    check_materials(materials, model, "eos")
    inputs, plan0 = materials, prerelax_plan(prerelax, "eos")
    materials, symmetry = run_prerelax(
        materials, model, plan0, fix_symmetry, prerelax_symprec, "eos", simulator
    )
    plan = relax_plan(relax, "eos", cell_allowed=_keeps_volume)
    strains = np.linspace(-float(max_strain), float(max_strain), int(n_points))
    jobs = [
        Job(i, f"{i}:V{k}", _scaled(atoms, s, i, k))
        for i, atoms in enumerate(materials)
        for k, s in enumerate(strains)
    ]
    run = run_jobs(jobs, model, plan, "eos", max_atoms, max_systems, resume, simulator)
    values, errors = [], []
    for i in range(len(materials)):
        ks = run.of(i)
        volumes = [abs(np.linalg.det(jobs[k].atoms.cell)) for k in ks]
        record: dict[str, Any] = {
            "form": eos,
            "strains": strains.tolist(),
            "volumes": volumes,
            "energies": run.energy[ks].tolist(),
        }
        error = run.failure(i)
        if error is None:
            try:
                record.update(fit_eos(volumes, run.energy[ks], eos))
            except _FitError as exc:
                error = str(exc)
        values.append(record)
        errors.append(error)
    settings = {"n_points": int(n_points), "max_strain": float(max_strain), "eos": eos,
                "relax": repr(plan) if plan is not None else None}  # fmt: skip
    settings.update(prerelax=repr(plan0) if plan0 is not None else None,
                    fix_symmetry=bool(fix_symmetry), prerelax_symprec=float(prerelax_symprec))
    return EOSResults(inputs, values, errors, run, settings, symmetry)


class _FitError(ValueError):
    """ASE's fit failed or its minimum lies outside the sampled volumes."""


def fit_eos(volumes: Any, energies: Any, form: str) -> dict[str, Any]:
    """ASE's fit of one material: V0, E0, B0 (GPa), B0' and the fitted object."""
    from ase.eos import EquationOfState
    from ase.units import GPa

    fit = EquationOfState(list(volumes), list(energies), eos=form)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # scipy's covariance warnings; range checked below
            v0, e0, b0 = fit.fit(warn=False)
    except (RuntimeError, ValueError) as exc:  # curve_fit gave up; sj: "No minimum!"
        why = f"ASE's {form} fit failed ({exc}); widen max_strain or relax the structure first"
        raise _FitError(why) from exc
    lo, hi = min(volumes), max(volumes)
    if not lo < v0 < hi:
        raise _FitError(
            f"the {form} minimum V0={v0:.4g} Å^3 lies outside the sampled volumes "
            f"[{lo:.4g}, {hi:.4g}]: relax the structure first or widen max_strain"
        )
    return {"V0": float(v0), "E0": float(e0), "B0": float(b0 / GPa),
            "B0_prime": _b0_prime(fit), "_eos": fit}  # fmt: skip


def _b0_prime(fit: Any) -> float:
    """dB/dP at V0: the fitted parameter where the form has one, else from the fitted
    E(V) as B' = -1 - V0^2 E3 / B0, E3 the third derivative by central differences with
    one Richardson step (error ~10 (h/V0)^4 with h = V0/200; round-off ~1e-16 E/h^3: both far
    below the differences between the forms)."""
    if fit.eos_string in _WITH_BP:
        return float(fit.eos_parameters[2])
    v0, b0 = fit.v0, fit.B

    def energy(v: float) -> float:
        if fit.eos_string == "sj":
            return float(fit.fit0(v ** (-1.0 / 3.0)))
        return float(fit.func(v, *fit.eos_parameters))

    def third(h: float) -> float:
        e = [energy(v0 + k * h) for k in (2, 1, -1, -2)]
        return (e[0] - 2 * e[1] + 2 * e[2] - e[3]) / (2 * h**3)

    h = v0 / 200.0
    e3 = (4.0 * third(h / 2) - third(h)) / 3.0
    return float(-1.0 - v0**2 * e3 / b0)


def _keeps_volume(cell: Any) -> bool:
    """A cell filter may relax the shape at each volume, never the volume itself."""
    flags = cell.constant_volume
    return bool(flags) if isinstance(flags, bool) else all(flags)


def _scaled(atoms: Any, strain: float, i: int, k: int) -> Any:
    f = 1.0 + float(strain)
    info = {"workflow": "eos", "material": i, "job": k}
    cell, positions = np.asarray(atoms.cell) * f, atoms.positions * f
    return fresh_atoms(atoms.numbers, atoms.get_masses(), cell, positions, info)
