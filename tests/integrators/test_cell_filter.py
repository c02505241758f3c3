"""The cell filter's math against ASE's ``FrechetCellFilter`` / ``UnitCellFilter`` and
scipy, in float64.

``CellFilter`` maps (positions, cell, forces, stress, reference cell) to ASE's extended
coordinates and forces and back.  Checked here, to round-off, on strained and sheared
(triclinic) argon crystals with per-system pressure, hydrostatic, constant-volume and
mask settings in one batch: ``get_positions`` / ``get_forces`` / ``set_positions`` of
ASE's filter objects, the batched ``logm``/``expm`` against scipy/mpmath, the Frechet
cell force against ASE's nine ``expm_frechet`` calls.

:class:`ExactFrechet` is ASE's FrechetCellFilter with the one constant we drop: ASE's
cell coordinates are ``c logm(n F) = c (log F + ln(n) I)``; the constant cancels in
every step, but computing around it costs ASE ~1e-12 per ``set_positions``, which a
BFGS update amplifies to ~1e-8 in 40 steps (ASE against itself with and without it).
The optimizer tests compare against ASE's optimizers on this filter; here it is held
to ASE's own filter (coordinates up to the constant, forces, set_positions).
"""

from __future__ import annotations

import pickle
import re
import warnings
from itertools import product

import numpy as np
import pytest
import scipy.linalg as sl
import torch
from ase.calculators.lj import LennardJones as AseLJ
from ase.filters import FrechetCellFilter, UnitCellFilter

from alchemi_lit import Batch
from alchemi_lit.core.errors import ConfigError, UnitWarning
from alchemi_lit.core.linalg import expm, expm_frechet_adjoint, logm
from alchemi_lit.core.units import bar_to_ev_per_a3, gpa_to_ev_per_a3
from alchemi_lit.integrators import BFGS, LBFGS, CellFilter, params
from alchemi_lit.models import LennardJones
from conftest import (
    AR_EPSILON,
    AR_SIGMA,
    cluster_argon,
    perturbed_argon,
    strained,
    triclinic_argon,
)

DT = torch.float64
CUTOFF = 8.5


def _memoized(fn):
    """``fn`` of arrays, remembered by their bytes: the same numbers, computed once (ASE's
    optimizers ask for the filter's forces three times a step, each a scipy ``logm`` and
    nine ``expm_frechet`` -- most of a test's time)."""
    cache = {}

    def call(*args, **kwargs):
        key = tuple(a.tobytes() for a in args) + tuple(sorted(kwargs.items()))
        if key not in cache:
            cache[key] = fn(*args, **kwargs)
        return cache[key].copy()

    return call


class _ForcesOncePerConfiguration:
    """An ASE filter whose forces (and the stress it keeps beside them) are computed once
    per configuration -- positions and cell -- and then handed out again: ASE's optimizers
    ask for them three or four times a step, each time redoing the filter's algebra and
    the calculator's state check, to get the same numbers bit for bit."""

    _forces_at: tuple = ()

    def get_forces(self, **kwargs):
        atoms = self.atoms  # type: ignore[attr-defined]
        key = (atoms.positions.tobytes(), atoms.cell.array.tobytes(), sorted(kwargs.items()))
        if not self._forces_at or self._forces_at[0] != key:
            self._forces_at = (key, super().get_forces(**kwargs), self.stress)  # type: ignore[misc]
        _, forces, self.stress = self._forces_at
        return forces.copy()


class CachedUnitCellFilter(_ForcesOncePerConfiguration, UnitCellFilter):
    """ASE's UnitCellFilter, its forces computed once per configuration."""


class ExactFrechet(_ForcesOncePerConfiguration, FrechetCellFilter):
    """ASE's FrechetCellFilter with cell coordinates ``c log F`` (no ``c ln(n) I``), its
    forces computed once per configuration."""

    def __init__(self, atoms, **kwargs):
        super().__init__(atoms, **kwargs)
        self._utility.logm = _memoized(self._utility.logm)
        self._utility.expm_frechet = _memoized(self._utility.expm_frechet)

    def get_positions(self):
        n = len(self.atoms)
        pos = np.zeros((n + 3, 3))
        pos[:n] = np.linalg.solve(self.deform_grad(), self.atoms.positions.T).T  # as ASE
        pos[n:] = self._utility.logm(self.deform_grad()) * self.exp_cell_factor
        return pos

    def set_positions(self, new, **kwargs):
        n, new2 = len(self.atoms), new.copy()
        new2[n:] = sl.expm(new[n:] / self.exp_cell_factor) * self.cell_factor
        self._utility.set_positions_unitcellfilter(new2, self.atoms, self.cell_factor, **kwargs)


