"""phonopy's per-material work: set-up (supercell, symmetry, displacements) and analysis
(force constants, band path, mesh, DOS, thermal properties).

Standalone on purpose (numpy, phonopy and ASE only, nothing relative): worker processes
load this file without alchemi_lit or torch (:mod:`alchemi_lit.core.workers`), so the
materials' phonopy work runs on every core while starting a worker stays cheap.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import numpy as np


def build(
    numbers: np.ndarray, cell: np.ndarray, scaled_positions: np.ndarray, masses: np.ndarray,
    matrix: np.ndarray, primitive_matrix: Any, symprec: float, distance: float,
) -> tuple[Any, list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]]:  # fmt: skip
    """phonopy's ``Phonopy`` with its displacements generated, and each displaced
    supercell as (numbers, masses, cell, Cartesian positions)."""
    from phonopy import Phonopy
    from phonopy.structure.atoms import PhonopyAtoms

    unit = PhonopyAtoms(
        numbers=list(numbers), cell=cell, scaled_positions=scaled_positions, masses=masses
    )
    with warnings.catch_warnings():  # "auto" is our documented choice, not a stale default
        warnings.filterwarnings("ignore", message="primitive_matrix defaulted to 'auto'")
        ph = Phonopy(
            unit, supercell_matrix=matrix, primitive_matrix=primitive_matrix, symprec=symprec
        )
    ph.generate_displacements(distance=float(distance))
    supercells = []
    for sc in ph.supercells_with_displacements:
        lattice = np.asarray(sc.cell)
        supercells.append((sc.numbers, sc.masses, lattice, sc.scaled_positions @ lattice))
    return ph, supercells


def analyse(
    ph: Any, forces: list[np.ndarray], band_path: Any, npoints: int, mesh: Any,
    temps: np.ndarray, tolerance: float,
) -> dict[str, Any]:  # fmt: skip
    """Force constants, band path, mesh, DOS and thermal properties of one material."""
    ph.forces = np.asarray(forces)
    ph.produce_force_constants(show_drift=False)
    lowest = []
    if band_path == "seekpath":
        ph.auto_band_structure(npoints=int(npoints))
    elif band_path is not None:
        from phonopy.phonon.band_structure import get_band_qpoints_and_path_connections

        qpoints, connections = get_band_qpoints_and_path_connections(band_path, int(npoints))
        ph.run_band_structure(qpoints, path_connections=connections)
    if ph.band_structure is not None:
        lowest.append(min(float(np.min(f)) for f in ph.band_structure.frequencies))
    ph.run_mesh(mesh)
    lowest.append(float(np.min(ph.mesh.frequencies)))
    ph.run_total_dos()
    ph.run_thermal_properties(temperatures=temps, **without_gamma_acoustic())
    t = thermal(ph)
    at300 = int(np.flatnonzero(np.asarray(t["temperatures"]) == 300.0)[0])
    low = min(lowest)
    return {
        **plot_data(ph),
        "min_frequency_THz": low,
        "stable": bool(low >= -float(tolerance)),
        "free_energy_300K": float(t["free_energy"][at300]) * kj_per_mol(),
        "_phonopy": ph,
    }


def kj_per_mol() -> float:
    """1 kJ/mol in eV (phonopy's thermal properties are per mole of primitive cells)."""
    from ase.units import kJ, mol

    return float(kJ / mol)


def thermal(ph: Any) -> dict[str, np.ndarray]:
    """phonopy's thermal properties (kJ/mol, J/K/mol) from its ``ThermalProperties``
    (the dict getter is deprecated in phonopy 4; older releases lack the attributes)."""
    t = ph.thermal_properties
    names = ("temperatures", "free_energy", "entropy", "heat_capacity")
    if all(hasattr(t, n) for n in names):
        return {n: np.asarray(getattr(t, n)) for n in names}
    return {n: np.asarray(v) for n, v in ph.get_thermal_properties_dict().items()}


def without_gamma_acoustic() -> dict[str, bool]:
    """Leave the three acoustic modes at Gamma out of the thermal sums where phonopy can
    (``exclude_gamma_acoustic``, phonopy 4): they are zero up to numerical noise, and
    their ``kT ln(h nu / kT)`` terms made the free energy depend on that noise by
    ~1e-4 eV on a Gamma-centred mesh."""
    from phonopy import Phonopy

    params = inspect.signature(Phonopy.run_thermal_properties).parameters
    return {"exclude_gamma_acoustic": True} if "exclude_gamma_acoustic" in params else {}


def plot_data(ph: Any) -> dict[str, Any]:
    """Band path and DOS as plain lists, for the per-material file (what ``alchemi-lit
    report`` plots without phonopy's symmetry set-up again)."""
    dos = ph.total_dos
    out: dict[str, Any] = {
        "dos": {"frequency_THz": np.asarray(dos.frequency_points), "dos": np.asarray(dos.dos)}
    }
    band = ph.band_structure
    if band is not None:
        connections = band.path_connections
        out["band"] = {
            "distances": [np.asarray(d) for d in band.distances],
            "frequencies_THz": [np.asarray(f) for f in band.frequencies],
            "labels": list(band.labels) if band.labels is not None else None,
            "connections": None if connections is None else [bool(c) for c in connections],
        }
    return out


def quasi_harmonic(
    phs: list[Any], forces: list[list[np.ndarray]], energies: np.ndarray, mesh: Any,
    temps: np.ndarray, eos: str, tolerance: float,
) -> dict[str, Any]:  # fmt: skip
    """phonopy's QHA (``phonopy.run_qha``) of one material from its phonons at each
    volume: force constants per volume, the stability test on ``mesh`` (a volume with a
    frequency below ``-tolerance`` THz is refused, named: its free energy is not
    harmonic), then phonopy's F(V; T) fits.  ``energies``: eV per primitive cell."""
    import phonopy

    lowest = []
    for ph, f in zip(phs, forces):
        ph.forces = np.asarray(f)
        ph.produce_force_constants(show_drift=False)
        ph.run_mesh(mesh)
        lowest.append(float(np.min(ph.mesh.frequencies)))
    bad = [k for k, low in enumerate(lowest) if low < -float(tolerance)]
    if bad:
        raise ValueError(
            f"imaginary modes at volume(s) {bad} of {len(phs)} (lowest "
            f"{min(lowest):.3g} THz < -{tolerance} THz): the quasi-harmonic free energy "
            f"is undefined there; narrow max_strain or check the structure is stable"
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (lattice fitting skipped for low symmetry ...)
        result = phonopy.run_qha(
            phs, np.asarray(temps, dtype=np.float64), internal_energies=np.asarray(energies),
            mesh=mesh, eos=eos, **without_gamma_acoustic(),
        )  # fmt: skip
    return {"min_frequency_THz": min(lowest), "_qha": result}
