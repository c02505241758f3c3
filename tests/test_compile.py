"""compile=True: the compiled step gives the eager results; a failing compiler falls back."""

from __future__ import annotations

import shutil

import pytest
import torch

import alchemi_lit as al
from alchemi_lit.data import argon_crystals
from alchemi_lit.integrators import FIRE
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


def test_compile_failure_falls_back_to_eager(monkeypatch):
    def broken_compile(fn, **kwargs):
        def run(*args):
            raise RuntimeError("no compiler here")

        return run

    monkeypatch.setattr(torch, "compile", broken_compile)
    data = argon_crystals(2, 2, seed=5)
    sim = al.Simulator(
        model=LennardJones(0.0104, 3.4, 8.5), stages=FIRE(fmax=0.05, max_steps=20), compile=True
    )
    messages = []
    from loguru import logger

    sink = logger.add(lambda m: messages.append(str(m)), level="WARNING")
    try:
        res = sim.run(data)
    finally:
        logger.remove(sink)
    assert len(res) == 2 and sim.model._edge_fn is None
    assert any("torch.compile failed" in m and "eagerly" in m for m in messages)