def crystals() -> list:
    """Strained/sheared cubic argon (32 atoms) and a strained primitive (triclinic) one."""
    out = [strained(a, seed=5 + i, amount=0.04) for i, a in enumerate(perturbed_argon(4, 2, 0.1))]
    out.append(triclinic_argon(2, 0.1, 0.04, seed=7))
    out.append(strained(triclinic_argon(2, 0.05, 0.0, seed=8), seed=9, amount=0.08))
    return out


#: per-system settings (ASE keyword arguments), one per crystal
SETTINGS = [
    {},
    {"scalar_pressure": gpa_to_ev_per_a3(1.0)},
    {"hydrostatic_strain": True},
    {"constant_volume": True},
    {"mask": [1, 1, 0, 0, 0, 1]},
    {"scalar_pressure": -0.003, "mask": [1, 0, 1, 1, 0, 0]},
]


def per_system_filter(kind: str, settings: list[dict]) -> CellFilter:
    """One CellFilter holding every system's settings, indexed by system_id."""
    return CellFilter(
        kind=kind,
        scalar_pressure=[s.get("scalar_pressure", 0.0) for s in settings],
        hydrostatic_strain=[s.get("hydrostatic_strain", False) for s in settings],
        constant_volume=[s.get("constant_volume", False) for s in settings],
        mask=[s.get("mask", [1] * 6) for s in settings],
    )


def ase_filter(kind: str, atoms, settings: dict):
    return (ExactFrechet if kind == "frechet" else UnitCellFilter)(atoms, **settings)


def evaluated(batch: Batch) -> Batch:
    out = LennardJones(AR_EPSILON, AR_SIGMA, CUTOFF)(batch)
    batch.forces, batch.energy, batch.stress = out["forces"], out["energy"], out["stress"]
    return batch


@pytest.mark.parametrize("kind", ["frechet", "unit"])
def test_view_matches_ase_filters(kind: str) -> None:
    """Coordinates, forces and set_positions of each system equal its own ASE filter's,
    after the cell and atoms moved away from the reference cell."""
    rng = np.random.default_rng(0)
    atoms = crystals()
    filters, refs = [], []
    for a, settings in zip(atoms, SETTINGS):
        a.calc = AseLJ(epsilon=AR_EPSILON, sigma=AR_SIGMA, rc=CUTOFF)
        refs.append(a.cell.array.copy())
        filters.append(ase_filter(kind, a, settings))  # reference cell: the cell now
        a.set_cell(a.cell.array @ (np.eye(3) + rng.uniform(-0.04, 0.04, (3, 3))), scale_atoms=True)
        a.positions += rng.normal(scale=0.03, size=a.positions.shape)
    batch = Batch.from_atoms(atoms, dtype=DT)
    cell = per_system_filter(kind, SETTINGS)
    batch.ensure_field("cell_ref", "system", (3, 3))
    batch.cell_ref = torch.tensor(np.array(refs))
    x_atoms, x_cell = cell.coordinates(evaluated(batch))
    f_atoms, f_cell = cell.forces(batch)
    new_x, new_c = x_atoms.clone(), x_cell.clone()
    ptr = batch.ptr.tolist()
    for k, filt in enumerate(filters):
        n, lo, hi = len(atoms[k]), ptr[k], ptr[k + 1]
        pos, forces = filt.get_positions(), filt.get_forces()
        np.testing.assert_allclose(x_atoms[lo:hi].numpy(), pos[:n], rtol=0, atol=1e-13)
        np.testing.assert_allclose(x_cell[k].reshape(3, 3).numpy(), pos[n:], rtol=0, atol=1e-13)
        np.testing.assert_allclose(f_atoms[lo:hi].numpy(), forces[:n], rtol=0, atol=1e-14)
        np.testing.assert_allclose(f_cell[k].reshape(3, 3).numpy(), forces[n:], rtol=0, atol=1e-14)
        assert np.abs(forces[n:]).max() > 1e-3  # a cell under stress
        step = rng.normal(scale=0.02, size=pos.shape)
        filt.set_positions(pos + step)
        new_x[lo:hi] += torch.tensor(step[:n])
        new_c[k] += torch.tensor(step[n:].reshape(9))
    cell.set_coordinates(batch, new_x, new_c, torch.ones(len(atoms), dtype=torch.bool))
    for k, a in enumerate(atoms):
        np.testing.assert_allclose(batch.cell[k].numpy(), a.cell.array, rtol=0, atol=1e-13)
        lo, hi = ptr[k], ptr[k + 1]
        np.testing.assert_allclose(batch.positions[lo:hi].numpy(), a.positions, rtol=0, atol=1e-13)


