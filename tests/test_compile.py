"""compile=True: the compiled model and noise give the eager results; a failing compiler
falls back to eager with one warning."""

from __future__ import annotations

import shutil

import pytest
import torch

import alchemi_lit as al
from alchemi_lit.core import random as rng
from alchemi_lit.data import argon_crystals
from alchemi_lit.integrators import FIRE, Bussi, Langevin
from alchemi_lit.models import LennardJones


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler"
)
@pytest.mark.timeout(300)
def test_compiled_run_matches_eager(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    data = argon_crystals(3, 2, seed=4)
    eager = al.Simulator(model=LennardJones(0.0104, 3.4, 8.5), stages=FIRE(fmax=0.01, max_steps=40))
    compiled = al.Simulator(
        model=LennardJones(0.0104, 3.4, 8.5), stages=FIRE(fmax=0.01, max_steps=40), compile=True
    )
    r1, r2 = eager.run(data), compiled.run(data)
    assert compiled.model._edge_fn is not None  # still compiled: no fallback happened
    torch.testing.assert_close(r2.batch.positions, r1.batch.positions, atol=1e-10, rtol=0)
    assert r2.steps.tolist() == r1.steps.tolist()


def broken_compile(fn, **kwargs):
    """Stands in for torch.compile where the compiler fails at the first call."""

    def run(*args, **kw):
        raise RuntimeError("no compiler here")

    return run


def run_logging_warnings(sim, data):
    """``sim.run(data)`` and the warnings logged meanwhile."""
    from loguru import logger

    messages: list[str] = []
    sink = logger.add(lambda m: messages.append(str(m)), level="WARNING")
    try:
        return sim.run(data), messages
    finally:
        logger.remove(sink)


def test_compile_failure_falls_back_to_eager(monkeypatch):
    monkeypatch.setattr(torch, "compile", broken_compile)
    data = argon_crystals(2, 2, seed=5)
    sim = al.Simulator(
        model=LennardJones(0.0104, 3.4, 8.5), stages=FIRE(fmax=0.05, max_steps=20), compile=True
    )
    res, messages = run_logging_warnings(sim, data)
    assert len(res) == 2 and sim.model._edge_fn is None
    assert any("torch.compile failed" in m and "eagerly" in m for m in messages)


def noisy_plan():
    return (
        FIRE(fmax=0.05, max_steps=15)
        + Langevin(dt=2.0, temperature=300.0, steps=12)
        + Bussi(dt=2.0, temperature=200.0, steps=8)
    )


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler"
)
@pytest.mark.timeout(300)
def test_compiled_noise_matches_eager(tmp_path, monkeypatch):
    """compile=True draws the Langevin/Bussi noise from the compiled Philox kernel: to
    an ulp the eager numbers, the same for an atom wherever it sits in the batch."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setattr(rng, "_compiled_atom_normals", None)
    draw = rng.compiled_atom_normals()
    assert draw is rng.compiled_atom_normals()  # one per process

    def layout(sizes, ids):
        sys_idx = torch.cat([torch.full((n,), i) for i, n in enumerate(sizes)])
        starts = torch.tensor([0, *torch.tensor(sizes).cumsum(0)[:-1].tolist()])
        local = torch.arange(len(sys_idx)) - starts[sys_idx]
        return torch.tensor(ids), torch.full((len(sizes),), 7), sys_idx, local

    three, one = layout([13, 108, 57], [5, 9, 11]), layout([57], [11])
    whole = draw(3, *three, rng.PURPOSE_NOISE, torch.float64)
    alone = draw(3, *one, rng.PURPOSE_NOISE, torch.float64)
    eager = rng.atom_normals(3, *three, rng.PURPOSE_NOISE, torch.float64)
    assert torch.equal(whole[121:], alone)
    torch.testing.assert_close(whole, eager, rtol=0, atol=1e-14)

    data = argon_crystals(3, 2, seed=6)
    runs = []
    for compiled in (False, True):
        sim = al.Simulator(model=LennardJones(0.0104, 3.4, 8.5), stages=noisy_plan(), seed=2,
                           compile=compiled)  # fmt: skip
        runs.append(sim.run(data))
    for field in ("positions", "velocities"):
        got, want = getattr(runs[1].batch, field), getattr(runs[0].batch, field)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-9)


def test_noise_compile_failure_falls_back_to_eager(monkeypatch):
    monkeypatch.setattr(rng, "_compiled_atom_normals", None)
    data = argon_crystals(2, 2, seed=5)
    eager = al.Simulator(model=LennardJones(0.0104, 3.4, 8.5), stages=noisy_plan(), seed=1)
    reference = eager.run(data)
    monkeypatch.setattr(torch, "compile", broken_compile)
    sim = al.Simulator(
        model=LennardJones(0.0104, 3.4, 8.5), stages=noisy_plan(), seed=1, compile=True
    )
    assert all(s.compiled_kernels for s in sim.plan.stages)
    res, messages = run_logging_warnings(sim, data)
    noise = [m for m in messages if "Philox noise kernel" in m]
    assert len(noise) == 1 and "eagerly" in noise[0]  # said once, then eager for good
    assert torch.equal(res.batch.positions, reference.batch.positions)  # eager = eager


def test_compile_parts_are_chosen_by_name():
    def sim(compile):
        return al.Simulator(
            model=LennardJones(0.0104, 3.4, 8.5), stages=noisy_plan(), compile=compile
        )

    only_noise = sim("integrators")
    assert only_noise.model._edge_fn is None
    assert all(s.compiled_kernels for s in only_noise.plan.stages)
    only_model = sim("model")
    assert only_model.model._edge_fn is not None
    assert not any(s.compiled_kernels for s in only_model.plan.stages)
    with pytest.raises(al.ConfigError, match=r"compile must be true, false, 'model' or"):
        sim("everything")
