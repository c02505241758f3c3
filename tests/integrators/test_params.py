"""Integrator parameters: text refused with the fix, values most likely given in another
unit reported once (``UnitWarning``) with the value most likely meant, sensible values
and the defaults silent."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from alchemi_lit.core.errors import ConfigError, UnitWarning
from alchemi_lit.integrators import (
    FIRE,
    FIRE2,
    MTKNPT,
    Berendsen,
    Bussi,
    CRescale,
    Langevin,
    NoseHooverChain,
    NPTLangevin,
    VelocityVerlet,
    params,
)
from alchemi_lit.models import LennardJones


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):
    """Each test starts as a fresh process: nothing reported yet."""
    monkeypatch.setattr(params, "_warned", set())


def unit_warnings(make) -> list[str]:
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        make()
    return [str(w.message) for w in record if issubclass(w.category, UnitWarning)]


# (call, the message's parameter and value, the value most likely meant and why)
CASES = {
    "dt in ps": (
        lambda: Langevin(dt=0.002),
        "Langevin: dt=0.002 fs",
        "did you mean 2 fs (0.002 ps)?",
    ),
    "dt in as": (
        lambda: VelocityVerlet(dt=500.0),
        "VelocityVerlet: dt=500 fs",
        "did you mean 0.5 fs (500 as)?",
    ),
    "FIRE's dt in ps": (lambda: FIRE(dt=0.001), "FIRE: dt=0.001 fs", "did you mean 1 fs"),
    "friction in 1/ps": (
        lambda: Langevin(friction=10.0),
        "Langevin: friction=10 1/fs",
        "did you mean 0.01 1/fs (10 1/ps)?",
    ),
    "friction too weak": (
        lambda: Langevin(friction=1e-6),
        "Langevin: friction=1e-06 1/fs",
        "did you mean 0.001 1/fs (a damping time of 1e+06 fs)?",
    ),
    "temperature": (
        lambda: Bussi(temperature=3e5),
        "Bussi: temperature=300000 K",
        "did you mean 300 K (300000 mK)?",
    ),
    "per-system temperature": (
        lambda: Berendsen(temperature=[300.0, 2e5]),
        "Berendsen: temperature=200000 K",
        "did you mean 200 K",
    ),
    "fmax in meV/Å": (
        lambda: FIRE2(fmax=50.0),
        "FIRE2: fmax=50 eV/Å",
        "did you mean 0.05 eV/Å (50 meV/Å)?",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_value_in_another_unit_is_reported_with_the_value_meant(case):
    make, given, meant = CASES[case]
    messages = unit_warnings(make)
    assert len(messages) == 1, messages
    assert given in messages[0] and meant in messages[0], messages[0]


def test_the_warning_points_at_the_callers_line_and_can_be_filtered():
    with pytest.warns(UnitWarning) as record:
        Langevin(dt=0.002)
    assert record[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnitWarning)
        with pytest.raises(UnitWarning, match=r"dt=0\.02 fs"):
            NoseHooverChain(dt=0.02)


def test_each_parameter_and_value_is_reported_once():
    assert len(unit_warnings(lambda: Langevin(dt=0.002))) == 1
    assert unit_warnings(lambda: Langevin(dt=0.002)) == []  # said already
    assert len(unit_warnings(lambda: Langevin(dt=0.003))) == 1  # another value
    assert len(unit_warnings(lambda: VelocityVerlet(dt=0.002))) == 1  # another integrator
    # NoseHooverChain checks its temperature > 0 on top of the common check: one warning
    assert len(unit_warnings(lambda: NoseHooverChain(temperature=2e5))) == 1


def test_defaults_and_sensible_values_are_silent():
    def make_all() -> None:
        for cls in (FIRE, FIRE2, VelocityVerlet, Langevin, NoseHooverChain, Berendsen, Bussi):
            cls()
        # the edges of the usual ranges, and values people use
        Langevin(dt=0.05, temperature=1e5, friction=1e-5)
        Langevin(dt=20.0, temperature=0.0, friction=1.0)
        Langevin(dt=[0.5, 2.0], temperature=[10.0, 3000.0], friction=[0.001, 0.1])
        FIRE(fmax=5.0, dt=0.5)
        FIRE2(fmax=1e-4)  # its dtmin default (0.02 fs) is not a time step

    assert unit_warnings(make_all) == []


def test_just_outside_the_usual_range_warns():
    assert len(unit_warnings(lambda: Langevin(dt=0.0499))) == 1
    assert len(unit_warnings(lambda: Langevin(dt=20.01))) == 1
    assert len(unit_warnings(lambda: Langevin(friction=1.01))) == 1
    assert len(unit_warnings(lambda: FIRE(fmax=5.01))) == 1


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: Langevin(temperature="300K"),
            r"Langevin: temperature must be a number in K .*got '300K'; write "
            r"temperature=300\.0 \(K is implied\)",
        ),
        (lambda: VelocityVerlet(dt="2 fs"), r"VelocityVerlet: dt must be .*write dt=2\.0"),
        (lambda: FIRE(fmax="0.05 eV/A"), r"FIRE: fmax must be a number in eV/Å.*fmax=0\.05"),
        (lambda: Bussi(taut="fast"), r"Bussi: taut must be a number .*write taut=<a number>"),
        (lambda: Langevin(friction=[0.01, "0.02/fs"]), r"friction=0\.02"),
        (lambda: FIRE(max_steps="1000 steps"), r"FIRE: max_steps .*integer >= 0"),
        (lambda: NoseHooverChain(chain_length=2.5), r"chain_length must be an integer >= 1"),
    ],
)
def test_text_and_non_integers_are_refused_with_the_fix(make, message):
    with pytest.raises(ConfigError, match=message):
        make()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: VelocityVerlet(dt=[1.0, 0.0]), r"VelocityVerlet: every dt \(fs\) must be > 0"),
        (lambda: Langevin(friction=[0.01, 0.0]), r"Langevin: every friction .*must be > 0"),
        (lambda: Berendsen(temperature=[300.0, -1.0]), r"Berendsen: every temperature .*>= 0"),
    ],
)
def test_one_value_per_system_is_held_to_the_bound_of_one_value(make, message):
    """A per-system list is checked element by element against the same bound as one
    value: ``dt=[1, 0]`` is refused as ``dt=0`` is.  A tensor path that let the bound
    itself through (``< 0`` for ``> 0``) built a stage with a zero time step; the tests
    refused zero only as a single number (test_bad_inputs' zero-dt)."""
    with pytest.raises(ConfigError, match=message):
        make()


def test_check_functions_are_public_and_clear():
    assert params.check_positive("Mine", "tau", 2, "fs") == 2.0
    assert params.check_range("Mine", "mix", 0.5, 0.0, 1.0) == 0.5
    with pytest.raises(ConfigError, match=r"Mine: mix must be in \[0\.0, 1\.0\], got 2"):
        params.check_range("Mine", "mix", 2, 0.0, 1.0)
    with pytest.raises(ConfigError, match=r"Mine: tau \(fs\) must be > 0\.0, got nan"):
        params.check_positive("Mine", "tau", float("nan"), "fs")
    assert params.check_count("Mine", "n", 3.0) == 3
    per_system = params.check_positive("Mine", "tau", np.array([1.0, 2.0]), "fs")
    assert per_system.dtype == torch.float64 and per_system.tolist() == [1.0, 2.0]


# (stage, time constant): every thermostat's and barostat's coupling time
TIME_CONSTANTS = [
    (NoseHooverChain, "tdamp"),
    (MTKNPT, "tdamp"),
    (MTKNPT, "pdamp"),
    (CRescale, "taut"),
    (CRescale, "taup"),
    (NPTLangevin, "pdamp"),
    (Bussi, "taut"),
    (Berendsen, "taut"),
]


@pytest.mark.parametrize(("cls", "name"), TIME_CONSTANTS)
def test_a_time_constant_shorter_than_two_steps_is_refused_naming_both(cls, name) -> None:
    """``NoseHooverChain(dt=5, tdamp=1)`` used to end at step 0 as non_finite, no hint."""
    owner = cls.__name__
    with pytest.raises(ConfigError, match=rf"{owner}: {name}=1 fs is shorter than 2 time steps "
                       rf"\(dt=5 fs\): .* give {name} >= 10 fs"):  # fmt: skip
        cls(dt=5.0, **{name: 1.0})
    with pytest.raises(ConfigError, match=rf"{name}=9\.9 fs .*\(dt=5 fs\)"):
        cls(dt=5.0, **{name: 9.9})  # (equal to dt: a chain goes non-finite too)
    with pytest.raises(ConfigError, match=rf"{name}=30 fs .*\(dt=20 fs\) for system_id 1"):
        cls(dt=[1.0, 20.0], **{name: 30.0})
    with pytest.raises(ConfigError, match=rf"{name}=3 fs .*\(dt=2 fs\) for system_id 2"):
        cls(dt=2.0, **{name: [100.0, 50.0, 3.0]})
    cls(dt=5.0, **{name: 10.0})  # two steps: accepted
    cls(dt=[1.0, 20.0], **{name: [100.0, 40.0]})


THERMOSTATS = (Langevin, Bussi, Berendsen, NoseHooverChain, MTKNPT, CRescale, NPTLangevin)


@pytest.mark.parametrize("cls", THERMOSTATS)
def test_one_temperature_zero_rule(cls) -> None:
    """0 K is a quench wherever the method is defined at 0 K; the methods whose masses
    are proportional to kT (Nosé-Hoover chains) refuse it, saying why and what to use.
    The docstring says which (CRescale and NPTLangevin used to refuse 0 K, no reason)."""
    doc = " ".join(cls.__doc__.split())
    if cls.no_zero_kelvin is None:
        assert cls(temperature=0.0).temperature == 0.0
        assert cls(temperature=[300.0, 0.0]).temperature.tolist() == [300.0, 0.0]
        assert "0 K" in doc and "quench" in doc, doc
    else:
        message = rf"{cls.__name__}: temperature must be > 0 K, got 0\.0: .*proportional to kT"
        with pytest.raises(ConfigError, match=message + r".*to quench to 0 K use Langevin"):
            cls(temperature=0.0)
        with pytest.raises(ConfigError, match=r"got \[300\.0, 0\.0\]: "):
            cls(temperature=[300.0, 0.0])
        assert "> 0" in doc and "kT" in doc, doc
    with pytest.raises(ConfigError, match="temperature"):
        cls(temperature=-1.0)
    refusing = {c.__name__ for c in THERMOSTATS if c.no_zero_kelvin is not None}
    assert refusing == {"NoseHooverChain", "MTKNPT"}


class NeverCalled(LennardJones):
    """LJ that fails a test if the run evaluates it: the check must come first."""

    def forward(self, batch, *args, **kwargs):
        raise AssertionError("the model ran before the per-system check")


@pytest.mark.parametrize(
    ("stage", "ids", "message"),
    [
        (Langevin(temperature=[300.0, 600.0]), [0, 1, 2], r"Langevin: temperature has 2 "
         r"value\(s\), one per system_id 0\.\.1 .*none for system_id 2; give one value per "
         r"system_id up to 2, or one for all"),
        (Bussi(taut=[100.0, 100.0, 100.0]), [3, 4, 5], r"Bussi: taut has 3 value\(s\).*indexed "
         r"by system_id, not by position.*none for system_id 3 \(and 2 more\)"),
        (NPTLangevin(friction=[0.01, 0.02]), [0, 1, 2], r"NPTLangevin: friction has 2 .*id 2"),
        (CRescale(compressibility=[0.3]), [0, 1], r"CRescale: compressibility has 1 .*id 1;"),
        (MTKNPT(pressure_gpa=[0.1, 0.2]), [0, 2, 1], r"MTKNPT: pressure_gpa has 2 .*id 2;"),
        (Langevin(dt=[1.0, 2.0]) + FIRE(), [0, 1, 2], r"Langevin: dt has 2 .*id 2;"),
    ],
)  # fmt: skip
def test_a_short_per_system_list_is_refused_before_step_0_naming_the_id(
    stage, ids: list[int], message: str
) -> None:
    """It used to be ``IndexError: index 2 is out of bounds for dimension 0 with size 2``
    from ops.py, mid-run (or after continuing from a store whose ids start past 0)."""
    from ase.build import bulk

    import alchemi_lit as al
    from alchemi_lit.data import SizeAwareSampler

    atoms = [bulk("Ar", "fcc", a=5.26, cubic=True) for _ in ids]
    sim = al.Simulator(model=NeverCalled(epsilon=0.0104, sigma=3.4, cutoff=6.0), stages=stage)
    with pytest.raises(ConfigError, match=message):
        sim.run(al.Batch.from_atoms(atoms, system_ids=ids))
    with pytest.raises(ConfigError, match=message):
        sim.run(SizeAwareSampler(atoms, max_atoms=100, system_ids=ids))


def test_the_unit_helpers_convert_as_ase_does():
    """``core.units``' public conversions (no integrator calls them: each converts with
    ``units.fs`` / ``GPa`` itself, so nothing else checks them): a rate in 1/fs is
    divided by ASE's fs, a time multiplied, pressures scaled by ASE's GPa and bar."""
    from ase import units as ase_units

    from alchemi_lit.core import units

    assert units.fs_to_internal(2.0) == 2.0 * ase_units.fs
    assert units.per_fs_to_internal(0.01) == 0.01 / ase_units.fs
    assert units.gpa_to_ev_per_a3(3.0) == 3.0 * ase_units.GPa
    assert units.ev_per_a3_to_gpa(units.gpa_to_ev_per_a3(3.0)) == pytest.approx(3.0, rel=1e-15)
    assert units.bar_to_ev_per_a3(1e4) == pytest.approx(units.gpa_to_ev_per_a3(1.0), rel=1e-15)
