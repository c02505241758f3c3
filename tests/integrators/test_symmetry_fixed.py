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
from ase.constraints import FixAtoms, FixSymmetry
from symmetry_cases import fixed_cases
from test_quasi_newton import ASE_OPTIMIZERS, run
from test_symmetry import STEPS, compare_with_ase, keeps_operations

from alchemi_lit.integrators import BFGS, FIRE
from alchemi_lit.models import EMT


def fixed_of(atoms) -> np.ndarray:
    c = next(c for c in atoms.constraints if not isinstance(c, FixSymmetry))
    return np.asarray(c.index if isinstance(c, FixAtoms) else c.todict()["kwargs"]["a"])


@pytest.mark.parametrize(
    ("optimizer", "cell"), [(BFGS, "frechet"), (FIRE, "frechet"), (FIRE, None)]
)
def test_relaxation_with_fixed_orbits_matches_ase_step_for_step(optimizer, cell) -> None:
    systems = fixed_cases()
    res, rec = run(systems, optimizer(fmax=1e-5, max_steps=STEPS, cell=cell), EMT())
    make = ASE_OPTIMIZERS[optimizer]
    worst = compare_with_ase(systems, res, rec, lambda t: make(t, logfile=None), cell is not None,
                             least=10)  # fmt: skip
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
