"""What ``Simulator.run`` runs without a budget (issue 46, part 2): a path streams with
the default budget, a list too large for one batch goes in bounded inflight batches,
and a small list stays one batch."""

from __future__ import annotations

from pathlib import Path

import ase.io
import numpy as np
import torch

from alchemi_lit import Simulator
from alchemi_lit.data import SizeAwareSampler
from alchemi_lit.data.default_budget import BOUNDED_MAX_ATOMS
from alchemi_lit.integrators import FIRE
from alchemi_lit.models import EMT
from alchemi_lit.strategies.distributed import ReplicasStrategy
from alchemi_lit.strategies.run_input import run_input
from alchemi_lit.strategies.single import SingleDeviceStrategy
from conftest import copper_cells

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def cells(n: int) -> list:
    return copper_cells(n, seed=2)


def test_a_list_larger_than_the_bound_goes_in_bounded_batches() -> None:
    big = cells(BOUNDED_MAX_ATOMS // 4 + 1)  # one atom-cell too many for the bound
    got = run_input(big, CPU, EMT(), SingleDeviceStrategy())
    assert isinstance(got, SizeAwareSampler) and got.max_atoms == BOUNDED_MAX_ATOMS
    small = cells(3)
    assert run_input(small, CPU, EMT(), SingleDeviceStrategy()) is small  # one batch
    measured = run_input(big, CUDA, EMT(), SingleDeviceStrategy())
    assert measured.max_atoms == "auto" and measured.fallback_atoms == BOUNDED_MAX_ATOMS
    replicas = run_input(big, CUDA, EMT(), ReplicasStrategy())  # cannot measure: bounded
    assert replicas.max_atoms == BOUNDED_MAX_ATOMS


def test_a_path_streams_and_runs_as_the_list_does(tmp_path: Path) -> None:
    path = tmp_path / "cells.extxyz"
    structures = cells(12)
    ase.io.write(path, structures, format="extxyz")
    assert isinstance(run_input(path, CPU, EMT(), SingleDeviceStrategy()), SizeAwareSampler)
    sim = Simulator(EMT(), [FIRE(fmax=0.01, max_steps=4)], accelerator="cpu")
    from_path = sim.run(str(path)).batch
    from_list = sim.run(ase.io.read(path, ":")).batch
    assert from_path.system_id.tolist() == list(range(12))
    for key in ("positions", "forces"):  # float64 EMT: batching changes no bit
        np.testing.assert_array_equal(
            getattr(from_path, key).numpy(), getattr(from_list, key).numpy()
        )
