"""What :meth:`Simulator.run` runs when it is given no budget: a path is streamed, and
structures too many for one batch go in inflight batches of the default budget
(:mod:`alchemi_lit.data.default_budget`), never in one batch that cannot fit."""

from __future__ import annotations

import os
from typing import Any

import torch

from ..data.default_budget import BOUNDED_MAX_ATOMS, default_budget_sampler
from ..models.base import cpu_batch_atoms
from .distributed import DistributedStrategy


def run_input(data: Any, device: torch.device, model: Any, strategy: Any) -> Any:
    """``data`` as a run takes it: a path (file, folder, pattern or results store) as a
    sampler of its streamed dataset with the default budget; a list of ``ase.Atoms``
    of more than :data:`~alchemi_lit.data.default_budget.BOUNDED_MAX_ATOMS` atoms
    likewise (one batch of fewer is the same run); anything else as given."""
    from ase import Atoms

    if isinstance(data, (str, os.PathLike)):
        from ..data.open_dataset import open_dataset

        data = open_dataset(data)
    elif not (
        isinstance(data, (list, tuple))
        and data
        and all(isinstance(a, Atoms) for a in data)
        and sum(len(a) for a in data) > BOUNDED_MAX_ATOMS
    ):
        return data
    return default_budget_sampler(
        data, torch.device(device).type, not isinstance(strategy, DistributedStrategy),
        cpu_batch_atoms(model),
    )  # fmt: skip
