"""BFGS, LBFGS and FIRE against ``ase.optimize.BFGS`` / ``LBFGS`` / ``FIRE``, step for
step, in float64.

Every system of a batch is relaxed again, alone, by ASE's optimizer -- on the atoms, or
on its own cell filter (:class:`~test_cell_filter.ExactFrechet` or ``UnitCellFilter``)
with that system's settings (pressure 0 or 1 GPa, hydrostatic, constant volume,
masked) -- and positions *and cells* must agree to 1e-8 Å after every one of >= 30
steps, on strained and sheared LJ argon and EMT Cu/Au/Pt crystals (triclinic
included).  Each comparison relaxes 4-6 systems 32 steps with both codes (~2-4 s).
"""

from __future__ import annotations

import inspect
import itertools

import numpy as np
import pytest
import torch
from ase.build import bulk
from ase.constraints import FixAtoms
from ase.filters import UnitCellFilter
from ase.optimize import BFGS as AseBFGS
from ase.optimize import FIRE as AseFIRE
from ase.optimize import LBFGS as AseLBFGS
from test_cell_filter import (
    SETTINGS,
    CachedUnitCellFilter,
    ExactFrechet,
    crystals,
    per_system_filter,
)
from test_md import Recorder

import alchemi_lit as al
from alchemi_lit import kernels
from alchemi_lit.core.errors import ConfigError
from alchemi_lit.data import SizeAwareSampler
from alchemi_lit.integrators import BFGS, FIRE, FIRE2, LBFGS
from alchemi_lit.models import EMT, LennardJones
from alchemi_lit.testing import accelerator_path
from conftest import AR_EPSILON, AR_SIGMA, AseEMT, AseLJ, perturbed_argon, strained

CUTOFF = 6.5  # Å: ASE's Lennard-Jones (neighbour list in Python) is most of these tests' time
STEPS = 32


def emt_crystals() -> list:
    """Strained, sheared and rattled fcc Cu, Au, Pt: cubic and primitive (triclinic) cells."""
    out = []
    for k, (symbol, cubic, repeat) in enumerate(
        [("Cu", True, 2), ("Au", False, 2), ("Pt", True, (2, 2, 1)), ("Cu", False, 3)]
    ):
        atoms = strained(bulk(symbol, cubic=cubic) * repeat, seed=20 + k, amount=0.04)
        atoms.rattle(0.05, seed=30 + k)
        out.append(atoms)
    return out


EMT_SETTINGS = [SETTINGS[1], SETTINGS[0], SETTINGS[4], SETTINGS[2]]
MODELS = {
    "lj": (
        crystals,
        SETTINGS,
        lambda: LennardJones(AR_EPSILON, AR_SIGMA, CUTOFF),
        lambda: AseLJ(epsilon=AR_EPSILON, sigma=AR_SIGMA, rc=CUTOFF),
    ),
    "emt": (emt_crystals, EMT_SETTINGS, EMT, AseEMT),
}
ASE_OPTIMIZERS = {BFGS: AseBFGS, LBFGS: AseLBFGS, FIRE: AseFIRE}


def run(systems, stage, model) -> tuple[al.Results, Recorder]:
    rec = Recorder(("positions", "cell"))
    sim = al.Simulator(model=model, stages=stage, precision="64", seed=0, callbacks=[rec])
    return sim.run(systems), rec


def compare_with_ase(systems, res, rec, make_opt, make_calc, make_target, fmax) -> float:
    """Relax each system with ASE (``make_target(k, atoms)``: the atoms or a filter) and
    check positions and cell after every step, step counts and convergence."""
    worst = 0.0
    for k, atoms in enumerate(systems):
        atoms = atoms.copy()
        atoms.calc = make_calc()
        opt = make_opt(make_target(k, atoms))
        frames = rec.data[k]
        ours = [frames[t] for t in sorted(frames)]
        n = 0
        for n, _ in enumerate(opt.irun(fmax=fmax, steps=STEPS)):
            if n >= 1:
                dev = max(
                    np.abs(atoms.positions - ours[n - 1]["positions"]).max(),
                    np.abs(atoms.cell.array - ours[n - 1]["cell"]).max(),
                )
                assert dev < 1e-8, (k, n, dev)
                worst = max(worst, dev)
        assert n == opt.nsteps == len(ours) == int(res.steps[k]) >= 30, (k, n, len(ours))
        assert bool(res.converged[k]) == (opt.nsteps < STEPS)
    return worst


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("optimizer", [BFGS, LBFGS])
def test_positions_only_match_ase(optimizer, model: str) -> None:
    make_systems, _, make_model, make_calc = MODELS[model]
    systems = make_systems()
    res, rec = run(systems, optimizer(fmax=1e-5, max_steps=STEPS), make_model())
    worst = compare_with_ase(
        systems, res, rec, lambda t: ASE_OPTIMIZERS[optimizer](t, logfile=None), make_calc,
        lambda k, a: a, 1e-5,
    )  # fmt: skip
    print(f"{optimizer.__name__}/{model}: worst deviation from ASE {worst:.1e} Å")


