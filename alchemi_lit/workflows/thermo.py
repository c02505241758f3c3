"""Thermochemistry of each vibrated system through ASE: ``IdealGasThermo`` for gas
molecules (geometry, symmetry number, spin), ``HarmonicThermo`` for adsorbates.

ASE does the statistical mechanics; this module only picks the model per system and
lays out one row per system and temperature (and pressure, for an ideal gas), so the
numbers are the ones a user calling ASE by hand on the same vibrational energies gets.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from contextlib import redirect_stdout
from typing import Any

import numpy as np

#: the thermochemistry table's columns (besides material and formula)
THERMO_COLUMNS = (
    "thermo", "temperature_K", "pressure_Pa", "potential_energy_eV", "zpe_eV",
    "enthalpy_eV", "entropy_eV_per_K", "gibbs_energy_eV", "error",
)  # fmt: skip


def thermo_rows(
    kind: str,
    energies: np.ndarray,
    potential_energy: float,
    atoms: Any,
    geometry: str,
    symmetry_number: int,
    spin: float,
    temperatures: Sequence[float],
    pressures: Sequence[float],
    ignore_imaginary: bool,
) -> list[dict[str, Any]]:
    """Rows of one system: for ``kind='ideal_gas'`` one per (T, P) with ASE's enthalpy
    ``H``, entropy ``S`` and Gibbs energy ``G``; for ``'harmonic'`` one per T with the
    internal energy ``U`` as ``enthalpy_eV`` and the Helmholtz energy ``F`` as
    ``gibbs_energy_eV`` (an adsorbate's ``pV`` is negligible; pressure NaN).  ASE
    refusing (an imaginary true vibration) gives rows with NaN values and its reason."""
    from ase.thermochemistry import HarmonicThermo, IdealGasThermo
    from ase.units import Pascal

    rows: list[dict[str, Any]] = []
    base = {"thermo": kind, "potential_energy_eV": float(potential_energy)}
    grid = (
        [(t, p) for t in temperatures for p in pressures]
        if kind == "ideal_gas"
        else [(t, np.nan) for t in temperatures]
    )
    try:
        if kind == "ideal_gas":
            thermo: Any = IdealGasThermo(
                vib_energies=list(energies), geometry=geometry,  # type: ignore[arg-type]
                potentialenergy=float(potential_energy), atoms=atoms,
                symmetrynumber=int(symmetry_number), spin=float(spin),
                ignore_imag_modes=ignore_imaginary,
            )  # fmt: skip
            zpe = float(thermo.get_ZPE_correction())
        else:
            thermo = HarmonicThermo(
                vib_energies=list(energies), potentialenergy=float(potential_energy),
                ignore_imag_modes=ignore_imaginary,
            )  # fmt: skip
            zpe = float(thermo.get_ZPE_correction())
    except ValueError as exc:  # ASE: "Imaginary vibrational energies are present." ...
        why = f"ASE's {type_name(kind)} refused it: {exc}"
        return [{**base, "temperature_K": t, "pressure_Pa": p, "zpe_eV": np.nan,
                 "enthalpy_eV": np.nan, "entropy_eV_per_K": np.nan,
                 "gibbs_energy_eV": np.nan, "error": why} for t, p in grid]  # fmt: skip
    with redirect_stdout(io.StringIO()):  # (verbose=False still prints in some releases)
        for t, p in grid:
            if kind == "ideal_gas":
                h = thermo.get_enthalpy(t, verbose=False)
                s = thermo.get_entropy(t, p * Pascal, verbose=False)
                g = thermo.get_gibbs_energy(t, p * Pascal, verbose=False)
            else:
                h = thermo.get_internal_energy(t, verbose=False)
                s = thermo.get_entropy(t, verbose=False)
                g = thermo.get_helmholtz_energy(t, verbose=False)
            rows.append({**base, "temperature_K": float(t), "pressure_Pa": float(p),
                         "zpe_eV": zpe, "enthalpy_eV": float(h), "entropy_eV_per_K": float(s),
                         "gibbs_energy_eV": float(g), "error": None})  # fmt: skip
    return rows


def type_name(kind: str) -> str:
    return "IdealGasThermo" if kind == "ideal_gas" else "HarmonicThermo"
