"""Phonons of many materials through phonopy, the forces of every displaced supercell of
every material from one batched run.

phonopy (the field's standard) makes the supercells and displacements and does all the
lattice dynamics -- force constants, band path, DOS, thermal properties -- exactly as a
user driving it with an ASE calculator would; only the force evaluations change: all
materials' displaced supercells are the jobs of one run.  Each material's ``Phonopy``
object is returned, ready for anything else phonopy does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.errors import ConfigError
from ..core.workers import map_in_workers, resolve_workers
from ..models.base import Model
from . import phonopy_calls
from .base import MaterialResults
from .jobs import Job, as_structures, check_materials, run_jobs
from .phonopy_calls import kj_per_mol, thermal
from .phonopy_setup import build_phonopys, require_phonopy, setup_costs, supercell_matrices
from .prerelax import prerelax as run_prerelax
from .prerelax import prerelax_plan


class PhononResults(MaterialResults):
    """Per material: ``min_frequency_THz`` (lowest on the band path and mesh; imaginary
    as negative), ``stable`` (above ``-imaginary_tolerance``), ``free_energy_300K``
    (eV per primitive cell, phonopy's), ``n_displacements``; :meth:`phonopy` gives the
    ``Phonopy`` object, :meth:`band_structure`, :meth:`dos`, :meth:`thermal` its data."""

    columns = ("min_frequency_THz", "stable", "free_energy_300K", "n_displacements")
    name = "phonons"

    def phonopy(self, i: int) -> Any:
        """Material ``i``'s ``phonopy.Phonopy`` with forces, force constants, band
        structure, mesh, DOS and thermal properties computed."""
        return self.values[self._check(i)]["_phonopy"]

    def band_structure(self, i: int) -> dict[str, Any]:
        """phonopy's band-structure dict (``qpoints``, ``distances``, ``frequencies`` in
        THz per path segment) plus ``labels``; empty without a band path."""
        band = self.phonopy(i).band_structure
        if band is None:
            return {}
        keys = ("qpoints", "distances", "frequencies", "labels", "path_connections")
        return {k: getattr(band, k) for k in keys}

    def dos(self, i: int) -> dict[str, np.ndarray]:
        """Total DOS: ``frequency_points`` (THz) and ``total_dos`` (phonopy's)."""
        dos = self.phonopy(i).total_dos
        return {"frequency_points": dos.frequency_points, "total_dos": dos.dos}

    def thermal(self, i: int) -> Any:
        """Thermal properties per primitive cell, a ``pandas.DataFrame``:
        ``temperature_K``, ``free_energy_eV``, ``entropy_eV_per_K``,
        ``heat_capacity_eV_per_K`` (phonopy's kJ/mol and J/K/mol converted)."""
        import pandas as pd

        t = thermal(self.phonopy(i))
        per_k = kj_per_mol() / 1000.0
        return pd.DataFrame({
            "temperature_K": t["temperatures"],
            "free_energy_eV": np.asarray(t["free_energy"]) * kj_per_mol(),
            "entropy_eV_per_K": np.asarray(t["entropy"]) * per_k,
            "heat_capacity_eV_per_K": np.asarray(t["heat_capacity"]) * per_k,
        })  # fmt: skip

    def record(self, i: int) -> dict[str, Any]:
        return {k: v for k, v in self.values[i].items() if not k.startswith("_")}

    def write_material(self, i: int, stem: Any) -> list[Any]:
        """The JSON record, phonopy's ``phonopy_params.yaml`` (structure, displacements,
        forces, force constants: ``phonopy.load`` reads it), ``band.yaml``,
        ``total_dos.dat`` and the thermal table as CSV."""
        written = super().write_material(i, stem)
        ph = self.phonopy(i)
        params = stem.parent / f"{stem.name}.phonopy_params.yaml"
        ph.save(params, settings={"force_constants": True})
        written.append(params)
        if ph.band_structure is not None:
            band = stem.parent / f"{stem.name}.band.yaml"
            ph.write_yaml_band_structure(filename=band)
            written.append(band)
        dos = stem.parent / f"{stem.name}.total_dos.dat"
        ph.write_total_dos(filename=dos)
        thermal = stem.parent / f"{stem.name}.thermal.csv"
        self.thermal(i).to_csv(thermal, index=False)
        return [*written, dos, thermal]


def phonons(
    structures: Any,
    model: Model,
    *,
    supercell: Any = "auto",
    min_width: float | None = None,
    distance: float = 0.01,
    primitive_matrix: Any = "auto",
    symprec: float = 1e-5,
    band_path: Any = "seekpath",
    npoints: int = 51,
    mesh: Any = 50.0,
    temperatures: Any = tuple(range(0, 1001, 50)),
    imaginary_tolerance: float = 0.05,
    max_atoms: int | str | None = None,
    max_systems: int | None = None,
    resume: Any = None,
    workers: int | str = "auto",
    prerelax: Any = None,
    fix_symmetry: bool = True,
    prerelax_symprec: float = 0.01,
    **simulator: Any,
) -> PhononResults:
    """Harmonic phonons of every structure through phonopy, forces from one batched run.

    Args:
        structures: relaxed ``ase.Atoms`` periodic in x, y and z (the unit cells).
        model: any alchemi_lit model.
        supercell: ``"auto"`` (the smallest diagonal multiple of each lattice vector
            reaching ``min_width``), an int, 3 ints (diagonal), a 3 x 3 matrix
            (phonopy's ``supercell_matrix``), for every structure; or a dict of
            structure index -> one of these (the others: "auto").
        min_width: smallest supercell thickness (Å) allowed, checked before the run;
            default twice the model's cutoff, so a displaced atom's images stay out of
            the range its force constants are read over; 0 turns the check off.
        distance: displacement length (Å, phonopy's default 0.01).
        primitive_matrix, symprec: passed to ``Phonopy``.
        band_path: ``"seekpath"`` (phonopy's ``auto_band_structure``), a list of
            paths of fractional q-points (each a list of corners, in the primitive
            cell's reciprocal basis, for every structure), or None.
        npoints: q-points per path segment.
        mesh: the mesh for DOS, thermal properties and the stability test (phonopy's
            ``run_mesh``: a length in Å or three numbers).
        temperatures: K, for the thermal properties (300 K is always included).
        imaginary_tolerance: THz; ``stable`` means no frequency below ``-tolerance``
            (imaginary frequencies are negative), 0.05 THz as atomate2's default:
            acoustic modes near Gamma come out slightly imaginary from numerical noise.
        workers: processes for phonopy's own per-material work (symmetry set-up of each
            supercell, force constants, mesh, thermal sums), which cannot be batched
            and dominates with a cheap model or a GPU; ``"auto"``: one per usable core,
            at most one per material, and none when the supercells are so small that
            phonopy's work is shorter than starting a worker.  Results do not depend
            on it.
        max_atoms, max_systems, resume, **simulator: as :func:`~.elastic.elastic`.
        prerelax, fix_symmetry, prerelax_symprec: as :func:`~.elastic.elastic`.

    Returns:
        :class:`PhononResults`.
    """
    require_phonopy(band_path == "seekpath")
    if not float(distance) > 0 or float(imaginary_tolerance) < 0:
        raise ConfigError(
            f"phonons: distance must be > 0 Å and imaginary_tolerance >= 0 THz, got "
            f"{distance} and {imaginary_tolerance}"
        )
    materials = as_structures(structures, "phonons")
    check_materials(materials, model, "phonons")
    inputs, plan0 = materials, prerelax_plan(prerelax, "phonons")
    materials, symmetry = run_prerelax(
        materials, model, plan0, fix_symmetry, prerelax_symprec, "phonons", simulator
    )
    width = 2.0 * float(model.cutoff) if min_width is None else float(min_width)
    matrices = supercell_matrices(supercell, materials, width, model)
    temps = np.unique(np.append(np.asarray(temperatures, dtype=np.float64), 300.0))
    costs = setup_costs(materials, matrices)  # the analyses scale alike
    work = sum(costs)
    n_workers = resolve_workers(workers, len(materials), "phonons", work)
    setups = build_phonopys(
        materials, matrices, primitive_matrix, symprec, distance, n_workers, costs
    )
    jobs = [
        Job(i, f"{i}:d{k}", sc)
        for i, (_, supercells) in enumerate(setups)
        for k, sc in enumerate(supercells)
    ]
    run = run_jobs(jobs, model, None, "phonons", max_atoms, max_systems, resume, simulator)
    failed = [run.failure(i) for i in range(len(materials))]
    todo = [i for i in range(len(materials)) if failed[i] is None]
    analysed = dict(zip(todo, map_in_workers(phonopy_calls, "analyse", [
        (setups[i][0], [run.forces[k] for k in run.of(i)], band_path, npoints, mesh, temps,
         imaginary_tolerance) for i in todo
    ], n_workers, [costs[i] for i in todo])))  # fmt: skip
    values, errors = [], []
    for i, (_, supercells) in enumerate(setups):
        record: dict[str, Any] = {"supercell_matrix": matrices[i],
                                  "n_displacements": len(supercells)}  # fmt: skip
        error, got = failed[i], analysed.get(i)
        if isinstance(got, Exception):  # phonopy's own failure, for this material only
            error = f"phonopy failed: {type(got).__name__}: {got}"
        elif got is not None:
            record.update(got)
        values.append(record)
        errors.append(error)
    settings = {
        "supercell": [m.tolist() for m in matrices], "min_width": width, "distance": distance,
        "band_path": band_path, "npoints": npoints, "mesh": mesh, "temperatures": temps.tolist(),
        "imaginary_tolerance": imaginary_tolerance, "workers": n_workers,
    }  # fmt: skip
    settings.update(prerelax=repr(plan0) if plan0 is not None else None,
                    fix_symmetry=bool(fix_symmetry), prerelax_symprec=float(prerelax_symprec))
    return PhononResults(inputs, values, errors, run, settings, symmetry)
