"""FIRE and FIRE2 against ASE's optimizers, step for step, in float64.

Four perturbed LJ argon crystals and eight perturbed EMT clusters (Cu, Au, Pt) are
relaxed in one batch and, one by one, by ``ase.optimize.FIRE`` / ``FIRE2`` with the
same parameters.  Positions after every step must agree to 1e-8 Å, final energies
to 1e-8 eV and step counts exactly.

FIRE2 note: after an uphill step ASE steps back by half a step *and evaluates the
forces there* inside the same ``step()``; our loop makes one force call per step, so
the step back is a step of its own.  Our step count is therefore ASE's number of force
calls after the first (``nsteps`` plus uphill restarts), and the positions compared
are those after each Euler step (the ``fire2_back`` frames are skipped).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ase.cluster import Decahedron, Icosahedron, Octahedron
from ase.constraints import FixAtoms
from ase.optimize import FIRE as AseFIRE
from ase.optimize.fire2 import FIRE2 as AseFIRE2
from test_md import Recorder

import alchemi_lit as al
from alchemi_lit.core.units import fs
from alchemi_lit.integrators import FIRE, FIRE2
from alchemi_lit.models import EMT, LennardJones
from conftest import AR_EPSILON, AR_SIGMA, AseEMT, AseLJ, argon_bulk, perturbed_argon

CUTOFF = 8.5


class Counted:
    """Mixin counting an ASE calculator's force evaluations."""

    calls = 0

    def calculate(self, *args, **kwargs):
        self.calls += 1
        return super().calculate(*args, **kwargs)


class CountedLJ(Counted, AseLJ):
    pass


class CountedEMT(Counted, AseEMT):
    pass


def lj_systems() -> list:
    # four noisy copies of one crystal (eight took twice ASE's time to show the same:
    # 58-62 FIRE steps each, FIRE2 steps back with and without abc)
    return perturbed_argon(4, 2, 0.15, seed=10)


def emt_systems() -> list:
    gen = np.random.default_rng(11)
    shapes = [
        Icosahedron("Cu", 2),
        Icosahedron("Au", 2),
        Octahedron("Pt", 3),
        Decahedron("Cu", 2, 2, 0),
        Icosahedron("Pt", 2),
        Octahedron("Cu", 3),
        Decahedron("Au", 2, 2, 0),
        Octahedron("Au", 3),
    ]
    out = []
    for atoms in shapes:
        atoms = atoms.copy()
        atoms.set_cell(np.zeros((3, 3)))
        atoms.pbc = False
        atoms.positions += gen.normal(scale=0.08, size=atoms.positions.shape)
        out.append(atoms)
    return out


SETS = {
    "lj": (lj_systems, lambda: LennardJones(AR_EPSILON, AR_SIGMA, CUTOFF),
           lambda: CountedLJ(epsilon=AR_EPSILON, sigma=AR_SIGMA, rc=CUTOFF), 1e-3),
    "emt": (emt_systems, EMT, CountedEMT, 0.01),
}  # fmt: skip


def run(systems, stage, model, fields=("positions",)):
    rec = Recorder(fields)
    sim = al.Simulator(
        model=model, stages=stage, precision="64", seed=0, sync_every=1, callbacks=[rec]
    )
    return sim.run(systems), rec


def compare_with_ase(systems, res, rec, make_opt, make_calc, fmax, max_steps, back=False):
    """Run ASE on every system and check positions/energy/steps; return max deviation."""
    worst = 0.0
    for k, atoms in enumerate(systems):
        atoms = atoms.copy()
        atoms.calc = make_calc()
        frames = rec.data.get(k, {})
        ours = [frames[t]["positions"] for t in sorted(frames)]
        if back:  # skip the half-step-back frames (see module docstring)
            ours = [frames[t]["positions"] for t in sorted(frames) if not frames[t]["fire2_back"]]
        opt = make_opt(atoms)
        n = 0
        for n, _ in enumerate(opt.irun(fmax=fmax, steps=max_steps)):
            if n >= 1:
                dev = float(np.abs(atoms.positions - ours[n - 1]).max())
                assert dev < 1e-8, (k, n, dev)
                worst = max(worst, dev)
        assert n == opt.nsteps == len(ours)
        expected_steps = atoms.calc.calls - 1 if back else opt.nsteps
        assert int(res.steps[k]) == expected_steps
        assert abs(atoms.get_potential_energy() - float(res.energy[k])) < 1e-8
        assert bool(res.converged[k]) == (opt.nsteps < max_steps)
    return worst


