"""Compiled CPU kernels (``alchemi_lit.kernels``) against the torch path they replace.

Every kernel is a CPU fast path of an update the torch path also performs (on
accelerators, without numba, or with ``ALCHEMI_LIT_CPU_KERNELS=0``).  Each test runs
the same update both ways on the same state, covering every branch (systems outside
the stage, fixed atoms, first steps, uphill and downhill FIRE steps, clamped steps),
and requires the same decisions exactly and the same values to rounding.  The Philox
words are integers: bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ase.constraints import FixAtoms

from alchemi_lit import kernels
from alchemi_lit.callbacks import nan_guard
from alchemi_lit.core import random as rng
from alchemi_lit.core.state import Batch
from alchemi_lit.integrators import (
    FIRE,
    FIRE2,
    Berendsen,
    Bussi,
    Langevin,
    NoseHooverChain,
    VelocityVerlet,
)
from alchemi_lit.integrators.convergence import ForceMax
from conftest import assert_conditioned_close, fire2_bias_gain, perturbed_argon

pytest.importorskip("numba")


def random_batch(dtype: torch.dtype, seed: int = 0) -> Batch:
    """Six small argon systems of different sizes, two with fixed atoms, random
    velocities and forces (a few large enough to trip FIRE's step-length control)."""
    systems = [a[: 20 + 5 * i] for i, a in enumerate(perturbed_argon(6, seed=seed))]
    systems[1].set_constraint(FixAtoms(indices=[0, 3, 5]))
    systems[4].set_constraint(FixAtoms(indices=[1]))
    batch = Batch.from_atoms(systems, dtype=dtype)
    g = torch.Generator().manual_seed(seed)
    batch.velocities = torch.randn(batch.positions.shape, generator=g, dtype=dtype) * 0.05
    batch.forces = torch.randn(batch.positions.shape, generator=g, dtype=dtype)
    batch.forces[batch.atom_mask(torch.tensor([0, 0, 1, 0, 0, 0], dtype=torch.bool))] *= 40.0
    batch.velocities[batch.fixed] = 0.0
    batch.forces[batch.fixed] = 0.0
    batch.energy = torch.zeros(6, dtype=dtype)
    return batch


def both_ways(monkeypatch, batch: Batch, update) -> tuple[Batch, Batch]:
    """``update`` applied to two copies of ``batch``: compiled kernels, then torch."""
    compiled, plain = batch.clone(), batch.clone()
    assert kernels.usable(batch.positions)
    loaded, load = [], kernels.load
    monkeypatch.setattr(kernels, "load", lambda name: loaded.append(name) or load(name))
    update(compiled)
    assert loaded, "no compiled kernel ran: are the primitives' backends registered?"
    monkeypatch.setattr(kernels, "ENABLED", False)
    assert not kernels.usable(batch.positions)
    loaded.clear()
    update(plain)
    assert not loaded, f"kernels {loaded} ran with ALCHEMI_LIT_CPU_KERNELS off"
    return compiled, plain


def assert_close_fields(
    a: Batch, b: Batch, names: tuple[str, ...], gain: torch.Tensor | float = 0.0
) -> None:
    """The compiled and the torch path's fields agree to rounding as the update carries
    it (:func:`conftest.assert_conditioned_close`): the per-system ``gain`` says how
    much the update amplifies a one-ulp difference of numba's scalar libm against
    NumPy's SIMD functions (0: arithmetic and sqrt only), and a per-atom value is held
    to its system's largest one, the size of the terms it is a sum of
    (``c1 v + sigma xi``, ``cv v + cf F`` can cancel).  Decisions exactly."""
    system_of = a.system_idx
    for name in names:
        x, y = getattr(a, name), getattr(b, name)
        per_atom = x.shape[0] == a.num_atoms and a.num_atoms != a.num_systems
        g = torch.as_tensor(gain, dtype=torch.float64).expand(a.num_systems)
        scale = None
        if x.is_floating_point():
            size = x.detach().double().abs().reshape(x.shape[0], -1).amax(1)
            if per_atom:
                size = torch.zeros(a.num_systems, dtype=torch.float64).scatter_reduce(
                    0, system_of, size, "amax")
                size, g = size[system_of], g[system_of]
            shape = (-1,) + (1,) * (x.dim() - 1)
            scale, g = size.reshape(shape), g.reshape(shape)
        assert_conditioned_close(x, y, g, scale=scale, msg=name)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("mode", ["ase", "mass_weighted"])
def test_fire_kernel_equals_torch_path(monkeypatch, dtype, mode):
    batch = random_batch(dtype)
    stage = FIRE(fmax=0.01, n_min=1, maxstep=0.05, mode=mode)
    stage.setup(batch, seed=0, prefix="s0")
    stage.init_systems(batch, torch.ones(6, dtype=torch.bool))
    batch.velocities = random_batch(dtype, seed=1).velocities  # FIRE zeroed them
    batch.velocities[batch.fixed] = 0.0
    # first step, downhill past n_min (dt grows, alpha shrinks), outside the stage
    batch.step = torch.tensor([0, 3, 3, 3, 3, 3])
    batch.fire_n = torch.tensor([0, 4, 0, 4, 4, 4])
    mask = torch.tensor([1, 1, 1, 1, 1, 0], dtype=torch.bool)
    batch.velocities[batch.atom_mask(torch.tensor([0, 0, 0, 1, 0, 0], dtype=torch.bool))] *= -1
    compiled, plain = both_ways(monkeypatch, batch, lambda b: stage.pre_update(b, mask))
    fields = ("positions", "velocities", "fire_dt", "fire_alpha", "fire_n")
    assert_close_fields(compiled, plain, fields)
    # every branch was taken: some systems moved, the one outside did not, fixed atoms stay
    moved = (compiled.positions != batch.positions).any(-1)
    assert not moved[batch.fixed].any() and moved[~batch.fixed & batch.atom_mask(mask)].all()
    assert torch.equal(
        compiled.positions[~batch.atom_mask(mask)], batch.positions[~batch.atom_mask(mask)]
    )
    assert len(set(compiled.fire_n.tolist())) > 2


@pytest.mark.parametrize("use_abc", [False, True])
def test_fire2_kernel_equals_torch_path(monkeypatch, use_abc):
    batch = random_batch(torch.float64)
    stage = FIRE2(n_min=1, maxstep=0.05, use_abc=use_abc)
    stage.setup(batch, seed=0, prefix="s0")
    stage.init_systems(batch, torch.ones(6, dtype=torch.bool))
    batch.velocities = random_batch(torch.float64, seed=1).velocities
    batch.velocities[batch.fixed] = 0.0
    batch.step = torch.tensor([0, 3, 3, 3, 3, 3])  # first step; uphill, back, downhill
    batch.fire2_n = torch.tensor([0, 4, 0, 4, 4, 4])
    batch.fire2_back = torch.tensor([0, 0, 0, 0, 1, 0], dtype=torch.bool)
    batch.velocities[batch.atom_mask(torch.tensor([0, 0, 0, 1, 0, 0], dtype=torch.bool))] *= -1
    mask = torch.tensor([1, 1, 1, 1, 1, 0], dtype=torch.bool)
    # FIRE2 starts at alpha 0.25, where the bias correction is tame; after many downhill
    # steps alpha is small and it amplifies pow's last ulp a thousandfold
    batch.fire2_alpha = torch.tensor([0.25, 2e-4, 0.25, 1e-4, 0.25, 3e-4], dtype=batch.dtype)
    compiled, plain = both_ways(monkeypatch, batch, lambda b: stage.pre_update(b, mask))
    fields = ("positions", "velocities", "fire2_dt", "fire2_alpha", "fire2_n", "fire2_back")
    gain = fire2_bias_gain(compiled.fire2_alpha, compiled.fire2_n) if use_abc else 0.0
    assert_close_fields(compiled, plain, fields, gain)
    assert compiled.fire2_back.any() and len(set(compiled.fire2_n.tolist())) > 2


def test_fire_kernel_clamps_the_step_as_the_torch_path(monkeypatch):
    batch = random_batch(torch.float64)
    batch.forces = batch.forces * 1e3  # every system's step is clamped to maxstep
    for mode in ("ase", "mass_weighted"):
        stage = FIRE(maxstep=0.01, mode=mode)
        stage.setup(batch, seed=0, prefix="s0")
        stage.init_systems(batch, torch.ones(6, dtype=torch.bool))
        mask = torch.ones(6, dtype=torch.bool)
        compiled, plain = both_ways(
            monkeypatch, batch, lambda b, s=stage, m=mask: s.pre_update(b, m)
        )
        monkeypatch.setattr(kernels, "ENABLED", True)
        assert_close_fields(compiled, plain, ("positions", "velocities", "fire_dt"))
        step = (compiled.positions - batch.positions).norm(dim=-1)
        assert step.max() <= 0.01 * (1 + 1e-12)


MD_CASES = {
    "langevin": lambda: Langevin(dt=2.0, temperature=300.0, friction=0.05),
    "langevin per-system": lambda: Langevin(
        dt=2.0, temperature=[100.0, 200.0, 300.0, 400.0, 500.0, 600.0], friction=0.05
    ),
    "velocity verlet": lambda: VelocityVerlet(dt=1.0),
    "bussi": lambda: Bussi(dt=1.0, temperature=300.0),
    "berendsen": lambda: Berendsen(dt=1.0, temperature=300.0),  # kicks an atom mask
    "nose-hoover chain": lambda: NoseHooverChain(
        dt=1.0, temperature=[100.0, 200.0, 300.0, 400.0, 500.0, 600.0], tdamp=20.0
    ),
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", list(MD_CASES))
def test_md_step_equals_torch_path(monkeypatch, dtype, case):
    """Langevin's compiled half step and the compiled kicks (every MD integrator)."""
    batch = random_batch(dtype)
    integrator = MD_CASES[case]()
    integrator.setup(batch, seed=7, prefix="s0")
    mask = torch.tensor([1, 1, 0, 1, 1, 1], dtype=torch.bool)

    def step(b: Batch) -> None:
        integrator.pre_update(b, mask)
        integrator.post_update(b, mask)

    compiled, plain = both_ways(monkeypatch, batch, step)
    chain = tuple(integrator.fields)  # the chain's eta and p_eta (Nosé-Hoover)
    assert_close_fields(compiled, plain, ("positions", "velocities", *chain))
    still = ~batch.atom_mask(mask) | batch.fixed
    for name in ("positions", "velocities"):
        new, old = getattr(compiled, name), getattr(batch, name)
        assert torch.equal(new[still], old[still]) and (new[~still] != old[~still]).any(-1).all()


@pytest.mark.parametrize(
    "make",
    [
        lambda: Langevin(dt=2.0, temperature=300.0),
        VelocityVerlet,
        lambda: Bussi(dt=2.0),
        lambda: NoseHooverChain(dt=1.0, tdamp=100.0),
    ],
)
def test_kept_step_constants_follow_parameters_and_masses(monkeypatch, make):
    """The compiled MD steps keep dt/2m, the noise amplitude and the loop arrays from
    step to step; a new time step, temperature, friction or coupling time, masses
    written in place or replaced, newly fixed atoms, or a new layout are used at once,
    as the torch path uses them."""
    from alchemi_lit.core.units import fs

    batch = random_batch(torch.float64)
    mask = torch.ones(6, dtype=torch.bool)
    changes = {
        "dt": lambda b, s: setattr(s, "dt", 1.5 * fs),
        "temperature": lambda b, s: setattr(s, "temperature", 900.0),
        "friction": lambda b, s: setattr(s, "gamma", 0.2 / fs),
        "taut": lambda b, s: setattr(s, "taut", 20.0 * fs),
        "tdamp": lambda b, s: setattr(s, "tdamp", 200.0 * fs),
        "fixed atoms": lambda b, s: b.fixed.__setitem__(slice(0, 3), True),
        "masses in place": lambda b, s: b.masses.mul_(2.0),
        "masses replaced": lambda b, s: setattr(b, "masses", b.masses * 0.25),
    }

    def run(b: Batch) -> None:
        stage = make()
        stage.setup(b, seed=1, prefix="s0")
        for change in (None, *changes.values(), "layout", None):
            if change == "layout":  # other systems: another batch
                b = b.select(torch.tensor([0, 2, 3, 5]))
            elif change is not None:
                change(b, stage)
            m = mask[: b.num_systems]
            stage.pre_update(b, m)
            stage.post_update(b, m)
            b.total_steps = b.total_steps + 1
        out.append(b)

    out: list[Batch] = []
    both_ways(monkeypatch, batch, run)
    assert_close_fields(*out, ("positions", "velocities"))


@pytest.mark.parametrize(
    "make", [lambda: Langevin(dt=2.0, temperature=300.0, friction=0.05), lambda: Bussi(dt=2.0)]
)
def test_md_kernels_pick_their_noise_from_the_draws_ahead(monkeypatch, make):
    """Over 20 steps -- past the end of 8-step draws, a system held back by its mask, a
    system that skips ahead (outside the draw: drawn afresh) -- Langevin's and Bussi's
    compiled steps read exactly the keyed noise of each system's step, which the torch
    path draws every step; and they did read draws ahead (fewer draws than steps)."""
    from alchemi_lit.core import random as random_mod

    batch = random_batch(torch.float64)
    mask = torch.tensor([1, 1, 0, 1, 1, 1], dtype=torch.bool)
    keyed, draws = random_mod.atom_normals, []

    def counting(*args, ahead=1):
        draws.append(ahead)
        return keyed(*args, ahead=ahead)

    monkeypatch.setattr(random_mod, "atom_normals", counting)
    runs = {}
    for enabled in (True, False):
        monkeypatch.setattr(kernels, "ENABLED", enabled)
        b, stage = batch.clone(), make()
        stage.setup(b, seed=3, prefix="s0")
        for k in range(20):
            stage.pre_update(b, mask)
            stage.post_update(b, mask)
            skip = torch.tensor([0, 0, 0, 5 if k == 11 else 0, 0, 0])
            b.total_steps = b.total_steps + mask.long() + skip
        runs[enabled] = b
        if enabled:
            # steps 0-7 and 8-15 in two draws; at step 12 system 3 is at 17, past the
            # second: a fresh draw of 4 steps (what the dropped one served), then 8
            assert draws == [8, 8, 4, 8], draws
    assert_close_fields(runs[True], runs[False], ("positions", "velocities"))


def test_philox_words_are_bit_for_bit_the_torch_ones(monkeypatch):
    """Large ids, steps past 2**32, seeds past 2**32, every purpose, draws ahead."""
    sid = torch.tensor([0, 3, 2**33 + 5, 17, 123456789012], dtype=torch.int64)
    step = torch.tensor([0, 1, 2**32 + 7, 99, 2**40 + 5], dtype=torch.int64)
    idx = torch.arange(5).repeat_interleave(7)
    local = torch.arange(7).repeat(5)
    cases = [
        (seed, sid, step, idx, local, purpose, torch.float64, ahead)
        for seed in (0, 12345, 2**40 + 3, 2**63 - 1)
        for purpose in (rng.PURPOSE_NOISE, rng.PURPOSE_VELOCITY_INIT, rng.PURPOSE_THERMOSTAT)
        for ahead in (1, 3)  # three steps in one draw: block k at step + k
    ]
    compiled = [rng.atom_normals(*args) for args in cases]
    second_step = rng.atom_normals(0, sid, step + 1, idx, local, rng.PURPOSE_NOISE, torch.float64)
    assert torch.equal(compiled[1][35:70], second_step)  # (cases[1]: seed 0, noise, 3 ahead)
    with pytest.raises(IndexError, match="system_idx"):  # an error, not a wild read
        rng.atom_normals(0, sid, step, idx + 1, local, rng.PURPOSE_NOISE, torch.float64)
    monkeypatch.setattr(kernels, "ENABLED", False)
    for args, normals in zip(cases, compiled):
        assert torch.equal(normals, rng.atom_normals(*args))


def test_force_checks_equal_torch_path(monkeypatch):
    """ForceMax's per-system maximum and NaNGuard's pre-test, NaN and inf included."""
    batch = random_batch(torch.float64)
    crit = ForceMax(fmax=0.1)
    batch.forces[batch.atom_mask(torch.tensor([0, 0, 0, 1, 1, 0], dtype=torch.bool))] *= 1e-3
    forces = batch.forces.clone()
    forces[5, 1] = float("nan")  # system 0
    forces[60, 0] = float("inf")  # system 2
    cases = [batch.forces, forces]

    def checks(forces: torch.Tensor) -> tuple[torch.Tensor, bool]:
        b = batch.clone()
        b.forces = forces.clone()
        return crit(b), nan_guard._may_be_non_finite(b)

    compiled = [checks(f) for f in cases]
    monkeypatch.setattr(kernels, "ENABLED", False)
    plain = [checks(f) for f in cases]
    for (c_conv, c_bad), (p_conv, p_bad) in zip(compiled, plain):
        assert torch.equal(c_conv, p_conv) and c_bad == p_bad
    assert compiled[0][1] is False and compiled[1][1] is True
    assert compiled[0][0].any() and not compiled[0][0].all()  # the threshold splits them
    assert not compiled[1][0][0] and not compiled[1][0][2]  # NaN / inf: not converged


def test_force_criterion_is_ases_at_and_around_fmax():
    """ForceMax's compiled per-system maximum against ASE's test ``max_i |F_i|^2 <
    fmax^2`` (ase.optimize.Optimizer.converged) with the largest force just below, at
    and just above ``fmax``, and between ``fmax`` and ``sqrt(fmax)``: a kernel comparing
    ``|F|^2`` with ``fmax`` (not squared) or with ``<=`` passed the test above."""
    from alchemi_lit.integrators import convergence

    fmax = 0.1
    batch = random_batch(torch.float64)
    largest = fmax * torch.tensor([0.5, 1 - 1e-12, 1.0, 1 + 1e-12, 2.0, 3.0], dtype=torch.float64)
    forces = torch.zeros_like(batch.forces)
    first = batch.ptr[:-1]  # (atoms 2 and 4 of each system are free)
    forces[first + 2, 0] = largest  # one atom per system carries its largest force
    forces[first + 4, 1] = 0.5 * largest  # and a smaller one
    batch.forces = forces
    want = [(f * f).sum(axis=1).max() < fmax**2 for f in np.split(forces.numpy(), batch.ptr[1:-1])]
    assert kernels.usable(batch.forces)
    got = convergence.largest_force_below(batch, fmax)
    assert got.tolist() == want == [True, True, False, False, False, False]


def test_finite_pretest_sees_every_field_and_component():
    """NaNGuard's compiled pre-test is True (a system may be broken) for a NaN or inf
    in any component of the forces or positions, or in an energy, as NumPy's isfinite
    over the three fields says; False for a finite batch."""
    batch = random_batch(torch.float64)
    assert kernels.usable(batch.forces) and nan_guard._may_be_non_finite(batch) is False
    cases = [("energy", (3,))] + [(f, (17, k)) for f in ("forces", "positions") for k in range(3)]
    for name, where in cases:
        for bad in (float("nan"), float("inf")):
            b = batch.clone()
            getattr(b, name)[where] = bad
            fields = (b.forces.numpy(), b.positions.numpy(), b.energy.numpy())
            assert not all(np.isfinite(x).all() for x in fields)
            assert nan_guard._may_be_non_finite(b) is True, (name, where, bad)


def test_primitives_called_directly_equal_torch_path(monkeypatch):
    """The kick primitives as a custom integrator may call them: ``kick_drift`` with a
    per-system velocity ``scale`` (no built-in integrator passes one to the kernel), then
    ``kick`` with the same time step, whose kept ``dt/m`` must not be the half step's."""
    from alchemi_lit.integrators import ops

    batch = random_batch(torch.float64)
    mask = torch.tensor([1, 1, 0, 1, 1, 1], dtype=torch.bool)
    scale = torch.linspace(0.9, 1.1, 6, dtype=torch.float64)

    def steps(b: Batch) -> None:
        for _ in range(2):
            ops.kick_drift(b, mask, 1.5, scale=scale)
            ops.kick(b, mask, 1.5)

    compiled, plain = both_ways(monkeypatch, batch, steps)
    assert_close_fields(compiled, plain, ("positions", "velocities"))


def test_stage_exits_equal_torch_path(monkeypatch):
    """The fused loop's test of who leaves a stage: out of steps, or converged where a
    criterion says so, and only systems of the stage; and the fewest steps the others
    have left."""
    from alchemi_lit.engine import status

    batch = random_batch(torch.float64)
    batch.step = torch.tensor([0, 4, 5, 6, 5, 2])
    mask = torch.tensor([1, 1, 1, 0, 1, 1], dtype=torch.bool)
    converged = torch.tensor([0, 0, 0, 1, 1, 1], dtype=torch.bool)
    cases = [(5, None), (5, converged), (100, None), (100, converged)]

    def run() -> list:
        exits = [status.leaving(batch, n, mask, c) for n, c in cases]
        return exits

    compiled = run()
    monkeypatch.setattr(kernels, "ENABLED", False)
    plain = run()
    for (leave, anyone, _), (want, want_any, _) in zip(compiled, plain):
        assert torch.equal(leave, want) and anyone is want_any
    # steps the others of the stage have left (the fused loop's countdown); CPU only
    assert [e[2] for e in compiled] == [1, 1, 95, 95] and plain[0][2] is None
    assert [e[0].tolist() for e in compiled] == [
        [False, False, True, False, True, False],  # steps 5 and 5 reach 5; 6 is not in it
        [False, False, True, False, True, True],
        [False] * 6,
        [False, False, False, False, True, True],
    ]


def test_when_the_torch_path_runs_instead(monkeypatch):
    """ALCHEMI_LIT_CPU_KERNELS=0 (read at import), tensors NumPy cannot view (autograd),
    float16, and large arrays when torch has more than two threads keep the torch path."""
    import importlib

    monkeypatch.setenv(kernels.ENV_SWITCH, "0")
    try:
        assert importlib.reload(kernels).ENABLED is False
    finally:
        monkeypatch.delenv(kernels.ENV_SWITCH)
        importlib.reload(kernels)
    assert kernels.ENABLED is True
    assert not kernels.usable(torch.zeros(3, requires_grad=True))
    assert not kernels.usable(torch.zeros(3, dtype=torch.float16))
    # never by size or threads: a system's rounding must not follow its batch mates (#41)
    big = torch.zeros(3 * 32768 + 1)
    for threads in (1, 2, 8):
        monkeypatch.setattr(torch, "get_num_threads", lambda t=threads: t)
        assert kernels.usable(big) and kernels.usable(big[:3])
    monkeypatch.undo()
    assert kernels.usable(torch.zeros(3))
    constant = kernels.per_system(random_batch(torch.float32), 2.0)
    # the batch's dtype: a float64 constant would run float32 steps in mixed precision
    assert constant.dtype == np.float32 and np.array_equal(constant, np.full(6, 2.0))


FIRE_PARAMS = (2, 1.1, 0.5, 0.4, 0.1, 0.99, 0.2, True)
FIRE2_PARAMS = (2, 1.1, 0.5, 0.4, 0.01, 0.25, 0.99, 0.2, False)


@pytest.fixture(scope="module")
def scalar_decisions():
    """FIRE's and FIRE2's per-system functions on ``kernels.scalar_xp``, looped over the
    systems in one numba function (compiled once for every seed: seconds each time)."""
    import numba

    from alchemi_lit.integrators.formulas import fire2_coefficients, fire_coefficients
    from alchemi_lit.kernels import scalar_xp

    one = numba.njit(fire_coefficients.__wrapped__)
    two = numba.njit(fire2_coefficients.__wrapped__)
    p1, p2 = FIRE_PARAMS, FIRE2_PARAMS

    @numba.njit
    def per_system(mask, step, back, vf, ff, vv, dt, alpha, n):
        out1 = np.empty((6, mask.shape[0]))
        out2 = np.empty((9, mask.shape[0]))
        for b in range(mask.shape[0]):
            x = (mask[b], step[b], vf[b], ff[b], vv[b], dt[b], alpha[b], n[b])
            y = (mask[b], step[b], back[b], vf[b], ff[b], vv[b], dt[b], alpha[b], n[b])
            a1, a2, a3, a4, a5, a6 = one(scalar_xp, *x, *p1)
            out1[0, b], out1[1, b], out1[2, b], out1[3, b], out1[4, b], out1[5, b] = (
                a1,
                a2,
                a3,
                a4,
                a5,
                a6,
            )
            b1, b2, b3, b4, b5, b6, b7, b8, b9 = two(scalar_xp, *y, *p2)
            out2[0, b], out2[1, b], out2[2, b], out2[3, b], out2[4, b] = b1, b2, b3, b4, b5
            out2[5, b], out2[6, b], out2[7, b], out2[8, b] = b6, b7, b8, b9
        return out1, out2

    return per_system


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_decisions_on_one_systems_numbers_equal_numpy_bit_for_bit(seed, scalar_decisions):
    """The kernels run FIRE's and FIRE2's per-system functions on scalars
    (``kernels.scalar_xp``); float64 results equal the NumPy path's exactly, over
    every branch (first step, uphill, downhill past n_min, zero force, NaN, clamped)."""
    from test_per_system import fire_inputs

    from alchemi_lit.integrators.formulas import fire2_coefficients, fire_coefficients

    p1, p2 = FIRE_PARAMS, FIRE2_PARAMS
    mask, step, vf, ff, vv, dt, alpha, n = (t.numpy() for t in fire_inputs(torch.float64, seed))
    back = np.random.default_rng(seed).random(len(mask)) < 0.2
    got1, got2 = scalar_decisions(mask, step, back, vf, ff, vv, dt, alpha, n)
    with np.errstate(all="ignore"):
        want1 = fire_coefficients.__wrapped__(np, mask, step, vf, ff, vv, dt, alpha, n, *p1)
        want2 = fire2_coefficients.__wrapped__(np, mask, step, back, vf, ff, vv, dt, alpha, n, *p2)
    for got, want in ((got1, want1), (got2, want2)):
        for g, w in zip(got, want):
            assert np.array_equal(g, np.asarray(w, dtype=np.float64), equal_nan=True)


def test_without_numba_the_torch_path_runs(monkeypatch):
    """numba is optional at run time: when it cannot be imported every integrator takes
    its torch path (and says so once, at info level)."""
    import sys

    batch = random_batch(torch.float64)
    stage = FIRE()
    stage.setup(batch, seed=0, prefix="s0")
    stage.init_systems(batch, torch.ones(6, dtype=torch.bool))
    kernels._numba_available.cache_clear()
    monkeypatch.setitem(sys.modules, "numba", None)  # import numba -> ImportError
    try:
        assert not kernels.usable(batch.positions)
        stage.pre_update(batch, torch.ones(6, dtype=torch.bool))
        assert torch.isfinite(batch.positions).all()
    finally:
        monkeypatch.undo()
        kernels._numba_available.cache_clear()
    assert kernels.usable(batch.positions)


def test_a_per_system_time_step_keeps_its_half_kick_constants(monkeypatch):
    """A per-system ``dt`` (a tensor by ``system_id``) keeps the half kick's dt/2m from
    step to step as a number does: halving it at each call made a new tensor, so a new
    key -- the constants were rebuilt at every step and pushed out the other kept ones."""
    from alchemi_lit.integrators import ops
    from alchemi_lit.kernels import backend

    batch = random_batch(torch.float64)
    mask = torch.ones(6, dtype=torch.bool)
    dt = torch.linspace(0.5, 1.0, 6, dtype=torch.float64)
    made = []
    real = ops.kick_factors
    monkeypatch.setattr(ops, "kick_factors", lambda b, d: made.append(d) or real(b, d))
    for _ in range(3):
        backend.kick_drift(batch, mask, dt)
    assert len(made) == 1
    assert torch.equal(made[0], 0.5 * dt[batch.system_id])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("width", [0, 1, 3, 9])
def test_run_sums_kernel_adds_in_segment_reduces_order_to_the_bit(dtype, width):
    """The numba run sums are torch.segment_reduce's, bit for bit (both add a run's
    values one after another from zero), with empty runs and 1-D or 2-D values; and a
    run's sum is its own values' wherever the run sits (#41)."""
    pytest.importorskip("numba")
    from alchemi_lit.core.segments import run_sums

    gen = torch.Generator().manual_seed(width)
    lengths = torch.tensor([0, 7, 1, 0, 33, 130, 2])
    shape = (int(lengths.sum()),) if width == 0 else (int(lengths.sum()), width)
    values = (torch.randn(shape, generator=gen, dtype=torch.float64) * 1e3).to(dtype)
    assert run_sums.choose(values, lengths) == "numba"
    got = run_sums(values, lengths)
    want = run_sums.reference(values, lengths)
    assert got.dtype == dtype and torch.equal(got, want)
    start = int(lengths[:5].sum())  # the 130-value run, alone
    alone = run_sums(values[start : start + 130], torch.tensor([130]))
    assert torch.equal(alone[0], got[5])
    sequential = values[start : start + 130].unbind(0)
    total = torch.zeros_like(sequential[0])
    for v in sequential:
        total = total + v
    assert torch.equal(total, got[5])  # (one after another, from zero)
    empty = values[:0]  # no values at all (every run empty): zeros, by the reference
    assert torch.equal(run_sums(empty, torch.zeros(3, dtype=torch.int64)),
                       torch.zeros((3, *values.shape[1:]), dtype=dtype))  # fmt: skip
