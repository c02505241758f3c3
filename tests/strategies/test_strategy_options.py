"""Strategies own their options (issue #19, part 4): ``PipelineStrategy(buffer=...,
comm_mode=..., timeout=...)``; ``Simulator(strategy="pipeline", buffer=...)`` passes
them through; options a strategy does not take, or given twice, are refused by name."""

from __future__ import annotations

import pytest

import alchemi_lit as al
from alchemi_lit.core.errors import ConfigError
from alchemi_lit.integrators import FIRE, Langevin
from alchemi_lit.models import LennardJones
from alchemi_lit.strategies import PipelineStrategy
from alchemi_lit.strategies.buffers import BufferConfig


def sim(**kw) -> al.Simulator:
    plan = FIRE(fmax=0.05, max_steps=10) | Langevin(dt=2.0, temperature=50.0, steps=5)
    return al.Simulator(model=LennardJones(0.0104, 3.4, 6.0), stages=plan, devices=2, **kw)


def test_options_belong_to_the_strategy_and_pass_through_the_simulator():
    own = PipelineStrategy(buffer=BufferConfig(num_systems=4, num_atoms=100), comm_mode="sync")
    assert sim(strategy=own).strategy is own
    passed = sim(strategy="pipeline", buffer={"num_systems": 4, "num_atoms": 100}, timeout=5)
    assert passed.strategy.buffer == BufferConfig(num_systems=4, num_atoms=100)
    assert passed.strategy.timeout_s == 5.0 and passed.strategy.comm_mode == "async_recv"


def test_misplaced_options_are_refused_naming_them():
    own = PipelineStrategy()
    with pytest.raises(ConfigError, match=r"comm_mode: options of the strategy; give them"):
        sim(strategy=own, comm_mode="sync")
    fused = FIRE(fmax=0.05, max_steps=10) + Langevin(dt=2.0, temperature=50.0, steps=5)
    with pytest.raises(ConfigError, match=r"buffer, timeout: not an option of strategy 'single'"):
        al.Simulator(
            model=LennardJones(0.0104, 3.4, 6.0), stages=fused, buffer=BufferConfig(), timeout=5
        )
    with pytest.raises(ConfigError, match=r"comm_mode must be 'sync', 'async_recv'"):
        PipelineStrategy(comm_mode="asyncrecv")
    with pytest.raises(ConfigError, match=r"timeout must be > 0"):
        PipelineStrategy(timeout=0)