@pytest.mark.parametrize("kind", list(SETS))
def test_fire_matches_ase_step_for_step(kind: str) -> None:
    make_systems, make_model, make_calc, fmax = SETS[kind]
    systems = make_systems()
    res, rec = run(systems, FIRE(fmax=fmax, max_steps=200), make_model())
    assert int(res.steps.min()) >= 50
    worst = compare_with_ase(
        systems, res, rec, lambda a: AseFIRE(a, logfile=None), make_calc, fmax, 200
    )
    print(f"FIRE/{kind}: max deviation from ASE {worst:.2e} Å, steps {res.steps.tolist()}")


@pytest.mark.parametrize("kind", list(SETS))
@pytest.mark.parametrize("use_abc", [False, True])
def test_fire2_matches_ase_step_for_step(kind: str, use_abc: bool) -> None:
    make_systems, make_model, make_calc, fmax = SETS[kind]
    systems = make_systems()
    stage = FIRE2(fmax=fmax, max_steps=200, use_abc=use_abc)
    res, rec = run(systems, stage, make_model(), ("positions", "fire2_back"))
    assert all(res.converged.tolist())
    worst = compare_with_ase(
        systems, res, rec,
        lambda a: AseFIRE2(a, logfile=None, use_abc=use_abc), make_calc, fmax, 200, back=True,
    )  # fmt: skip
    backs = sum(bool(f["fire2_back"]) for frames in rec.data.values() for f in frames.values())
    assert backs > 0  # the half-step-back path was exercised
    print(f"FIRE2/{kind}/abc={use_abc}: max deviation {worst:.2e} Å, {backs} steps back")


def test_fire2_time_step_bounds_match_ase() -> None:
    """FIRE2 between tight bounds (dt in [0.06, 0.12] ASE time units, n_min=2) against
    ASE's: both bounds bind.  With the defaults (dtmin 0.002, n_min 20) the runs above
    neither halve dt five times in a row nor grow it to dtmax, so never read them."""
    systems = emt_systems()[:1]  # a 13-atom Cu icosahedron: 24 steps, 3 of them back
    dtmin, dtmax = 0.06, 0.12
    stage = FIRE2(fmax=0.05, max_steps=200, dtmin=dtmin / fs, dtmax=dtmax / fs, n_min=2)
    res, rec = run(systems, stage, EMT(), ("positions", "fire2_back", "fire2_dt"))
    compare_with_ase(
        systems, res, rec, lambda a: AseFIRE2(a, logfile=None, dtmin=dtmin, dtmax=dtmax, Nmin=2),
        CountedEMT, 0.05, 200, back=True,
    )  # fmt: skip
    dts = np.array([f["fire2_dt"] for frames in rec.data.values() for f in frames.values()])
    assert np.isclose(dts.min(), dtmin, rtol=1e-12) and np.isclose(dts.max(), dtmax, rtol=1e-12)


@pytest.mark.parametrize("kind", list(SETS))
def test_fire_mass_weighted_converges(kind: str) -> None:
    make_systems, make_model, _, fmax = SETS[kind]
    res, _ = run(
        make_systems(), FIRE(fmax=fmax, max_steps=1000, mode="mass_weighted"), make_model()
    )
    assert all(res.converged.tolist())
    for atoms in res.to_atoms():
        assert np.linalg.norm(atoms.get_forces(), axis=1).max() < fmax
        assert atoms.info["exit_reason"] == "converged"


@pytest.mark.parametrize("stage", [FIRE(fmax=0.05), FIRE2(fmax=0.05)], ids=repr)
def test_converged_at_start_takes_no_step(stage) -> None:
    perfect = argon_bulk(2)  # forces vanish by symmetry
    ase_atoms = perfect.copy()
    ase_atoms.calc = AseLJ(epsilon=AR_EPSILON, sigma=AR_SIGMA, rc=CUTOFF)
    ase_opt = (AseFIRE if isinstance(stage, FIRE) else AseFIRE2)(ase_atoms, logfile=None)
    assert ase_opt.run(fmax=0.05)
    assert ase_opt.nsteps == 0
    moved = perturbed_argon(1, 2, 0.15, seed=3)[0]
    res, _ = run([perfect, moved], stage, LennardJones(AR_EPSILON, AR_SIGMA, CUTOFF))
    assert res.steps.tolist()[0] == 0
    assert int(res.steps[1]) > 0
    out = res.to_atoms()[0]
    assert out.info["converged"] and out.info["exit_reason"] == "converged"
    assert out.info["steps"] == 0
    assert np.array_equal(out.positions, perfect.positions)


