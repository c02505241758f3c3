"""Quasi-harmonic thermal properties of many materials through phonopy: phonons at
several volumes of each, every volume's cell and displaced supercells of every material
in one batched run.

Each material is scaled isotropically (as :mod:`.eos` does), phonopy sets up each
volume (:mod:`.phonopy_setup`, the phonon workflow's path), and phonopy's own QHA
(``phonopy.run_qha``: F(V; T) fitted per temperature) gives V(T), the thermal expansion,
B(T), G(T) and C_p(T).  A material with imaginary modes at some volume, or whose fits
phonopy cannot make, is reported with its reason; the others are still returned.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.errors import ConfigError
from ..core.workers import map_in_workers, resolve_workers
from ..models.base import Model
from . import phonopy_calls
from .base import MaterialResults
from .jobs import Job, as_structures, check_materials, fresh_atoms, run_jobs
from .phonopy_setup import build_phonopys, require_phonopy, setup_costs, supercell_matrices

#: phonopy's equations of state for the F(V) fits
QHA_EOS = ("vinet", "murnaghan", "birch_murnaghan")


class QHAResults(MaterialResults):
    """Per material, at 300 K (per input cell): ``V_300K`` (Å^3), ``beta_300K``
    (volumetric thermal expansion, 1/K, phonopy's), ``alpha_300K`` (linear, beta / 3),
    ``B_300K`` (GPa), ``G_300K`` (eV), ``Cp_300K`` (eV/K), and ``min_frequency_THz``
    over all volumes; :meth:`thermal` the whole T grid, :meth:`qha` phonopy's result."""

    columns = ("V_300K", "beta_300K", "alpha_300K", "B_300K", "G_300K", "Cp_300K",
               "min_frequency_THz")  # fmt: skip
    name = "qha"

    def qha(self, i: int) -> Any:
        """Material ``i``'s ``phonopy.qha.qha.QHAResult`` (eV, Å, K, per primitive cell)."""
        return self.values[self._check(i)]["_qha"]

    def thermal(self, i: int) -> Any:
        """Per temperature (per input cell), a ``pandas.DataFrame``: ``temperature_K``,
        ``volume_A3``, ``beta_per_K``, ``alpha_per_K``, ``bulk_modulus_GPa``,
        ``gibbs_energy_eV``, ``heat_capacity_eV_per_K`` (C_p)."""
        import pandas as pd

        self._check(i)
        return pd.DataFrame(self.values[i]["curves"])

    def record(self, i: int) -> dict[str, Any]:
        return {k: v for k, v in self.values[i].items() if not k.startswith("_")}

    def write_material(self, i: int, stem: Any) -> list[Any]:
        """The JSON record (E(V), the T curves) and the T curves as CSV."""
        written = super().write_material(i, stem)
        path = stem.parent / f"{stem.name}.thermal.csv"
        self.thermal(i).to_csv(path, index=False)
        return [*written, path]


def qha(
    structures: Any,
    model: Model,
    *,
    n_volumes: int = 7,
    max_strain: float = 0.02,
    eos: str = "vinet",
    supercell: Any = "auto",
    min_width: float | None = None,
    distance: float = 0.01,
    primitive_matrix: Any = "auto",
    symprec: float = 1e-5,
    mesh: Any = 50.0,
    temperatures: Any = tuple(range(0, 1011, 10)),
    imaginary_tolerance: float = 0.05,
    max_atoms: int | str | None = None,
    max_systems: int | None = None,
    resume: Any = None,
    workers: int | str = "auto",
    **simulator: Any,
) -> QHAResults:
    """Quasi-harmonic approximation of every structure, all volumes in one batched run.

    Args:
        structures: relaxed ``ase.Atoms`` periodic in x, y and z.
        model: any alchemi_lit model.
        n_volumes: volumes per material (at least 5: phonopy's fits have 4 parameters).
        max_strain: largest linear strain; the lattice vectors are scaled by
            ``1 + linspace(-max_strain, max_strain, n_volumes)`` (0.02: volumes
            within about ± 6 %, bracketing the thermal expansion of most solids).
        eos: phonopy's F(V) form: ``vinet``, ``murnaghan`` or ``birch_murnaghan``.
        supercell: as :func:`~.phonons.phonons`, as are ``min_width``, ``distance``,
            ``primitive_matrix``, ``symprec``, ``mesh``, ``imaginary_tolerance`` and
            ``workers`` (one supercell matrix per material, the same at every volume).
        temperatures: K, ascending and evenly spaced from low T (phonopy differentiates
            along them; the last one is consumed by its finite differences); 300 K is
            interpolated for the table.
        max_atoms, max_systems, resume, **simulator: as :func:`~.eos.eos`.

    Returns:
        :class:`QHAResults`.
    """
    require_phonopy(False)
    import phonopy

    if not hasattr(phonopy, "run_qha"):
        raise ConfigError(
            f"qha: needs phonopy.run_qha, which phonopy {phonopy.__version__} lacks: "
            f"pip install -U phonopy"
        )
    temps = _check(n_volumes, max_strain, eos, distance, imaginary_tolerance, temperatures)
    materials = as_structures(structures, "qha")
    check_materials(materials, model, "qha")
    width = 2.0 * float(model.cutoff) if min_width is None else float(min_width)
    matrices = supercell_matrices(supercell, materials, width, model)
    strains = np.linspace(-float(max_strain), float(max_strain), int(n_volumes))
    cells = [[_scaled(a, s, i, k) for k, s in enumerate(strains)] for i, a in enumerate(materials)]
    flat = [c for per in cells for c in per]
    flat_m = [m for m, per in zip(matrices, cells) for _ in per]
    costs = setup_costs(flat, flat_m)
    n_workers = resolve_workers(workers, len(flat), "qha", sum(costs))
    setups = build_phonopys(flat, flat_m, primitive_matrix, symprec, distance, n_workers, costs)
    nv = int(n_volumes)
    jobs = []
    for i in range(len(materials)):
        for k in range(nv):
            jobs.append(Job(i, f"{i}:V{k}", cells[i][k]))
            jobs += [Job(i, f"{i}:V{k}:d{m}", sc) for m, sc in enumerate(setups[i * nv + k][1])]
    run = run_jobs(jobs, model, None, "qha", max_atoms, max_systems, resume, simulator)
    failed = [run.failure(i) for i in range(len(materials))]
    todo = [i for i in range(len(materials)) if failed[i] is None]
    calls, scale = [], {}
    for i in todo:
        ks = run.of(i)
        cell_jobs = [k for k in ks if jobs[k].label.count(":") == 1]
        phs = [setups[i * nv + k][0] for k in range(nv)]
        per_prim = len(phs[0].primitive) / len(phs[0].unitcell)  # phonopy's normalisation
        scale[i] = per_prim
        forces = [[run.forces[k] for k in ks if jobs[k].label.startswith(f"{i}:V{v}:")]
                  for v in range(nv)]  # fmt: skip
        energies = run.energy[cell_jobs] * per_prim
        calls.append((phs, forces, energies, mesh, temps, eos, imaginary_tolerance))
    got = dict(zip(todo, map_in_workers(
        phonopy_calls, "quasi_harmonic", calls, n_workers, [sum(costs[i * nv:(i + 1) * nv])
                                                           for i in todo])))  # fmt: skip
    values, errors = [], []
    for i in range(len(materials)):
        ks = run.of(i)
        record: dict[str, Any] = {
            "supercell_matrix": matrices[i], "strains": strains.tolist(),
            "volumes": [abs(np.linalg.det(cells[i][k].cell)) for k in range(nv)],
            "energies": [float(run.energy[k]) for k in ks if jobs[k].label.count(":") == 1],
        }  # fmt: skip
        error, result = failed[i], got.get(i)
        if isinstance(result, Exception):
            error = f"no QHA: {type(result).__name__}: {result}"
        elif result is not None:
            record.update(_tables(result["_qha"], 1.0 / scale[i]))
            record["min_frequency_THz"] = result["min_frequency_THz"]
        values.append(record)
        errors.append(error)
    settings = {"n_volumes": nv, "max_strain": float(max_strain), "eos": eos,
                "supercell": [m.tolist() for m in matrices], "min_width": width,
                "distance": distance, "mesh": mesh, "temperatures": temps.tolist(),
                "imaginary_tolerance": imaginary_tolerance, "workers": n_workers}  # fmt: skip
    return QHAResults(materials, values, errors, run, settings)


def _check(n_volumes: Any, max_strain: Any, eos: str, distance: Any, tolerance: Any,
           temperatures: Any) -> np.ndarray:  # fmt: skip
    """The parameters refused before anything runs; the temperatures as an array."""
    if int(n_volumes) < 5:
        raise ConfigError(
            f"qha: n_volumes must be >= 5 (phonopy's F(V) fits have 4 parameters), got {n_volumes}"
        )
    if not 0.002 <= float(max_strain) <= 0.1:
        raise ConfigError(
            f"qha: max_strain is a linear strain in [0.002, 0.1], got {max_strain}; "
            f"narrower volume ranges leave the F(V) fits ill-conditioned (0.02 is 2 %)"
        )
    if eos not in QHA_EOS:
        raise ConfigError(f"qha: eos must be one of phonopy's {QHA_EOS}, got {eos!r}")
    if not float(distance) > 0 or float(tolerance) < 0:
        raise ConfigError(
            f"qha: distance must be > 0 Å and imaginary_tolerance >= 0 THz, got {distance} "
            f"and {tolerance}"
        )
    t = np.asarray(temperatures, dtype=np.float64).ravel()
    if t.size < 4 or np.any(t < 0) or np.any(np.diff(t) <= 0):
        raise ConfigError(
            f"qha: temperatures must be >= 0 K, ascending, at least 4 of them (phonopy "
            f"differentiates along them), got {t.tolist()[:8]}"
        )
    return t


def _tables(result: Any, per_cell: float) -> dict[str, Any]:
    """The T curves per input cell (``per_cell``: input cells per primitive cell ratio
    inverted) and their 300 K values (interpolated; NaN outside the grid)."""
    from ase.units import GPa

    t = np.asarray(result.temperatures)
    beta = np.asarray(result.thermal_expansion)
    curves = {
        "temperature_K": t,
        "volume_A3": np.asarray(result.equilibrium_volumes) * per_cell,
        "beta_per_K": beta,
        "alpha_per_K": beta / 3.0,
        "bulk_modulus_GPa": np.asarray(result.bulk_moduli) / GPa,
        "gibbs_energy_eV": np.asarray(result.gibbs_free_energies) * per_cell,
        "heat_capacity_eV_per_K": np.asarray(result.heat_capacity_P.heat_capacities) * per_cell,
    }

    def at300(key: str) -> float:
        inside = t.size and t[0] <= 300.0 <= t[-1]
        return float(np.interp(300.0, t, curves[key])) if inside else float("nan")

    return {
        "curves": curves, "_qha": result,
        "V_300K": at300("volume_A3"), "beta_300K": at300("beta_per_K"),
        "alpha_300K": at300("alpha_per_K"), "B_300K": at300("bulk_modulus_GPa"),
        "G_300K": at300("gibbs_energy_eV"), "Cp_300K": at300("heat_capacity_eV_per_K"),
    }  # fmt: skip


def _scaled(atoms: Any, strain: float, i: int, k: int) -> Any:
    f = 1.0 + float(strain)
    info = {"workflow": "qha", "material": i, "job": k}
    cell, positions = np.asarray(atoms.cell) * f, atoms.positions * f
    return fresh_atoms(atoms.numbers, atoms.get_masses(), cell, positions, info)
