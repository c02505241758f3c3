"""FixSymmetry against ASE's, in float64: the symmetrisation of forces and stress
against ``ase.spacegroup.symmetrize`` (to 1e-12), and BFGS / FIRE on a Frechet cell
filter step for step against ``ase.optimize`` on ``FrechetCellFilter(atoms)`` with
``FixSymmetry`` set (to 1e-8 Å), on perturbed high- and low-symmetry EMT crystals
(Fm-3m, P6_3/mmc, P4mm, R3m, Pm); a batch mixing constrained and free systems equals
each alone, bit for bit, on the CPU's and the accelerator's code path."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from ase.spacegroup.symmetrize import check_symmetry, symmetrize_rank1, symmetrize_rank2
from symmetry_cases import constrained, emt_cases, fixed_cases
from test_cell_filter import ExactFrechet
from test_quasi_newton import ASE_OPTIMIZERS, run

import alchemi_lit as al
from alchemi_lit import Batch
from alchemi_lit.core import symmetrize as symmetry
from alchemi_lit.integrators import BFGS, FIRE
from alchemi_lit.models import EMT, LennardJones
from alchemi_lit.testing import accelerator_path, emulated_cuda_graphs
from conftest import AseEMT


def test_symmetrisation_equals_ase() -> None:
    """Random forces and stresses of a batch of constrained and free systems."""
    systems = constrained(emt_cases())
    free = emt_cases()[2]
    free.rattle(0.02, seed=3)
    systems.insert(2, free)
    batch = Batch.from_atoms(systems)
    gen = torch.Generator().manual_seed(0)
    forces = torch.randn(batch.num_atoms, 3, generator=gen, dtype=torch.float64)
    stress = torch.randn(batch.num_systems, 3, 3, generator=gen, dtype=torch.float64)
    stress = stress + stress.transpose(1, 2)
    f_sym = symmetry.symmetrize_rank1(batch, forces, batch.cell).numpy()
    s_sym = symmetry.symmetrize_rank2(batch, stress, batch.cell).numpy()
    ptr = batch.ptr.tolist()
    for k, atoms in enumerate(systems):
        rows = slice(ptr[k], ptr[k + 1])
        if not atoms.constraints:
            assert np.array_equal(f_sym[rows], forces[rows].numpy())
            assert np.array_equal(s_sym[k], stress[k].numpy())
            continue
        c, lat = atoms.constraints[0], atoms.cell.array
        inv = atoms.cell.reciprocal().T
        ref1 = symmetrize_rank1(
            lat, inv, forces[rows].numpy(), c.rotations, c.translations, c.symm_map
        )
        ref2 = symmetrize_rank2(lat, inv, stress[k].numpy(), c.rotations)
        assert np.abs(f_sym[rows] - ref1).max() < 1e-12, k
        assert np.abs(s_sym[k] - ref2).max() < 1e-12, k


STEPS = 40


def compare_with_ase(systems, res, rec, make_opt, cell: bool = True, least: int = 4) -> float:
    """Each system relaxed by ASE (FixSymmetry set, ``ExactFrechet`` filter: ASE's up to
    a constant that cancels, see test_cell_filter); positions and cell after every step,
    step counts (at least ``least``) and convergence as ours; ``cell=False``: positions
    only, no filter."""
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
        assert n == opt.nsteps == len(ours[0]) == int(res.steps[k]) >= least, (k, n, len(ours[0]))
        assert bool(res.converged[k]) == (opt.nsteps < STEPS)
    return worst


@pytest.mark.parametrize("optimizer", [BFGS, pytest.param(FIRE, marks=pytest.mark.slow)])
def test_cell_relaxation_matches_ase_step_for_step(optimizer) -> None:
    systems = constrained(emt_cases())
    res, rec = run(systems, optimizer(fmax=1e-5, max_steps=STEPS, cell="frechet"), EMT())
    worst = compare_with_ase(
        systems, res, rec, lambda t: ASE_OPTIMIZERS[optimizer](t, logfile=None)
    )
    for before, after in zip(systems, res.to_atoms()):  # every operation kept
        assert keeps_operations(before, after), before.get_chemical_formula()
    print(f"{optimizer.__name__}+FixSymmetry: worst deviation from ASE {worst:.1e} Å")


def keeps_operations(before, after, symprec: float = 1e-3) -> bool:
    """Every rotation of ``before``'s group (at ``symprec``) is one of ``after``'s: the
    symmetry was kept (it may have risen: a lifted atom can relax back)."""
    first = check_symmetry(before, symprec)
    last = check_symmetry(after, symprec)
    have = {r.tobytes() for r in last.rotations.astype(np.int64)}
    return all(r.tobytes() in have for r in first.rotations.astype(np.int64))


def lj():
    """Lennard-Jones at copper's spacing (capturable as a CUDA graph; EMT reads the host)."""
    return LennardJones(epsilon=0.4, sigma=2.33, cutoff=5.0)


