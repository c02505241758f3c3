"""Unit constants and conversions.

alchemi_lit works internally in ASE units (eV, Å, amu, K, and ASE's time unit
Å·sqrt(amu/eV) ≈ 10.18 fs) so that numbers move between ASE and us without
conversion.  Users give time in femtoseconds, temperature in kelvin and friction
in 1/fs; integrators convert once, at construction.
"""

from __future__ import annotations

from ase import units as _ase_units

#: One femtosecond in ASE time units.
fs: float = float(_ase_units.fs)
#: Boltzmann constant in eV/K.
kB: float = float(_ase_units.kB)
#: One GPa and one bar in eV/Å^3 (ASE's pressure unit).
GPa: float = float(_ase_units.GPa)
bar: float = float(_ase_units.bar)


def fs_to_internal(t_fs: float) -> float:
    """Convert a time in femtoseconds to ASE time units."""
    return t_fs * fs


def per_fs_to_internal(rate_per_fs: float) -> float:
    """Convert a rate (e.g. Langevin friction) in 1/fs to 1/(ASE time unit)."""
    return rate_per_fs / fs


def ev_per_a3_to_gpa(p: float) -> float:
    """Convert a pressure/stress in eV/Å^3 to GPa."""
    return p / GPa


def gpa_to_ev_per_a3(p: float) -> float:
    """Convert a pressure in GPa to eV/Å^3 (the unit of ``CellFilter.scalar_pressure``)."""
    return p * GPa


def bar_to_ev_per_a3(p: float) -> float:
    """Convert a pressure in bar to eV/Å^3 (the unit of ``CellFilter.scalar_pressure``)."""
    return p * bar