def test_exact_frechet_is_ase_filter_up_to_the_constant() -> None:
    """The optimizer tests' reference differs from ASE's filter only by c ln(n) I."""
    rng = np.random.default_rng(1)
    for a in crystals()[:3]:
        a.calc = AseLJ(epsilon=AR_EPSILON, sigma=AR_SIGMA, rc=CUTOFF)
        b = a.copy()
        b.calc = AseLJ(epsilon=AR_EPSILON, sigma=AR_SIGMA, rc=CUTOFF)
        ase, exact = FrechetCellFilter(a), ExactFrechet(b)
        n = len(a)
        for _ in range(3):
            p_ase, p_exact = ase.get_positions(), exact.get_positions()
            offset = np.log(n) * n * np.eye(3)  # (ASE's logm(n F) n is only good to ~1e-11)
            np.testing.assert_allclose(p_ase[n:] - offset, p_exact[n:], rtol=0, atol=1e-10)
            np.testing.assert_allclose(p_ase[:n], p_exact[:n], rtol=0, atol=1e-11)
            np.testing.assert_allclose(ase.get_forces(), exact.get_forces(), rtol=0, atol=1e-11)
            step = rng.normal(scale=0.05, size=p_ase.shape)
            ase.set_positions(p_ase + step)
            exact.set_positions(p_exact + step)
            np.testing.assert_allclose(a.cell.array, b.cell.array, rtol=0, atol=1e-11)
            np.testing.assert_allclose(a.positions, b.positions, rtol=0, atol=1e-11)


def test_logm_matches_scipy() -> None:
    """Near-identity, large, rotating and defective (sheared) deformations, to 1e-12."""
    rng = np.random.default_rng(2)
    scales = np.repeat([1e-8, 1e-3, 0.05, 0.3, 1.0], 10)
    mats = [sl.expm(rng.normal(scale=s, size=(3, 3))) for s in scales]
    c, s = np.cos(1.0), np.sin(1.0)
    mats += [
        np.eye(3),
        np.array([[1.0, 0.3, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]),  # simple shear
        np.array([[1.0, 2.0, 0.5], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]),
        np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]]) * 1.1,  # complex eigenvalues
        np.diag([0.5, 1.0, 2.5]),
        np.eye(3) + np.full((3, 3), 0.083),  # |F - I|_1 just below the series' radius
        np.diag([1.24, 0.9, 1.1]),
    ]
    ours = logm(torch.tensor(np.array(mats))).numpy()
    for a, log in zip(mats, ours):
        np.testing.assert_allclose(log, sl.logm(a), rtol=0, atol=1e-12)
        np.testing.assert_allclose(sl.expm(log), a, rtol=1e-13, atol=1e-12)
    assert np.all(ours[len(mats) - 7] == 0.0)  # log I = 0 exactly


def test_logm_is_accurate_to_round_off_near_the_identity() -> None:
    """Against 40-digit mpmath: strains of a relaxation, and the series' radius."""
    import mpmath

    mpmath.mp.dps = 40
    rng = np.random.default_rng(5)
    mats = [sl.expm(rng.normal(scale=0.05, size=(3, 3))) for _ in range(5)]
    mats += [np.eye(3) + np.full((3, 3), 0.083), np.diag([0.76, 1.0, 1.2])]
    mats += [np.diag([0.6, 1.0, 1.3]), sl.expm(rng.normal(scale=0.4, size=(3, 3)))]  # roots
    ours = logm(torch.tensor(np.array(mats))).numpy()
    for k, (a, log) in enumerate(zip(mats, ours)):
        exact = np.array(mpmath.logm(mpmath.matrix(a.tolist())).tolist(), dtype=float)
        tol = 2e-15 if k < 7 else 1e-14  # square roots: their errors double at each
        np.testing.assert_allclose(log, exact, rtol=0, atol=tol)


