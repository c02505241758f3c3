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

from ase import units
from ase.md.verlet import VelocityVerlet as AseVV
from test_md import ase_lj, max_deviation, moving_argon, simulate

from alchemi_lit.integrators import VelocityVerlet


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
