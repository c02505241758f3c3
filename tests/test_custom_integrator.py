"""A user-written integrator in ~30 lines (README example) relaxes LJ argon below fmax.

The block between the ``README example`` markers is meant to be pasted verbatim.
"""

# --- README example: a custom optimizer ----------------------------------------------
from typing import ClassVar

import torch

from alchemi_lit import Simulator
from alchemi_lit.convergence import ForceMax
from alchemi_lit.integrators import FieldSpec, Integrator
from alchemi_lit.models import LennardJones


class SteepestDescent(Integrator):
    """Move atoms along the forces; per system, halve the step after an uphill move."""

    is_optimizer = True  # converges on a criterion, velocities zeroed on exit
    fields: ClassVar[dict[str, FieldSpec]] = {  # per-system state, carried by the batch
        "sd_alpha": FieldSpec("system", fill=1.0),  # Å²/eV: displacement per unit force
        "sd_last_energy": FieldSpec("system", fill=float("nan")),
    }

    def __init__(self, fmax: float = 0.05, maxstep: float = 0.1, max_steps: int = 500):
        super().__init__(max_steps)
        self.maxstep = maxstep
        self.criterion = ForceMax(fmax)  # checked by the framework after every step

    def pre_update(self, batch, mask):  # mask [B]: the systems in this stage
        uphill = batch.energy > batch.sd_last_energy  # NaN on the first step -> False
        alpha = torch.where(uphill, 0.5 * batch.sd_alpha, batch.sd_alpha)
        batch.sd_alpha = torch.where(mask, alpha, batch.sd_alpha)
        batch.sd_last_energy = torch.where(mask, batch.energy, batch.sd_last_energy)
        dr = batch.sd_alpha[batch.system_idx, None] * batch.forces
        dr = dr * (self.maxstep / dr.norm(dim=-1, keepdim=True).clamp_min(self.maxstep))
        moving = self.atom_mask(batch, mask)[:, None]  # free atoms of masked systems
        batch.positions = torch.where(moving, batch.positions + dr, batch.positions)


def relax_argon(structures, fmax=1e-3, **options):
    """Relax LJ argon structures (a list of ase.Atoms) with the optimizer above."""
    model = LennardJones(epsilon=0.0104, sigma=3.40, cutoff=8.5)
    sim = Simulator(model=model, stages=SteepestDescent(fmax=fmax, max_steps=300), **options)
    return sim.run(structures)  # Results: .converged, .energy, .steps, .to_atoms()


# --- end of README example -----------------------------------------------------------


def test_custom_steepest_descent_relaxes_lj_argon() -> None:
    import numpy as np
    from ase.build import bulk
    from ase.calculators.lj import LennardJones as AseLennardJones

    rng = np.random.default_rng(0)
    structures = []
    for repeat, noise in [(1, 0.1), (2, 0.05), (2, 0.15)]:
        atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(repeat)
        atoms.positions += rng.normal(scale=noise, size=atoms.positions.shape)
        structures.append(atoms)
    fmax = 1e-3
    res = relax_argon(structures, fmax=fmax, accelerator="cpu", sync_every=5)
    assert res.exit_reasons == ["converged"] * 3
    assert bool(res.converged.all())
    for before, after in zip(structures, res.to_atoms()):
        # check with ASE's own calculator, independent of our model
        before.calc = AseLennardJones(epsilon=0.0104, sigma=3.40, rc=8.5)
        after.calc = AseLennardJones(epsilon=0.0104, sigma=3.40, rc=8.5)
        assert np.abs(after.get_forces()).max() < fmax
        assert np.linalg.norm(after.get_forces(), axis=1).max() < fmax
        assert after.get_potential_energy() < before.get_potential_energy()
        np.testing.assert_allclose(after.get_velocities(), 0.0)
