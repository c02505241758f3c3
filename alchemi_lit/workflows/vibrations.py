"""Vibrations and thermochemistry of many molecules or adsorbates, every displaced
geometry of every system in one batched run.

The finite differences are ASE's ``Vibrations`` (:mod:`.vibration_setup`), the normal
modes and frequencies ASE's ``VibrationsData`` (returned per system, for users who go on
in ASE), the thermochemistry ASE's ``IdealGasThermo`` / ``HarmonicThermo``
(:mod:`.thermo`).  Optionally the Hessian comes from autograd instead (:mod:`.hessian`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from loguru import logger

from ..core.errors import ConfigError
from ..models.base import Model
from . import vibration_setup as setup
from .base import MaterialResults
from .jobs import Job, as_structures, relax_plan, run_jobs
from .thermo import THERMO_COLUMNS, thermo_rows

#: every job's ``info``
_INFO = {"workflow": "vibrations"}


class VibrationResults(MaterialResults):
    """Per system: ``energy_eV`` and ``max_force_eV_A`` at the reference geometry,
    ``n_modes``, ``n_imaginary`` (true vibrations with imaginary frequency),
    ``min_frequency_cm1`` / ``max_frequency_cm1`` (imaginary as negative), ``zpe_eV``
    (ASE's ``VibrationsData`` over all modes); :meth:`vibrations_data` gives ASE's
    object, :meth:`thermo` the thermochemistry table, :meth:`frequency_table` every mode."""

    columns = ("energy_eV", "max_force_eV_A", "n_modes", "n_imaginary",
               "min_frequency_cm1", "max_frequency_cm1", "zpe_eV")  # fmt: skip
    name = "vibrations"

    def vibrations_data(self, i: int) -> Any:
        """System ``i``'s ``ase.vibrations.VibrationsData`` (``get_frequencies()``,
        ``get_modes()``, ``tabulate()``, ``write_jmol()`` ...)."""
        return self.values[self._check(i)]["_data"]

    def frequencies(self, i: int) -> np.ndarray:
        """Frequencies (cm^-1), ASE's complex numbers: an imaginary mode has an imaginary
        part (ASE's ``tabulate`` writes it with an ``i``)."""
        return self.vibrations_data(i).get_frequencies()

    def energies_meV(self, i: int) -> np.ndarray:
        """Vibrational energies (meV, complex as :meth:`frequencies`)."""
        return self.vibrations_data(i).get_energies() * 1000.0

    def normal_modes(self, i: int) -> np.ndarray:
        """ASE's normal modes, ``[mode, atom, xyz]`` over the vibrated atoms."""
        return self.vibrations_data(i).get_modes()

    def hessian(self, i: int) -> np.ndarray:
        """The ``(3n, 3n)`` Hessian of the vibrated atoms (eV/Å^2)."""
        return self.vibrations_data(i).get_hessian_2d()

    def mass_weighted_hessian(self, i: int) -> np.ndarray:
        """``H_ij / sqrt(m_i m_j)`` (eV/Å^2/amu): its eigenvalues are omega^2."""
        data = self.vibrations_data(i)
        masses = data.get_atoms().get_masses()[data.get_indices()]
        return setup.mass_weighted(data.get_hessian_2d(), masses)

    def frequency_table(self) -> Any:
        """One row per mode of every system: ``material``, ``formula``, ``mode``,
        ``frequency_cm1`` and ``energy_meV`` (imaginary as negative), ``imaginary``."""
        import pandas as pd

        rows = []
        for i, atoms in enumerate(self.structures):
            if self.errors[i] is not None:
                continue
            for k, e in enumerate(self.vibrations_data(i).get_energies()):
                rows.append({"material": i, "formula": atoms.get_chemical_formula(), "mode": k,
                             "frequency_cm1": _signed(e) / _invcm(),
                             "energy_meV": _signed(e) * 1000.0,
                             "imaginary": bool(abs(e.imag) > 0)})  # fmt: skip
        return pd.DataFrame(rows, columns=["material", "formula", "mode", "frequency_cm1",
                                           "energy_meV", "imaginary"])  # fmt: skip

    def thermo(self) -> Any:
        """Thermochemistry, one row per system and temperature (and pressure, ideal
        gas): ``thermo`` (ideal_gas, harmonic), ``temperature_K``, ``pressure_Pa``,
        ``potential_energy_eV``, ``zpe_eV``, ``enthalpy_eV`` (H; U for harmonic),
        ``entropy_eV_per_K``, ``gibbs_energy_eV`` (G; F for harmonic), ``error``."""
        import pandas as pd

        rows = []
        for i, atoms in enumerate(self.structures):
            lead = {"material": i, "formula": atoms.get_chemical_formula()}
            for row in self.values[i].get("thermo", []):
                rows.append({**lead, **row})
        return pd.DataFrame(rows, columns=["material", "formula", *THERMO_COLUMNS])

    def record(self, i: int) -> dict[str, Any]:
        return {k: v for k, v in self.values[i].items() if not k.startswith("_")}

    def write_material(self, i: int, stem: Any) -> list[Any]:
        """The JSON record (frequencies, Hessian, thermochemistry rows) and the thermo
        table as CSV."""
        written = super().write_material(i, stem)
        table = self.thermo()
        mine = table[table["material"] == i]
        if len(mine):
            path = stem.parent / f"{stem.name}.thermo.csv"
            mine.to_csv(path, index=False)
            written.append(path)
        return written


def vibrations(
    structures: Any,
    model: Model,
    *,
    delta: float = 0.01,
    nfree: int = 2,
    indices: Any = None,
    hessian: str = "finite_difference",
    thermo: Any = "auto",
    geometry: Any = "auto",
    symmetry_number: Any = "auto",
    spin: Any = 0.0,
    temperatures: Any = (298.15,),
    pressures: Any = (101325.0,),
    ignore_imaginary: bool = False,
    relax: Any = None,
    force_warning: float = 0.05,
    max_atoms: int | str | None = None,
    max_systems: int | None = None,
    resume: Any = None,
    **simulator: Any,
) -> VibrationResults:
    """Harmonic vibrations and thermochemistry of every structure in one batched run.

    Args:
        structures: molecules (no cell needed) or slabs with an adsorbate (``ase.Atoms``;
            a list, one, or a file ``read_structures`` reads); relaxed ones.
        model: any alchemi_lit model.
        delta, nfree: ASE's ``Vibrations``: displacement (Å) and 2 or 4 displacements
            per coordinate (central differences of second or fourth order).
        indices: atoms to vibrate: None (all), a list (for every structure) or a dict of
            structure index -> list (an adsorbate's atoms; the slab stays fixed).
        hessian: ``"finite_difference"`` (ASE's) or ``"analytic"`` (autograd's second
            derivative, for models twice differentiable by autograd: :mod:`.hessian`).
        thermo: ``"ideal_gas"``, ``"harmonic"``, None (none) or ``"auto"``: harmonic
            where ``indices`` selects part of a structure, ideal gas otherwise; one
            for all, a list or a dict of index -> choice.
        geometry: ``IdealGasThermo``'s ``monatomic``, ``linear`` or ``nonlinear``
            ("auto": linear when all atoms lie on a line); per structure as ``thermo``.
        symmetry_number: rotational symmetry number ("auto": pymatgen's point group).
        spin: total electronic spin (0 singlet, 0.5 doublet, 1 triplet).
        temperatures: K; pressures: Pa (an ideal gas's entropy and G depend on it).
        ignore_imaginary: pass ASE's ``ignore_imag_modes`` (else a system with an
            imaginary true vibration gets no thermochemistry, and the reason).
        relax: relax every structure first (one batched run, without the ``sinks`` and
            ``callbacks`` given, which are the displacement run's): ``True`` (FIRE to
            0.01 eV/Å) or optimizers; the displacements start from the relaxed
            geometries; a structure whose relaxation does not converge gets its reason.
        force_warning: eV/Å; a warning names the systems whose largest force on a
            vibrated atom at the reference geometry exceeds it (not a minimum: the
            harmonic analysis mixes in the force; relax=True).
        max_atoms, max_systems, resume, **simulator: as :func:`~.eos.eos`.

    Returns:
        :class:`VibrationResults`.
    """
    if hessian not in ("finite_difference", "analytic"):
        raise ConfigError(
            f"vibrations: hessian must be 'finite_difference' or 'analytic', got {hessian!r}"
        )
    setup.check_parameters(delta, nfree, temperatures, pressures)
    systems = as_structures(structures, "vibrations")
    n = len(systems)
    chosen = setup.check_systems(systems, model, setup.per_system(indices, n, "indices",
                                                                  "vibrations"))  # fmt: skip
    options = _thermo_options(systems, chosen, thermo, geometry, symmetry_number, spin)
    plan = relax_plan(relax, "vibrations")
    if hessian == "analytic":
        from .hessian import require_twice_differentiable

        require_twice_differentiable(model)
    unrelaxed: dict[int, str] = {}
    relaxation = None
    if plan is not None:
        systems, unrelaxed, relaxation = _relaxed(
            systems, model, plan, max_atoms, max_systems, simulator
        )
    steps = [setup.displacements(sel, nfree) for sel in chosen]
    if hessian == "analytic":
        steps = [s[:1] for s in steps]  # the reference geometry only
    jobs = [
        Job(i, f"{i}:{_name(s)}", setup.displaced(systems[i], *s, delta, _INFO))
        for i in range(n) if i not in unrelaxed for s in steps[i]
    ]  # fmt: skip
    if jobs:
        run = run_jobs(jobs, model, None, "vibrations", max_atoms, max_systems, resume, simulator)
    else:  # every relaxation failed: the relax run is all there is (each named below)
        run = relaxation
    analytic = _analytic(systems, model, chosen, run, simulator) if hessian == "analytic" else {}
    temps = np.asarray(temperatures, dtype=np.float64).ravel().tolist()
    press = np.asarray(pressures, dtype=np.float64).ravel().tolist()
    values, errors, strained = [], [], []
    for i, atoms in enumerate(systems):
        ks, sel = run.of(i), chosen[i]
        record: dict[str, Any] = {"indices": sel.tolist(), "n_displacements": len(ks)}
        error = unrelaxed.get(i) or run.failure(i)
        if error is None:
            eq = run.forces[ks[0]]
            fmax = float(np.linalg.norm(eq[sel], axis=1).max())
            if fmax > force_warning:
                strained.append(f"{i} ({atoms.get_chemical_formula()}: {fmax:.3g} eV/Å)")
            h = analytic[i] if i in analytic else setup.hessian(
                [run.forces[k] for k in ks], sel, nfree, delta)  # fmt: skip
            record.update(_analysed(atoms, h, sel, float(run.energy[ks[0]]), fmax))
            if options[i][0] is not None:
                kind, geom, sigma, s = options[i]
                record["thermo"] = thermo_rows(
                    kind, record["_data"].get_energies(), record["energy_eV"], atoms, geom,
                    sigma, s, temps, press, ignore_imaginary,
                )  # fmt: skip
        values.append(record)
        errors.append(error)
    if strained:
        logger.warning(
            f"vibrations: forces at the reference geometry exceed {force_warning} eV/Å for "
            f"structure(s) {', '.join(strained[:6])}{' ...' if len(strained) > 6 else ''}: "
            f"not a minimum, so frequencies are off; pass relax=True"
        )
    settings = {"delta": float(delta), "nfree": int(nfree), "hessian": hessian,
                "temperatures": temps, "pressures": press,
                "thermo": [list(o) for o in options],
                "relax": repr(plan) if plan is not None else None}  # fmt: skip
    return VibrationResults(systems, values, errors, run, settings)


def _analysed(atoms: Any, h: np.ndarray, sel: np.ndarray, energy: float, fmax: float) -> dict:
    """ASE's ``VibrationsData`` of one system and its table values."""
    from ase.vibrations import VibrationsData

    data = VibrationsData.from_2d(atoms, h, indices=sel)
    e = data.get_energies()
    n_atoms = len(sel)
    true = _true_vibrations(e, n_atoms, len(atoms), setup.is_linear(atoms))
    signed = np.array([_signed(x) for x in e]) / _invcm()
    return {
        "energy_eV": energy, "max_force_eV_A": fmax, "n_modes": len(e),
        "n_imaginary": int(sum(abs(x.imag) > 0 for x in true)),
        "min_frequency_cm1": float(signed.min()), "max_frequency_cm1": float(signed.max()),
        "zpe_eV": float(data.get_zero_point_energy()),
        "frequencies_cm1": signed, "hessian_eV_A2": h, "_data": data,
    }  # fmt: skip


def _true_vibrations(e: np.ndarray, n_sel: int, n_all: int, linear: bool) -> list[complex]:
    """The modes that are vibrations: all of a partial selection (adsorbate: the slab
    holds it in place); of a whole molecule, the highest 3N-6 (3N-5 linear) by
    ``(e**2).real``, as ASE's ``IdealGasThermo`` selects them."""
    ordered = sorted(e, key=lambda x: (x**2).real)
    if n_sel < n_all:
        return ordered
    keep = 3 * n_all - (5 if linear else 6)
    return ordered[-keep:] if keep > 0 else []


def _signed(e: complex) -> float:
    """A real or imaginary energy as one real number, imaginary ones negative."""
    return float(e.real) if abs(e.imag) == 0 else -float(abs(e.imag))


def _invcm() -> float:
    from ase.units import invcm

    return float(invcm)


def _name(step: tuple[int, int, int]) -> str:
    """ASE's displacement names: ``eq``, ``0x-``, ``2z++`` ..."""
    a, axis, s = step
    return "eq" if s == 0 else f"{a}{'xyz'[axis]}{('+' if s > 0 else '-') * abs(s)}"


def _thermo_options(
    systems: list[Any], chosen: list[np.ndarray], thermo: Any, geometry: Any,
    symmetry_number: Any, spin: Any,
) -> list[tuple[Any, Any, Any, Any]]:  # fmt: skip
    """Per system (kind, geometry, symmetry number, spin), each checked and resolved."""
    n = len(systems)
    kinds = setup.per_system(thermo, n, "thermo", "vibrations")
    geoms = setup.per_system(geometry, n, "geometry", "vibrations")
    sigmas = setup.per_system(symmetry_number, n, "symmetry_number", "vibrations")
    spins = setup.per_system(spin, n, "spin", "vibrations")
    out = []
    for i, atoms in enumerate(systems):
        name = f"vibrations: structure {i} ({atoms.get_chemical_formula()})"
        kind = kinds[i]
        if kind == "auto":
            kind = "harmonic" if len(chosen[i]) < len(atoms) else "ideal_gas"
        if kind not in ("ideal_gas", "harmonic", None):
            raise ConfigError(
                f"{name}: thermo must be 'ideal_gas', 'harmonic', 'auto' or None, got {kind!r}"
            )
        geom = "auto" if geoms[i] is None else geoms[i]
        if geom == "auto":
            geom = "linear" if setup.is_linear(atoms) else "nonlinear"
        if geom not in setup.GEOMETRIES:
            raise ConfigError(f"{name}: geometry must be one of {setup.GEOMETRIES}, got {geom!r}")
        sigma = sigmas[i]
        if kind == "ideal_gas" and sigma in ("auto", None):
            sigma = setup.symmetry_number(atoms)
        if kind == "ideal_gas" and not (int(sigma) == sigma and int(sigma) >= 1):
            raise ConfigError(f"{name}: symmetry_number must be an integer >= 1, got {sigma!r}")
        s = 0.0 if spins[i] is None else float(spins[i])
        if s < 0 or 2 * s != int(2 * s):
            raise ConfigError(f"{name}: spin is a total spin 0, 0.5, 1 ..., got {spins[i]!r}")
        out.append((kind, geom, None if kind != "ideal_gas" else int(sigma), s))
    return out


def _relaxed(
    systems: list[Any], model: Model, plan: Any, max_atoms: Any, max_systems: Any,
    simulator: dict[str, Any],
) -> tuple[list[Any], dict[int, str], Any]:  # fmt: skip
    """Every structure relaxed in one batched run, why a structure whose relaxation did
    not converge gets no vibrations (the others go on), and the run's ``JobRun``."""
    jobs = [Job(i, f"{i}:relax", setup.displaced(a, 0, 0, 0, 0.0, _INFO))
            for i, a in enumerate(systems)]  # fmt: skip
    # the user's sinks and callbacks (a ZarrSink, a Checkpoint) are the displacement
    # run's: a second run writing to them would clash with its store and checkpoints
    opts = {k: v for k, v in simulator.items() if k not in ("sinks", "callbacks")}
    run = run_jobs(jobs, model, plan, "vibrations (relax)", max_atoms, max_systems, None, opts)
    failed = {i: f"relax={plan!r}: {run.failure(i)}" for i in range(len(systems))
              if run.failure(i) is not None}  # fmt: skip
    positions = run.results.batch.to(device="cpu").positions.double().numpy()
    out, start = [], 0
    for atoms in systems:
        relaxed = atoms.copy()
        relaxed.positions = positions[start : start + len(atoms)]
        start += len(atoms)
        out.append(relaxed)
    return out, failed, run


def _analytic(
    systems: list[Any], model: Model, chosen: list[np.ndarray], run: Any, simulator: dict
) -> dict[int, np.ndarray]:
    """Per system the autograd Hessian of the vibrated atoms (:mod:`.hessian`)."""
    from .hessian import analytic_hessians

    ok = [i for i in range(len(systems)) if run.of(i) and run.failure(i) is None]
    got = analytic_hessians([systems[i] for i in ok], model, [chosen[i] for i in ok],
                            simulator.get("precision"))  # fmt: skip
    return dict(zip(ok, got))
