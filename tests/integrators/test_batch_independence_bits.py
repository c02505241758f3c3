"""A system's trajectory is the same to the bit whatever shares its batch -- with every
matrix product rounding by its shape, on the CPU's code path and the accelerator's.

Issue #41: on an Intel AVX-512 processor MKL's kernels block a product by its whole
shape, so a per-system quantity computed by one product over the batch changed in its
last bits with its batch mates (a float32 stress, a pipeline's positions).  The
framework computes every per-system quantity from elementwise products and fixed-order
per-system sums, so equality holds by construction; :func:`shape_sensitive_blas` makes
any product that still spans systems show on this processor too.  Energies are compared
as well as positions: a planted dependence of each system's energy on its batch mates
(1e-6 of the batch's mean energy, say) changes no force, only the energy.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

import alchemi_lit as al
from alchemi_lit.core.state import Batch
from alchemi_lit.engine.hooks import Callback
from alchemi_lit.integrators import (
    BFGS,
    FIRE,
    FIRE2,
    LBFGS,
    MTKNPT,
    Bussi,
    CRescale,
    Langevin,
    NoseHooverChain,
    NPTLangevin,
    VelocityVerlet,
)  # fmt: skip
from alchemi_lit.models import LennardJones
from alchemi_lit.testing import accelerator_path, shape_sensitive_blas
from conftest import AR_EPSILON, AR_SIGMA, perturbed_argon

STEPS = 8
TARGET = 3  # the system_id followed


class Record(Callback):
    """Positions, cell and energy of system ``sid`` after every step it took."""

    def __init__(self, sid: int) -> None:
        super().__init__()
        self.sid = sid
        self.frames: dict[int, tuple[np.ndarray, ...]] = {}

    def after_step(self, ctx) -> None:
        b = ctx.batch
        rows = (b.system_id == self.sid).nonzero().flatten().tolist()
        if rows:
            row = rows[0]
            lo, hi = b.ptr[row : row + 2].tolist()
            frame = (b.positions[lo:hi], b.cell[row], b.energy[row : row + 1])
            self.frames[int(b.total_steps[row])] = tuple(t.clone().numpy() for t in frame)


def systems() -> list:
    """Four crystals of 32, 4, 48 and 32 atoms; the followed one (id 3) is last, so
    its atoms and edges sit behind every other system's in the arrays."""
    small = perturbed_argon(3, 2, 0.08, seed=30)
    large = perturbed_argon(1, (3, 2, 2), 0.08, seed=31)
    tiny = perturbed_argon(1, 1, 0.05, seed=32)
    return [small[0], tiny[0], large[0], small[1]]


TS = [60.0, 70.0, 80.0, 90.0]  # per system_id
STAGES = {
    "fire": lambda: FIRE(fmax=1e-4, max_steps=STEPS),
    "fire2": lambda: FIRE2(fmax=1e-4, max_steps=STEPS),
    "fire-cell": lambda: FIRE(fmax=1e-4, max_steps=STEPS, cell="frechet"),
    "bfgs": lambda: BFGS(fmax=1e-4, max_steps=STEPS),
    "bfgs-cell": lambda: BFGS(fmax=1e-4, max_steps=STEPS, cell="frechet"),
    "lbfgs-cell": lambda: LBFGS(fmax=1e-4, max_steps=STEPS, cell="unit"),
    "verlet": lambda: VelocityVerlet(dt=5.0, steps=STEPS, temperature=60.0),
    "langevin": lambda: Langevin(dt=5.0, temperature=TS, friction=0.02, steps=STEPS),
    "nose-hoover": lambda: NoseHooverChain(dt=5.0, temperature=TS, tdamp=50.0, steps=STEPS),
    "bussi": lambda: Bussi(dt=5.0, temperature=TS, taut=30.0, steps=STEPS),
    "mtk": lambda: MTKNPT(dt=5.0, temperature=TS, pressure_gpa=0.1, pdamp=300.0, steps=STEPS),
    "mtk-full": lambda: MTKNPT(
        dt=5.0, temperature=TS, pressure_gpa=0.1, pdamp=300.0, isotropic=False, steps=STEPS
    ),
    "c-rescale-full": lambda: CRescale(
        dt=5.0, temperature=TS, pressure_gpa=0.1, taup=200.0, isotropic=False, steps=STEPS
    ),
    "npt-langevin-full": lambda: NPTLangevin(
        dt=5.0, temperature=TS, pressure_gpa=0.1, pdamp=200.0, isotropic=False, steps=STEPS
    ),
    "fire-then-langevin": lambda: FIRE(fmax=0.05, max_steps=5) + Langevin(
        dt=5.0, temperature=TS, steps=STEPS
    ),
}


def trajectory(structures, ids, stage) -> list[tuple[np.ndarray, ...]]:
    rec = Record(TARGET)
    sim = al.Simulator(
        model=LennardJones(AR_EPSILON, AR_SIGMA, cutoff=6.0),
        stages=stage, precision="64", seed=5, sync_every=4, callbacks=[rec], stress=True,
    )  # fmt: skip
    sim.run(Batch.from_atoms(structures, system_ids=ids))
    return [rec.frames[t] for t in sorted(rec.frames)]


@pytest.mark.parametrize("code_path", ["cpu", "accelerator"])
@pytest.mark.parametrize("name", list(STAGES))
def test_alone_equals_in_any_batch_to_the_bit_with_any_blas(name: str, code_path: str) -> None:
    with contextlib.ExitStack() as stack:
        stack.enter_context(shape_sensitive_blas())
        if code_path == "accelerator":
            stack.enter_context(accelerator_path())
        every = systems()
        alone = trajectory([every[TARGET]], [TARGET], STAGES[name]())
        for mates in ([0, 1, 2], [1]):  # batches of other sizes, one with a system of its size
            got = trajectory([every[k] for k in mates] + [every[TARGET]], [*mates, TARGET],
                             STAGES[name]())  # fmt: skip
            assert len(got) == len(alone) >= STEPS - 2
            for step, (a, b) in enumerate(zip(alone, got)):
                for what, x, y in zip(("positions", "cell", "energy"), a, b):
                    assert np.array_equal(x, y), f"{what} at step {step} with mates {mates}"
    assert np.abs(alone[-1][0] - alone[0][0]).max() > 1e-4  # it did move
