"""A system's trajectory does not depend on the batch it runs in.

Random numbers are keyed by ``(seed, system_id, step, purpose, atom)``, integrator
state lives in per-system fields and every update is masked, so system ``k`` run
alone (``Batch.from_atoms(..., system_ids=[k])``) must follow the same trajectory as
inside a batch of 16 others of different sizes -- to the bit, positions and energies,
step by step: no product or reduction spans systems (#41; an energy that depended on
its batch mates would move no atom).  Per-system parameters are indexed by
``system_id`` and must follow the system too.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import alchemi_lit as al
from alchemi_lit.core.state import Batch
from alchemi_lit.engine.hooks import Callback
from alchemi_lit.integrators import (
    FIRE,
    FIRE2,
    Berendsen,
    Bussi,
    Langevin,
    NoseHooverChain,
    VelocityVerlet,
)
from alchemi_lit.models import LennardJones
from conftest import AR_EPSILON, AR_SIGMA, perturbed_argon

STEPS = 40
TARGET = 9  # the system_id followed


class Trajectory(Callback):
    """Positions of system ``sid`` after every step it took."""

    def __init__(self, sid: int) -> None:
        super().__init__()
        self.sid = sid
        self.frames: dict[int, np.ndarray] = {}

    def after_step(self, ctx) -> None:
        b = ctx.batch
        rows = (b.system_id == self.sid).nonzero().flatten().tolist()
        if rows:
            row = rows[0]
            t = int(b.total_steps[row])
            if t not in self.frames:
                lo, hi = b.ptr[row : row + 2].tolist()
                energy = b.energy[row].expand(1, 3)  # (stacked with the positions)
                self.frames[t] = torch.cat([b.positions[lo:hi], energy]).clone().numpy()

    def stacked(self) -> np.ndarray:
        """Positions and, as the last row, the energy, after each step."""
        return np.stack([self.frames[t] for t in sorted(self.frames)])


def mixed_systems() -> list:
    """17 systems of 32 and 108 atoms; the followed one is a 32-atom crystal."""
    small = perturbed_argon(12, 2, 0.1, seed=20)
    large = perturbed_argon(5, 3, 0.1, seed=21)
    systems = small[:4] + large[:2] + small[4:8] + large[2:] + small[8:]
    gen = np.random.default_rng(22)
    for k, atoms in enumerate(systems):
        if k % 3 == 1:  # some arrive moving, the others get Maxwell-Boltzmann velocities
            atoms.set_momenta(gen.normal(scale=0.3, size=(len(atoms), 3)))
    return systems


def run(systems, system_ids, stage, sid: int) -> np.ndarray:
    rec = Trajectory(sid)
    sim = al.Simulator(
        model=LennardJones(AR_EPSILON, AR_SIGMA, cutoff=6.5),
        stages=stage, precision="64", seed=3, sync_every=5, callbacks=[rec],
    )  # fmt: skip
    sim.run(Batch.from_atoms(systems, system_ids=system_ids))
    return rec.stacked()


N_SYS = 17
PER_SYSTEM_T = [30.0 + 10.0 * k for k in range(N_SYS)]

STAGES = {
    "verlet": lambda: VelocityVerlet(dt=5.0, steps=STEPS, temperature=60.0),
    "langevin": lambda: Langevin(dt=5.0, temperature=PER_SYSTEM_T, friction=0.02, steps=STEPS),
    "nose_hoover_chain": lambda: NoseHooverChain(
        dt=5.0, temperature=PER_SYSTEM_T, tdamp=50.0, steps=STEPS
    ),
    "bussi": lambda: Bussi(dt=5.0, temperature=PER_SYSTEM_T, taut=30.0, steps=STEPS),
    "berendsen": lambda: Berendsen(dt=5.0, temperature=90.0, taut=30.0, steps=STEPS),
    "fire": lambda: FIRE(fmax=1e-3, max_steps=STEPS),
    "fire2": lambda: FIRE2(fmax=1e-3, max_steps=STEPS),
    "fire_then_langevin": lambda: (
        FIRE(fmax=0.05, max_steps=15) + Langevin(dt=5.0, temperature=PER_SYSTEM_T, steps=20)
    ),
}


@pytest.mark.parametrize("name", list(STAGES))
def test_alone_equals_in_batch(name: str) -> None:
    systems = mixed_systems()
    ids = list(range(N_SYS))
    in_batch = run(systems, ids, STAGES[name](), TARGET)
    # the same system alone, then in a reversed batch (other rows, other neighbours)
    alone = run([systems[TARGET]], [TARGET], STAGES[name](), TARGET)
    reversed_batch = run(systems[::-1], ids[::-1], STAGES[name](), TARGET)
    assert in_batch.shape[0] >= 20
    assert alone.shape == in_batch.shape == reversed_batch.shape
    assert np.array_equal(alone, in_batch)
    assert np.array_equal(reversed_batch, in_batch)
    assert np.abs(in_batch[-1] - in_batch[0]).max() > 1e-3  # it did move


def test_system_id_not_row_keys_the_noise() -> None:
    """Two copies of one structure with different system_ids diverge under Langevin."""
    atoms = perturbed_argon(1, 2, 0.1, seed=23)[0]
    a = run([atoms, atoms.copy()], [4, 5], Langevin(dt=5.0, temperature=60.0, steps=20), 4)
    b = run([atoms, atoms.copy()], [4, 5], Langevin(dt=5.0, temperature=60.0, steps=20), 5)
    assert np.abs(a - b).max() > 1e-3
