"""One probe batch of ``SizeAwareSampler(max_atoms="auto")``, evaluated as the run will.

The fit and the budget choice are the sampler's (:mod:`alchemi_lit.data.memory_budget`);
evaluating the model belongs to the engine, which runs it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..core.errors import ConfigError
from ..core.state import Batch
from ..models.neighbors import NeighborList


class MemoryProbe:
    """Evaluates a probe batch as the run will: ``model`` on ``device`` in ``dtype``,
    the stress if the run computes it, and ``declare`` (the plan's field declaration)
    allocating the integrators' state first.  A fresh neighbour list leaves the
    model's own untouched."""

    def __init__(
        self,
        model: Any,
        dtype: torch.dtype,
        device: torch.device,
        stress: bool,
        declare: Callable[[Any], None] | None = None,
    ) -> None:
        self.model, self.dtype, self.device = model, dtype, torch.device(device)
        self.stress, self.declare = bool(stress), declare

    def __call__(self, structures: Sequence[Any]) -> None:
        batch = Batch.from_atoms(
            list(structures), system_ids=list(range(len(structures))),
            dtype=self.dtype, device=self.device, validate=False,
        )  # fmt: skip
        if self.declare is not None:
            self.declare(batch)
        nl = NeighborList(self.model.cutoff, self.model.neighbors.skin)
        try:
            self.model(batch, compute_stress=self.stress, neighbors=nl)
        except Exception as exc:
            n = int(batch.num_atoms)
            raise ConfigError(
                f"max_atoms='auto': {type(self.model).__name__} failed on a probe batch of "
                f"{len(structures)} structure(s), {n} atoms ({type(exc).__name__}: {exc}); "
                f"give max_atoms a number (the run then sets failing structures aside)"
            ) from exc