# Every optimizer, filter kind and model is in the fast tier; the rest of the matrix is slow.
_SLOW = pytest.mark.slow
CELL_CASES = [(BFGS, "frechet", "lj"), (LBFGS, "unit", "emt"), (FIRE, "frechet", "emt")]
CELL_CASES += [(FIRE, "unit", "lj")]
_SLOW_CASES = [(BFGS, "unit", "lj"), (LBFGS, "unit", "lj"), (BFGS, "frechet", "emt")]
_SLOW_CASES += [(FIRE, "frechet", "lj"), (FIRE, "unit", "emt")]
CELL_CASES += [pytest.param(*case, marks=_SLOW) for case in _SLOW_CASES]


@pytest.mark.parametrize(("optimizer", "kind", "model"), CELL_CASES)
def test_cell_filters_match_ase(optimizer, kind: str, model: str) -> None:
    """Per-system pressures (0, 1 GPa, -0.5 GPa), hydrostatic, constant-volume and masked
    cells in one batch, each against its own ASE filter."""
    make_systems, settings, make_model, make_calc = MODELS[model]
    systems = make_systems()
    stage = optimizer(fmax=1e-5, max_steps=STEPS, cell=per_system_filter(kind, settings))
    res, rec = run(systems, stage, make_model())
    ase_filter = ExactFrechet if kind == "frechet" else CachedUnitCellFilter
    worst = compare_with_ase(
        systems, res, rec, lambda t: ASE_OPTIMIZERS[optimizer](t, logfile=None), make_calc,
        lambda k, a: ase_filter(a, **settings[k]), 1e-5,
    )  # fmt: skip
    moved = [np.abs(r.cell.array - s.cell.array).max() for r, s in zip(res.to_atoms(), systems)]
    assert min(moved) > 1e-3  # every cell relaxed
    print(f"{optimizer.__name__}+{kind}/{model}: worst deviation from ASE {worst:.1e} Å")


@pytest.mark.parametrize("cell", [None, "frechet"])
def test_lbfgs_short_memory_and_damping_match_ase(cell) -> None:
    """memory=4: the ring of steps wraps around many times; damping scales each step."""
    systems = crystals()[3:]
    stage = LBFGS(fmax=1e-5, max_steps=STEPS, memory=4, damping=0.7, alpha=50.0, cell=cell)
    res, rec = run(systems, stage, LennardJones(AR_EPSILON, AR_SIGMA, CUTOFF))
    compare_with_ase(
        systems, res, rec, lambda t: AseLBFGS(t, logfile=None, memory=4, damping=0.7, alpha=50.0),
        MODELS["lj"][3], lambda k, a: a if cell is None else ExactFrechet(a), 1e-5,
    )  # fmt: skip


def test_lbfgs_wrapped_history_on_the_accelerator_path_matches_ase() -> None:
    """An accelerator's recursion runs over all ``memory`` slots, masked (no host read),
    where the CPU's runs over the longest history: with memory=3 the ring wraps within
    the 10 steps taken, and the accelerator's steps are still ASE's."""
    atoms = crystals()[4]  # 8 atoms, triclinic
    with accelerator_path():
        _, rec = run([atoms], LBFGS(fmax=1e-5, max_steps=10, memory=3), MODELS["lj"][2]())
    ours = [rec.data[0][t]["positions"] for t in sorted(rec.data[0])]
    atoms = atoms.copy()
    atoms.calc = MODELS["lj"][3]()
    n = 0
    for n, _ in enumerate(AseLBFGS(atoms, logfile=None, memory=3).irun(fmax=1e-5, steps=10)):
        if n >= 1:
            assert np.abs(atoms.positions - ours[n - 1]).max() < 1e-8, n
    assert n == len(ours) == 10