@pytest.mark.parametrize(
    "path", ["cpu", "accelerator", pytest.param("cuda_graphs", marks=pytest.mark.slow)]
)
@pytest.mark.parametrize("which", ["FixSymmetry", "FixSymmetry + fixed atoms"])
def test_mixed_batch_equals_each_alone(path: str, which: str) -> None:
    """Constrained and free systems in one batch; each relaxed alone gives the same bits
    and keeps its constraints."""
    cases = emt_cases()
    if which == "FixSymmetry":
        systems = [constrained(cases[:1])[0], cases[2], constrained(cases[3:4])[0]]
    else:
        systems = [fixed_cases()[0], cases[2]]
    systems[1].rattle(0.03, seed=5)

    alone = batch_equals_each_alone(
        systems, lambda: FIRE(fmax=1e-3, max_steps=5, cell="frechet"), path
    )
    assert [len(a.constraints) for a in alone] == [len(a.constraints) for a in systems]


def run_on_path(systems: list, stage: Any, path: str) -> Any:
    """``stage`` over ``systems`` on the CPU path, the accelerator path or replayed CUDA
    graphs (emulated on CPU; asserts the graphs were captured and replayed)."""
    if path == "cpu":
        return al.Simulator(model=lj(), stages=stage, precision="64", seed=0).run(systems)
    graphs = path == "cuda_graphs"
    with accelerator_path(), emulated_cuda_graphs():
        sim = al.Simulator(model=lj(), stages=stage, precision="64", seed=0, cuda_graphs=graphs)
        out = sim.run(systems)
    if graphs:
        assert sim.strategy.run_loop.step.replays >= 3  # captured, not run eagerly
    return out


def batch_equals_each_alone(systems: list, make_stage: Callable[[], Any], path: str) -> list:
    """Relaxed together, each system has the bits (positions, cell) and the constraints
    it has relaxed alone; returns the results alone (``Atoms``)."""
    together = run_on_path(systems, make_stage(), path).to_atoms()
    alone = [run_on_path([a], make_stage(), path).to_atoms()[0] for a in systems]
    for k, a in enumerate(alone):
        assert np.array_equal(a.positions, together[k].positions), k
        assert np.array_equal(a.cell.array, together[k].cell.array), k
        assert len(a.constraints) == len(together[k].constraints), k
    return alone


def test_replayed_steps_equal_eager_steps() -> None:
    """Fast sibling of the CUDA-graph case above: one constrained crystal, its steps
    replayed from an emulated capture equal the accelerator path's eager steps."""
    (atoms,) = constrained(emt_cases()[1:2])
    out = []
    for graphs in (False, True):
        with accelerator_path(), emulated_cuda_graphs():
            sim = al.Simulator(
                model=lj(), stages=FIRE(fmax=1e-3, max_steps=4, cell="frechet"),
                precision="64", seed=0, cuda_graphs=graphs,
            )  # fmt: skip
            out.append(sim.run([atoms]).to_atoms()[0])
        if graphs:
            assert sim.strategy.run_loop.step.replays >= 2
    assert np.array_equal(out[0].positions, out[1].positions)
    assert np.array_equal(out[0].cell.array, out[1].cell.array)


@pytest.mark.parametrize("which", ["FixSymmetry", "FixSymmetry + fixed atoms"])
def test_resume_from_checkpoint_is_bit_identical(tmp_path, which: str) -> None:
    """The operations live in batch fields: a constrained relaxation interrupted and
    resumed from its checkpoint ends exactly as the uninterrupted one (and keeps its
    constraints on the result Atoms)."""
    from alchemi_lit.callbacks import Checkpoint, HookStageEnum, LambdaCallback
    from alchemi_lit.data import SizeAwareSampler

    systems = constrained(emt_cases()[1:3]) if which == "FixSymmetry" else fixed_cases()[1:]

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
    # (fixed atoms come back as FixAtoms, an all-axes FixCartesian among them)
    want = ["FixSymmetry"] if which == "FixSymmetry" else ["FixAtoms", "FixSymmetry"]
    for atoms in resumed.to_atoms():
        assert sorted(type(c).__name__ for c in atoms.constraints) == want
