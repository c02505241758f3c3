"""FIRE2 with a cell filter, and optimizers with cells in fused plans, against ASE in
float64, step for step.

FIRE with cells is checked with BFGS and LBFGS in ``test_quasi_newton.py``.  FIRE2 here
runs against ``ase.optimize.FIRE2`` on each system's own filter (ExactFrechet or
UnitCellFilter, per-system pressure, hydrostatic, constant-volume and mask settings):
positions and cells after every Euler step to 1e-8 Å, our step count being ASE's force
calls (a half step back is a step of its own, as ``test_optimizers.py`` explains).  A
fused ``LBFGS(cell=...) + FIRE(...)`` equals ASE's LBFGS on a filter followed by ASE's
FIRE on the atoms (or on a new filter, whose reference is the cell the first stage left).
"""

from __future__ import annotations

import numpy as np
import pytest
from ase.optimize import FIRE as AseFIRE
from ase.optimize import LBFGS as AseLBFGS
from ase.optimize.fire2 import FIRE2 as AseFIRE2
from test_cell_filter import CachedUnitCellFilter, ExactFrechet, per_system_filter
from test_md import Recorder
from test_quasi_newton import MODELS

import alchemi_lit as al
from alchemi_lit.core.errors import ConfigError
from alchemi_lit.integrators import FIRE, FIRE2, LBFGS, CellFilter

FIRE2_STEPS = 40


def run(systems, stage, model, fields=("positions", "cell")) -> tuple[al.Results, Recorder]:
    rec = Recorder(fields)
    sim = al.Simulator(model=model, stages=stage, precision="64", seed=0, callbacks=[rec])
    return sim.run(systems), rec


def counted(calc):
    """``calc`` counting its evaluations in ``calc.calls``."""
    calculate, calc.calls = calc.calculate, 0

    def counting(*args, **kwargs):
        calc.calls += 1
        return calculate(*args, **kwargs)

    calc.calculate = counting
    return calc


@pytest.mark.parametrize(
    ("kind", "model", "use_abc"),
    [("frechet", "lj", False), ("unit", "emt", False), ("frechet", "emt", True)],
)
def test_fire2_with_cell_filters_matches_ase(kind: str, model: str, use_abc: bool) -> None:
    make_systems, settings, make_model, make_calc = MODELS[model]
    systems = make_systems()
    stage = FIRE2(
        fmax=1e-5, max_steps=FIRE2_STEPS, use_abc=use_abc, n_min=2,
        cell=per_system_filter(kind, settings),
    )  # fmt: skip
    res, rec = run(systems, stage, make_model(), fields=("positions", "cell", "fire2_back"))
    ase_filter = ExactFrechet if kind == "frechet" else CachedUnitCellFilter
    backs = 0
    for k, atoms in enumerate(systems):
        atoms = atoms.copy()
        atoms.calc = counted(make_calc())
        frames = [rec.data[k][t] for t in sorted(rec.data[k])]
        euler = [f for f in frames if not f["fire2_back"]]
        backs += len(frames) - len(euler)
        opt = AseFIRE2(ase_filter(atoms, **settings[k]), logfile=None, use_abc=use_abc, Nmin=2)
        for n, _ in enumerate(opt.irun(fmax=1e-5, steps=len(euler))):
            if n >= 1:
                dev = max(
                    np.abs(atoms.positions - euler[n - 1]["positions"]).max(),
                    np.abs(atoms.cell.array - euler[n - 1]["cell"]).max(),
                )
                assert dev < 1e-8, (k, n, dev)
        # ASE's force calls: the first, one per Euler step and one per step back
        while frames and frames[-1]["fire2_back"]:  # (our run may end on a step back)
            frames.pop()
        assert atoms.calc.calls - 1 == len(frames), k
        assert int(res.steps[k]) == FIRE2_STEPS and not bool(res.converged[k])
    assert backs > 0  # the half steps back (cell rows included) were exercised


@pytest.mark.parametrize("second", ["positions", "unit"])
def test_fused_lbfgs_with_cell_then_fire_matches_ase(second: str) -> None:
    """LBFGS relaxes cell and atoms to 0.05 eV/Å, then FIRE (on the atoms, or on a fresh
    unit-cell filter whose reference is the cell LBFGS left) continues."""
    make_systems, _, make_model, make_calc = MODELS["lj"]
    systems = make_systems()[:4]
    cell = None if second == "positions" else "unit"
    plan = LBFGS(fmax=0.05, max_steps=60, cell="frechet") + FIRE(fmax=1e-4, max_steps=25, cell=cell)
    res, rec = run(systems, plan, make_model())
    for k, atoms in enumerate(systems):
        atoms = atoms.copy()
        atoms.calc = make_calc()
        ours = [rec.data[k][t] for t in sorted(rec.data[k])]
        done, opts = 0, []
        for stage, fmax, steps in ((0, 0.05, 60), (1, 1e-4, 25)):
            if stage == 0:
                opt = AseLBFGS(ExactFrechet(atoms), logfile=None)
            else:  # a filter made now: its reference is the cell LBFGS left
                opt = AseFIRE(atoms if cell is None else CachedUnitCellFilter(atoms), logfile=None)
            opts.append(opt)
            for n, _ in enumerate(opt.irun(fmax=fmax, steps=steps)):
                if n >= 1:
                    frame = ours[done + n - 1]
                    assert np.abs(atoms.positions - frame["positions"]).max() < 1e-8, (k, n)
                    assert np.abs(atoms.cell.array - frame["cell"]).max() < 1e-8, (k, n)
            done += opt.nsteps
        first, then = opts
        assert res.stage_steps[k].tolist() == [first.nsteps, then.nsteps]
        assert 0 < first.nsteps < 60 and then.nsteps > 0
        assert res.exit_reasons[k] == ("converged" if then.nsteps < 25 else "max_steps")


def test_fire_with_cell_refuses_mass_weighting_and_builds_from_yaml(tmp_path) -> None:
    from alchemi_lit.cli import CLI
    from alchemi_lit.cli.argv import split_argv
    from alchemi_lit.cli.build import build

    with pytest.raises(ConfigError, match=r"cell= needs mode='ase'"):
        FIRE(cell="frechet", mode="mass_weighted")
    relax = FIRE(fmax=0.02, max_steps=500, cell=CellFilter("frechet", scalar_pressure=0.0))
    assert relax.requires_stress and repr(relax) == "FIRE(fmax=0.02, max_steps=500, cell='frechet')"
    (tmp_path / "run.yaml").write_text(
        "simulator:\n"
        "  model: {class_path: lj-argon}\n"
        "  stages:\n"
        "    - class_path: FIRE\n"
        "      init_args: {fmax: 0.02, max_steps: 500,\n"
        "                  cell: {kind: frechet, scalar_pressure: 0.0}}\n"
        "    - {class_path: FIRE2, init_args: {fmax: 0.01, cell: unit, use_abc: true}}\n"
        "data: {structures: 'builtin:argon', builtin_args: {n_systems: 2, repeat: 2}}\n"
    )
    resolved = CLI().parse("validate", split_argv(["--config", str(tmp_path / "run.yaml")]))
    first, second = build(resolved).sim.plan.stages
    assert first.cell == CellFilter("frechet", scalar_pressure=0.0) and first.fmax == 0.02
    assert second.cell == CellFilter("unit") and second.use_abc