@pytest.mark.parametrize("optimizer", [BFGS, LBFGS, FIRE])
def test_fixed_atoms_follow_the_cell_as_in_ase(optimizer, monkeypatch) -> None:
    """FixAtoms under a cell filter: fixed atoms are carried by the cell (ASE's
    set_cell(scale_atoms=True)); also the torch path of every criterion."""
    monkeypatch.setattr(kernels, "ENABLED", False)
    systems = crystals()[:2]
    for atoms in systems:
        atoms.set_constraint(FixAtoms(indices=[0, 5, 9]))
    res, rec = run(
        systems, optimizer(fmax=1e-5, max_steps=STEPS, cell="frechet"), MODELS["lj"][2]()
    )
    compare_with_ase(
        systems, res, rec, lambda t: ASE_OPTIMIZERS[optimizer](t, logfile=None), MODELS["lj"][3],
        lambda k, a: ExactFrechet(a), 1e-5,
    )  # fmt: skip


def test_converged_systems_take_no_step_and_others_are_left_alone() -> None:
    """Convergence counts the cell forces: a perfect crystal whose only forces are on its
    cell converges at once below ``fmax`` as in ASE, and not above.  A stage's update
    leaves the systems of other stages bit-identical (the FIRE family's too: they step
    through their own code, :func:`~alchemi_lit.integrators.extended.inertial_step`)."""
    perfect = perturbed_argon(1, 2, 0.0)[0]
    a = perfect.copy()
    a.calc = AseLJ(epsilon=AR_EPSILON, sigma=AR_SIGMA, rc=CUTOFF)
    forces = UnitCellFilter(a).get_forces()
    assert np.abs(forces[:-3]).max() < 1e-12 < np.abs(forces[-3:]).max()  # only the cell
    cell_force = np.linalg.norm(forces, axis=1).max()
    for fmax in (1.01 * cell_force, 0.99 * cell_force):
        b = perfect.copy()
        b.calc = AseLJ(epsilon=AR_EPSILON, sigma=AR_SIGMA, rc=CUTOFF)
        ase = AseBFGS(UnitCellFilter(b), logfile=None)
        ase.run(fmax=fmax, steps=5)
        res, _ = run([perfect], BFGS(fmax=fmax, max_steps=5, cell="unit"), MODELS["lj"][2]())
        assert res.steps.tolist() == [ase.nsteps]
        assert (ase.nsteps == 0) == (fmax > cell_force)

    batch = al.Batch.from_atoms(crystals()[:2], dtype=torch.float64)
    stages = (BFGS(cell="frechet"), LBFGS(cell="frechet"), FIRE(cell="frechet"),
              FIRE2(cell="unit"))  # fmt: skip
    # system 1's reference: none, as a batch concatenated without the field leaves it, or
    # a cell stage's it left earlier (an active filter: an update that rewrote its
    # positions through the filter would change them at round-off)
    for stage, ref in itertools.product(stages, (0.0, 1.01)):
        b = batch.clone()
        out = LennardJones(AR_EPSILON, AR_SIGMA, CUTOFF)(b)
        b.forces, b.stress, b.energy = out["forces"], out["stress"], out["energy"]
        stage.setup(b, 0, "stage0")
        mask = torch.tensor([True, False])
        stage.init_systems(b, mask)
        b.cell_ref[1] = ref * b.cell[1]
        before = b.clone()
        stage.pre_update(b, mask)
        assert stage.criterion(b).tolist() == [False, False]
        assert torch.equal(b.positions[32:], before.positions[32:])
        assert torch.equal(b.cell[1], before.cell[1])
        assert not torch.equal(b.cell[0], before.cell[0])