@pytest.mark.parametrize("stage", [FIRE(fmax=1e-4, max_steps=15), FIRE2(fmax=1e-4, max_steps=15)])
def test_budget_exhausted_is_reported_not_converged(stage) -> None:
    res, _ = run(perturbed_argon(3, 2, 0.15, seed=4), stage, LennardJones(AR_EPSILON, AR_SIGMA))
    assert res.steps.tolist() == [15, 15, 15]
    assert not any(res.converged.tolist())
    for atoms in res.to_atoms():
        assert atoms.info["exit_reason"] == "max_steps"
        assert atoms.info["converged"] is False
        assert not np.any(atoms.get_velocities())  # optimizers leave systems at rest


def test_fire2_keeps_fixed_atoms_in_place() -> None:
    atoms = perturbed_argon(1, 2, 0.15, seed=5)[0]
    atoms.set_constraint(FixAtoms(indices=[1, 2, 30]))
    res, _ = run([atoms], FIRE2(fmax=0.01, max_steps=300), LennardJones(AR_EPSILON, AR_SIGMA))
    out = res.to_atoms()[0]
    assert out.info["converged"]
    assert np.array_equal(out.positions[[1, 2, 30]], atoms.positions[[1, 2, 30]])


def test_fire2_state_is_per_system_and_masked() -> None:
    """A FIRE2 stage next to another stage leaves the other systems bit-identical."""
    from alchemi_lit.core.state import Batch

    batch = Batch.from_atoms(perturbed_argon(2, 2, 0.15, seed=6))
    stage = FIRE2()
    stage.setup(batch, 0, "stage0")
    mask = torch.tensor([True, False])
    stage.init_systems(batch, mask)
    batch.forces = torch.randn_like(batch.positions)
    before = batch.clone()
    stage.pre_update(batch, mask)
    assert torch.equal(batch.positions[32:], before.positions[32:])
    assert torch.equal(batch.velocities[32:], before.velocities[32:])
    assert not torch.equal(batch.positions[:32], before.positions[:32])


def test_fire_starts_at_rest_whatever_the_atoms_momenta() -> None:
    """ASE's FIRE starts from zero velocities and ignores the atoms' momenta: so must
    ours (a structure arriving from MD carries some; the systems above carried none)."""
    systems = emt_systems()[:1]
    systems[0].set_momenta(np.random.default_rng(12).normal(scale=0.3, size=(13, 3)))
    res, rec = run(systems, FIRE(fmax=1e-4, max_steps=8), EMT())
    compare_with_ase(systems, res, rec, lambda a: AseFIRE(a, logfile=None), CountedEMT, 1e-4, 8)


def test_fire2_does_not_converge_at_a_half_step_back() -> None:
    """ASE tests convergence after its Euler step, never at the backed-off positions it
    evaluates in between: a system whose forces vanish there is not converged yet.  (No
    run above ends on a step back, so none saw a convergence test there.)"""
    from alchemi_lit.core.state import Batch

    batch = Batch.from_atoms([argon_bulk(1), argon_bulk(1)], dtype=torch.float64)
    stage = FIRE2(fmax=0.05)
    stage.setup(batch, 0, "stage0")
    batch.forces = torch.zeros_like(batch.positions)
    batch.fire2_back = torch.tensor([True, False])
    assert stage.converged(batch).tolist() == [False, True]


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"fmax": 0.0}, "fmax"),
        ({"dt": -0.1}, "dt"),
        ({"maxstep": 0.0}, "maxstep"),
        ({"dtmax": 0.0}, "dtmax"),
        ({"dtmin": -1.0}, "dtmin"),
        ({"dtmin": 20.0, "dtmax": 10.0}, "dtmin"),
        ({"n_min": -1}, "n_min"),
        ({"finc": 0.5}, "finc"),
        ({"fdec": 1.5}, "fdec"),
        ({"astart": 0.0}, "astart"),
        ({"fa": -0.1}, "fa"),
        ({"max_steps": -1}, "step"),
    ],
)
def test_fire2_parameter_validation(kwargs: dict, word: str) -> None:
    with pytest.raises(ValueError, match=word):
        FIRE2(**kwargs)


def test_fire2_defaults_equal_ase() -> None:
    from ase import units

    opt = FIRE2()
    ase_opt = AseFIRE2(argon_bulk(1), logfile=None)
    assert opt.dt0 == pytest.approx(ase_opt.dt)
    assert opt.dtmax == pytest.approx(ase_opt.dtmax)
    assert opt.dtmin == pytest.approx(ase_opt.dtmin)
    assert (opt.maxstep, opt.n_min, opt.finc, opt.fdec, opt.astart, opt.fa) == (
        ase_opt.maxstep, ase_opt.Nmin, ase_opt.finc, ase_opt.fdec, ase_opt.astart, ase_opt.fa,
    )  # fmt: skip
    assert opt.dt0 / units.fs == pytest.approx(0.1 / units.fs)
    assert repr(FIRE2(fmax=0.02, max_steps=10)) == "FIRE2(fmax=0.02, max_steps=10)"