def test_expm_is_accurate_where_torch_matrix_exp_is_not() -> None:
    """1-norms 0.008-0.05, a cell step's size: torch.linalg.matrix_exp loses ~1e-11 on
    such a matrix alone (in a batch it picks one Taylor degree for all: batch-dependent)."""
    direction = np.random.default_rng(1).normal(size=(3, 3))
    direction /= np.abs(direction).sum(0).max()
    x = np.array([direction * n for n in np.geomspace(1e-4, 3.0, 40)])
    ref = np.array([sl.expm(m) for m in x])  # scipy's expm: ~1e-16 at these norms
    np.testing.assert_allclose(expm(torch.tensor(x)).numpy(), ref, rtol=3e-15, atol=3e-15)
    alone = np.array([torch.linalg.matrix_exp(torch.tensor(m)).numpy() for m in x])
    torch_err = np.abs(alone - ref).max()
    assert torch_err > 1e-12  # why expm exists (fails once torch fixes its thresholds)


def test_frechet_cell_force_matches_ase_expm_frechet_sum() -> None:
    rng = np.random.default_rng(4)
    for scale in (0.0, 0.01, 0.3):
        log, grad = rng.normal(scale=scale, size=(3, 3)), rng.normal(scale=10.0, size=(3, 3))
        ref = np.zeros((3, 3))
        for mu, nu in product(range(3), repeat=2):
            e = np.zeros((3, 3))
            e[mu, nu] = 1.0
            ref[mu, nu] = np.sum(sl.expm_frechet(log, e, compute_expm=False) * grad)
        ours = expm_frechet_adjoint(torch.tensor(log)[None], torch.tensor(grad)[None])[0]
        np.testing.assert_allclose(ours.numpy(), ref, rtol=0, atol=1e-13)


def test_description_accepts_strings_units_and_per_system_values() -> None:
    assert LBFGS(cell="frechet").cell == CellFilter()
    assert BFGS(cell="unit").cell.kind == "unit"
    assert LBFGS(cell={"kind": "unit", "pressure_gpa": 1.0}).cell.pressure == pytest.approx(
        gpa_to_ev_per_a3(1.0)
    )
    assert CellFilter(pressure_bar=[1.0, 2.0]).pressure == pytest.approx(
        [bar_to_ev_per_a3(1.0), bar_to_ev_per_a3(2.0)]
    )
    assert CellFilter(pressure_gpa=1.0).pressure == pytest.approx(0.0062415091)
    cell = CellFilter("frechet", scalar_pressure=0.01, mask=[1, 1, 1, 0, 0, 0])
    copy = pickle.loads(pickle.dumps(cell))
    assert copy == cell and copy._memo == {}
    assert LBFGS(cell=None).cell is None and "cell" not in repr(LBFGS())


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"kind": "exp"}, "kind"),
        ({"scalar_pressure": 0.1, "pressure_gpa": 1.0}, "one pressure"),
        ({"pressure_gpa": float("nan")}, "finite"),
        ({"pressure_gpa": [[1.0, 2.0]]}, "flat list"),
        ({"scalar_pressure": "1 GPa"}, r"write scalar_pressure=1\.0"),
        ({"mask": [1, 1, 1]}, "6 values"),
        ({"mask": [1, 1, 1, 0.5, 0, 0]}, "0/1"),
        ({"hydrostatic_strain": "yes"}, "hydrostatic_strain"),
        ({"cell_factor": 0.0}, "cell_factor"),
        ({"cell_for_nonperiodic": "skip"}, "cell_for_nonperiodic"),
    ],
)
def test_bad_descriptions_are_refused(kwargs: dict, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        CellFilter(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "meant"),
    [
        ({"pressure_gpa": 5000.0}, r"pressure_gpa=5000 GPa .* did you mean 0\.5 GPa \(5000 bar\)"),
        ({"scalar_pressure": 1.0}, r"scalar_pressure=1 eV/Å\^3 .* 0\.00624151 eV/Å\^3 \(1 GPa\)"),
        ({"scalar_pressure": [0.0, -2.0]}, r"scalar_pressure=-2 eV/Å\^3 .* \(-2 GPa\)"),
        ({"pressure_bar": 1e8}, r"pressure_bar=1e\+08 bar .* did you mean 1000 bar \(1e\+08 Pa\)"),
    ],
)
def test_a_pressure_in_another_unit_warns_once_naming_the_value_meant(
    monkeypatch, kwargs: dict, meant: str
) -> None:
    """The barostats' UnitWarning rules: ``scalar_pressure=1.0`` (a GPa number in the
    eV/Å^3 slot: 160 GPa) once relaxed four Cu atoms to +5.86 eV in silence."""
    monkeypatch.setattr(params, "_warned", set())
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        CellFilter(**kwargs)
        LBFGS(cell=dict(kwargs))  # the same filter again (a config's mapping): no repeat
    messages = [str(w.message) for w in record if issubclass(w.category, UnitWarning)]
    assert len(messages) == 1, messages
    assert re.search(meant, messages[0]), messages[0]
    assert messages[0].startswith("CellFilter: ")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnitWarning)
        for usual in ({"pressure_gpa": 300.0}, {"scalar_pressure": -0.3}, {"pressure_bar": 1e4}):
            CellFilter(**usual)