def test_bfgs_refuses_what_does_not_fit() -> None:
    batch = al.Batch.from_atoms(crystals()[:2], dtype=torch.float64)
    with pytest.raises(ConfigError, match=r"max_atoms=16.*system 0.*LBFGS"):
        BFGS(max_atoms=16).setup(batch.clone(), 0, "stage0")
    with pytest.raises(ConfigError, match=r"need 0.00 GB > max_memory_gb=1e-06.*use LBFGS"):
        BFGS(max_atoms=32, max_memory_gb=1e-6).setup(batch.clone(), 0, "stage0")
    b = batch.clone()
    BFGS(max_atoms=64).setup(b, 0, "stage0")
    assert b.bfgs_hessian.shape == (64, 3, 3 * 64)
    # the budget is the Hessians' bytes: refused just below them, taken just above
    need = b.bfgs_hessian.numel() * b.bfgs_hessian.element_size() / 2**30
    with pytest.raises(ConfigError, match="max_memory_gb"):
        BFGS(max_atoms=64, max_memory_gb=0.99 * need).setup(batch.clone(), 0, "stage0")
    BFGS(max_atoms=64, max_memory_gb=1.01 * need).setup(batch.clone(), 0, "stage0")
    with pytest.raises(ConfigError, match="same max_atoms"):
        BFGS(max_atoms=32).setup(b, 0, "stage1")


def test_defaults_equal_ase() -> None:
    """BFGS's and LBFGS's defaults are ASE's: the step-for-step tests pass some of them
    and run fewer steps than LBFGS's memory holds, so they could not see it."""
    atoms = crystals()[0]
    bfgs, ase_bfgs = BFGS(), AseBFGS(atoms, logfile=None)
    assert (bfgs.maxstep, bfgs.alpha) == (ase_bfgs.maxstep, ase_bfgs.alpha)
    lbfgs, ase_lbfgs = LBFGS(), AseLBFGS(atoms, logfile=None)
    ase_args = inspect.signature(AseLBFGS).parameters
    assert (lbfgs.maxstep, lbfgs.memory, lbfgs.damping, lbfgs.alpha) == (
        ase_lbfgs.maxstep, *(ase_args[k].default for k in ("memory", "damping", "alpha")),
    )  # fmt: skip


REFILLED = [
    BFGS(fmax=1e-3, max_steps=25, cell="frechet"),
    LBFGS(fmax=1e-3, max_steps=25, memory=6, cell="unit"),
]


@pytest.mark.parametrize("stage", REFILLED, ids=repr)
def test_inflight_refills_equal_each_system_alone(stage) -> None:
    """Systems entering mid-run (refills) and leaving (compaction) carry their Hessian or
    history rows with them: each follows the path it follows alone."""
    systems = [*crystals(), *crystals()[:2]]
    _, rec = run(SizeAwareSampler(systems, max_atoms=72), stage, MODELS["lj"][2]())
    for k in (1, 5, 7):
        _, alone = run([systems[k]], stage, MODELS["lj"][2]())
        frames = alone.data[0]
        assert sorted(frames) == [t for t in sorted(rec.data[k]) if t > 0]  # (0: pending)
        for t, frame in frames.items():
            for key in ("positions", "cell"):
                assert np.abs(frame[key] - rec.data[k][t][key]).max() < 1e-10, (k, t, key)


def test_resume_from_checkpoint_is_bit_identical(tmp_path) -> None:
    """The optimizer state lives in batch fields: a run interrupted mid-relaxation and
    resumed from its checkpoint ends exactly as the uninterrupted one."""
    from alchemi_lit.callbacks import Checkpoint, HookStageEnum, LambdaCallback

    def make(where, extra=()):
        return al.Simulator(
            model=MODELS["lj"][2](),
            stages=BFGS(fmax=1e-3, max_steps=30, cell="frechet")
            + LBFGS(fmax=1e-4, max_steps=20, cell="unit"),
            callbacks=[Checkpoint(where, every=7), *extra],
            precision="64",
        )  # fmt: skip

    def sampler():
        return SizeAwareSampler(crystals(), max_atoms=80)

    ref = make(tmp_path / "a").run(sampler())

    def crash(ctx):
        if ctx.step == 24:
            raise RuntimeError("crash")

    with pytest.raises(RuntimeError, match="crash"):
        make(tmp_path / "b", [LambdaCallback(HookStageEnum.AFTER_STEP, crash)]).run(sampler())
    resumed = make(tmp_path / "b").run(sampler(), resume=str(tmp_path / "b"))
    assert ref.steps.tolist() == resumed.steps.tolist()
    for key in ("positions", "cell", "energy"):
        assert torch.equal(getattr(ref.batch, key), getattr(resumed.batch, key)), key
