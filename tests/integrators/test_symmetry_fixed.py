"""FixSymmetry with fixed atoms (#43) against ASE, in float64: BFGS and FIRE on a Frechet
cell filter, and FIRE on the atoms alone, step for step against ``ase.optimize`` with
``[FixSymmetry, FixAtoms]`` (or ``FixCartesian`` of x, y and z, either order of ASE's
list) to 1e-8 Å, on perturbed EMT crystals whose fixed atoms are whole symmetry orbits
(P4/mmm Cu4: atoms 0 and 3; R3m Cu3Au: the Au, or the three Cu).  Each keeps its space
group and its fixed atoms (where the cell carries them); a batch with a free system
equals each alone, bit for bit, on the CPU's, the accelerator's and the CUDA-graph
paths; a resumed run equals the uninterrupted one."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ase.constraints import FixAtoms, FixCartesian, FixSymmetry
from symmetry_cases import emt_cases
from test_cell_filter import ExactFrechet
from test_quasi_newton import ASE_OPTIMIZERS, run
from test_symmetry import keeps_operations, lj

import alchemi_lit as al
from alchemi_lit.integrators import BFGS, FIRE
from alchemi_lit.models import EMT
from alchemi_lit.testing import accelerator_path, emulated_cuda_graphs
from conftest import AseEMT

STEPS = 40


def cases() -> list:
    """Tetragonal Cu4 with atoms 0, 3 fixed, Cu3Au with the Au fixed (FixCartesian of
    x, y, z) and Cu3Au with its Cu fixed (FixAtoms listed first)."""
    tet, l12 = emt_cases()[2], emt_cases()[3]
    out = []
    for atoms, fix, first in (
        (tet, FixAtoms([0, 3]), False),
        (l12, FixCartesian([0], mask=(True, True, True)), False),
        (l12, FixAtoms([1, 2, 3]), True),
    ):
        atoms = atoms.copy()
        sym = FixSymmetry(atoms, symprec=1e-3)  # (refines the structure)
        atoms.set_constraint([fix, sym] if first else [sym, fix])
        out.append(atoms)
    return out


def fixed_of(atoms) -> np.ndarray:
    c = next(c for c in atoms.constraints if not isinstance(c, FixSymmetry))
    return np.asarray(c.index if isinstance(c, FixAtoms) else c.todict()["kwargs"]["a"])


def compare_with_ase(systems, res, rec, make_opt, cell: bool) -> float:
    """Each system relaxed by ASE (on ``ExactFrechet``, test_cell_filter's exact
    Frechet filter, when ``cell``); positions and cell after every step."""
    worst = 0.0
    for k, atoms in enumerate(systems):
        atoms = atoms.copy()
        atoms.calc = AseEMT()
        opt = make_opt(ExactFrechet(atoms) if cell else atoms)
        ours = rec.trajectory(k, "positions"), rec.trajectory(k, "cell")
        n = 0
        for n, _ in enumerate(opt.irun(fmax=1e-5, steps=STEPS)):
            if n >= 1:
                dev = max(
                    np.abs(atoms.positions - ours[0][n - 1]).max(),
                    np.abs(atoms.cell.array - ours[1][n - 1]).max(),
                )
                assert dev < 1e-8, (k, n, dev)
                worst = max(worst, dev)
        assert n == opt.nsteps == len(ours[0]) == int(res.steps[k]) >= 10, (k, n, len(ours[0]))
        assert bool(res.converged[k]) == (opt.nsteps < STEPS)
    return worst


@pytest.mark.parametrize(
    ("optimizer", "cell"), [(BFGS, "frechet"), (FIRE, "frechet"), (FIRE, None)]
)
def test_relaxation_with_fixed_orbits_matches_ase_step_for_step(optimizer, cell) -> None:
    systems = cases()
    res, rec = run(systems, optimizer(fmax=1e-5, max_steps=STEPS, cell=cell), EMT())
    make = ASE_OPTIMIZERS[optimizer]
    worst = compare_with_ase(systems, res, rec, lambda t: make(t, logfile=None), cell is not None)
    for before, after in zip(systems, res.to_atoms()):
        assert keeps_operations(before, after), before.get_chemical_formula()
        fixed = fixed_of(before)
        frac = before.cell.scaled_positions(before.positions)[fixed]  # (carried by the cell)
        assert np.abs(after.cell.scaled_positions(after.positions)[fixed] - frac).max() < 1e-13
        if cell is None:
            assert np.array_equal(after.positions[fixed], before.positions[fixed])
        assert np.abs(after.positions - before.positions).max() > 0.01  # (the others moved)
        assert [type(c).__name__ for c in after.constraints] == ["FixAtoms", "FixSymmetry"]
    print(f"{optimizer.__name__}+FixSymmetry+FixAtoms: worst deviation from ASE {worst:.1e} Å")


@pytest.mark.parametrize(
    "path", ["cpu", "accelerator", pytest.param("cuda_graphs", marks=pytest.mark.slow)]
)
def test_mixed_batch_equals_each_alone(path: str) -> None:
    """A FixSymmetry + FixAtoms system and a free one in one batch; each alone gives
    the same bits."""
    free = emt_cases()[2]
    free.rattle(0.03, seed=5)
    systems = [cases()[0], free]

    def go(s):
        graphs = path == "cuda_graphs"
        stage = FIRE(fmax=1e-3, max_steps=5, cell="frechet")
        if path == "cpu":
            return al.Simulator(model=lj(), stages=stage, precision="64", seed=0).run(s)
        with accelerator_path(), emulated_cuda_graphs():
            sim = al.Simulator(model=lj(), stages=stage, precision="64", seed=0,
                               cuda_graphs=graphs)  # fmt: skip
            out = sim.run(s)
        if graphs:
            assert sim.strategy.run_loop.step.replays >= 3  # captured, not run eagerly
        return out

    together = go(systems).to_atoms()
    for k, atoms in enumerate(systems):
        (alone,) = go([atoms]).to_atoms()
        assert np.array_equal(alone.positions, together[k].positions), k
        assert np.array_equal(alone.cell.array, together[k].cell.array), k
        assert len(alone.constraints) == len(atoms.constraints) == len(together[k].constraints)


def test_resume_from_checkpoint_is_bit_identical(tmp_path) -> None:
    """Interrupted and resumed from its checkpoint, a FixSymmetry + FixAtoms relaxation
    ends as the uninterrupted one and keeps both constraints."""
    from alchemi_lit.callbacks import Checkpoint, HookStageEnum, LambdaCallback
    from alchemi_lit.data import SizeAwareSampler

    systems = cases()[1:]

    def make(where, extra=()):
        return al.Simulator(
            model=EMT(), stages=FIRE(fmax=1e-4, max_steps=14, cell="frechet"),
            callbacks=[Checkpoint(where, every=4), *extra], precision="64",
        )  # fmt: skip

    def crash(ctx):
        if ctx.step == 9:
            raise RuntimeError("crash")

    ref = make(tmp_path / "a").run(SizeAwareSampler(systems, max_atoms=4))
    with pytest.raises(RuntimeError, match="crash"):
        make(tmp_path / "b", [LambdaCallback(HookStageEnum.AFTER_STEP, crash)]).run(
            SizeAwareSampler(systems, max_atoms=4)
        )
    resumed = make(tmp_path / "b").run(
        SizeAwareSampler(systems, max_atoms=4), resume=str(tmp_path / "b")
    )
    assert ref.steps.tolist() == resumed.steps.tolist()
    for key in ("positions", "cell", "energy"):
        assert torch.equal(getattr(ref.batch, key), getattr(resumed.batch, key)), key
    for atoms in resumed.to_atoms():
        assert [type(c).__name__ for c in atoms.constraints] == ["FixAtoms", "FixSymmetry"]
