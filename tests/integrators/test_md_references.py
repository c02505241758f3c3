"""MD integrators against references where the broad trajectory tests of ``test_md`` and
``test_npt`` look the same whichever way a detail goes: a plan of stages with different
time steps, Berendsen's momentum removal with unequal masses and a drifting system,
Nosé-Hoover chains of other Suzuki-Yoshida orders and their conserved energy, the
barostats' ``exprel`` at 0 and their refusal of slabs.

References: ASE's ``VelocityVerlet``, ``NVTBerendsen`` and ``NoseHooverChainNVT``
(trajectories in float64 to 1e-8 Å, as in ``test_md``), SciPy's ``exprel``, and
analytic conditions (the Suzuki-Yoshida weights).  Systems are small and runs short.
"""

from __future__ import annotations

import numpy as np
import pytest
from ase import units
from ase.md.nvtberendsen import NVTBerendsen
from ase.md.verlet import VelocityVerlet as AseVV
from test_md import ase_lj, max_deviation, moving_argon, simulate

from alchemi_lit.integrators import Berendsen, VelocityVerlet


def test_stages_with_different_time_steps_each_use_their_own(code_path) -> None:
    """``VelocityVerlet(dt=2) + VelocityVerlet(dt=5)`` follows ASE's velocity Verlet run
    three steps at 2 fs, then three at 5 fs.  Every built-in integrator kicks by ``dt/2``
    throughout a stage, so only a second stage with another ``dt`` shows whether the
    kept ``dt/m`` factors are keyed by the time step."""
    atoms = moving_argon(1, seed=8)[0]
    plan = VelocityVerlet(dt=2.0, steps=3) + VelocityVerlet(dt=5.0, steps=3)
    _, rec = simulate([atoms], plan)
    ours = rec.trajectory(0)
    assert len(ours) == 6
    ref = atoms.copy()
    ref.calc = ase_lj()
    assert max_deviation(AseVV(ref, timestep=2.0 * units.fs), ref, ours[:3]) < 1e-8
    assert max_deviation(AseVV(ref, timestep=5.0 * units.fs), ref, ours[3:]) < 1e-8


@pytest.mark.parametrize("fixcm", [True, False], ids=["fixcm", "no-fixcm"])
def test_berendsen_momentum_removal_follows_ase_with_unequal_masses(fixcm: bool, code_path) -> None:
    """A drifting system of two masses (every other atom 10 amu): with ``fixcm`` ASE
    removes the mean *momentum* ``sum(p)/N`` from every atom (not the centre-of-mass
    velocity, which differs when masses do), without it the drift stays.  Every other
    Berendsen run has one mass and no total momentum, where all three agree.  On both
    code paths (the CPU kernels' kicks, the accelerator's torch ones)."""
    atoms = moving_argon(1, temperature=60.0, seed=9)[0]
    masses = atoms.get_masses()
    masses[::2] = 10.0
    velocities = atoms.get_velocities() + np.array([2e-3, -1e-3, 5e-4])
    atoms.set_masses(masses)
    atoms.set_velocities(velocities)
    steps = 6
    stage = Berendsen(dt=4.0, temperature=90.0, taut=20.0, steps=steps, fixcm=fixcm)
    res, rec = simulate([atoms], stage)
    ref = atoms.copy()
    ref.calc = ase_lj()
    dyn = NVTBerendsen(ref, 4.0 * units.fs, temperature_K=90.0, taut=20.0 * units.fs,
                       fixcm=fixcm)  # fmt: skip
    assert max_deviation(dyn, ref, rec.trajectory(0)) < 1e-8
    assert np.abs(ref.get_velocities() - res.to_atoms()[0].get_velocities()).max() < 1e-8