@pytest.mark.parametrize(
    "kwargs",
    [{"scalar_pressure": [0.0, 0.01]}, {"mask": [[1] * 6] * 2}, {"constant_volume": [True]}],
)
def test_per_system_values_must_cover_every_system_id(kwargs: dict) -> None:
    batch = Batch.from_atoms(crystals()[:3], dtype=DT)
    with pytest.raises(ConfigError, match=r"got system_id 2; give one value per system_id"):
        LBFGS(cell=CellFilter(**kwargs)).setup(batch, 0, "stage0")
    LBFGS(cell=CellFilter(mask=[1] * 6)).setup(batch, 0, "stage0")  # one mask for all


def test_yaml_config_builds_cell_filters(tmp_path) -> None:
    """``cell: {kind: ..., ...}`` and ``cell: frechet`` in a config, through jsonargparse."""
    from alchemi_lit.cli import CLI
    from alchemi_lit.cli.argv import split_argv
    from alchemi_lit.cli.build import build

    (tmp_path / "run.yaml").write_text(
        "simulator:\n"
        "  model: {class_path: lj-argon}\n"
        "  stages:\n"
        "    - {class_path: LBFGS, init_args: {fmax: 0.01, cell: frechet}}\n"
        "    - class_path: BFGS\n"
        "      init_args:\n"
        "        fmax: 0.02\n"
        "        cell: {kind: unit, scalar_pressure: 0.001, hydrostatic_strain: false,\n"
        "               constant_volume: false, mask: [1, 1, 1, 0, 0, 0]}\n"
        "data: {structures: 'builtin:argon', builtin_args: {n_systems: 2, repeat: 2}}\n"
    )
    resolved = CLI().parse("validate", split_argv(["--config", str(tmp_path / "run.yaml")]))
    first, second = build(resolved).sim.plan.stages
    assert first.cell == CellFilter("frechet")
    assert second.cell == CellFilter("unit", scalar_pressure=0.001, mask=[1, 1, 1, 0, 0, 0])


def test_nonperiodic_systems_are_refused_or_relax_positions_only() -> None:
    molecule = cluster_argon(4.0, seed=1)
    batch = Batch.from_atoms([crystals()[0], molecule], dtype=DT)
    with pytest.raises(ConfigError, match=r"system 1 has no periodic 3-D cell.*'ignore'"):
        BFGS(cell="frechet").setup(batch, 0, "stage0")
    stage = LBFGS(cell=CellFilter(cell_for_nonperiodic="ignore"))
    stage.setup(batch, 0, "stage0")
    stage.init_systems(evaluated(batch), torch.ones(2, dtype=torch.bool))
    x_atoms, x_cell = stage.cell.coordinates(batch)
    assert torch.equal(x_atoms[32:], batch.positions[32:]) and not x_cell[1].any()
    assert not stage.cell.forces(batch)[1][1].any()


def test_neighbour_lists_follow_a_shrinking_cell() -> None:
    """Atoms that do not move while the cell shrinks come within the cutoff of periodic
    images: the list must be rebuilt for the new cell (the skin alone does not see it)."""
    atoms = perturbed_argon(1, 2, 0.05, seed=3)[0]
    model = LennardJones(AR_EPSILON, AR_SIGMA, 6.0, skin=1.0)
    batch = Batch.from_atoms([atoms], dtype=DT)
    model(batch)
    for factor in (0.97, 0.94, 0.91):  # cell vectors 0.3-0.9 Å shorter, atoms still
        batch.cell = batch.cell * factor
        fresh = LennardJones(AR_EPSILON, AR_SIGMA, 6.0, skin=1.0)(batch)
        out = model(batch)
        assert torch.allclose(out["energy"], fresh["energy"], rtol=0, atol=1e-12)
        assert torch.allclose(out["forces"], fresh["forces"], rtol=0, atol=1e-12)
