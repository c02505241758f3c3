"""Toy plugin: ``ToyDamped`` (an integrator) and ``ToyHarmonic`` (a model).

The entry point ``alchemi_lit_toy:register_plugins`` is called once by alchemi_lit's
registry; everything it registers is recorded with this package's name as source.
"""

from __future__ import annotations

import torch

from alchemi_lit.core.state import Batch
from alchemi_lit.integrators import Integrator
from alchemi_lit.models import Model
from alchemi_lit.models.neighbors import Edges


class ToyDamped(Integrator):
    """Damped steepest descent: ``r += step * F`` (capped at ``maxstep``) until max |F| < fmax."""

    is_optimizer = True

    def __init__(
        self, step: float = 0.01, fmax: float = 0.05, maxstep: float = 0.1, max_steps: int = 500
    ) -> None:
        super().__init__(max_steps)
        if step <= 0 or fmax <= 0 or maxstep <= 0:
            raise ValueError(
                f"ToyDamped: step, fmax and maxstep must be > 0, got {step}, {fmax}, {maxstep}"
            )
        self.step = float(step)
        self.fmax = float(fmax)
        self.maxstep = float(maxstep)

    def pre_update(self, batch: Batch, mask: torch.Tensor) -> None:
        am = self.atom_mask(batch, mask).unsqueeze(-1)
        dr = self.step * batch.forces
        norm = dr.norm(dim=-1, keepdim=True).clamp_min(1e-30)
        dr = torch.where(norm > self.maxstep, dr * (self.maxstep / norm), dr)
        batch.positions = torch.where(am, batch.positions + dr, batch.positions)

    def converged(self, batch: Batch) -> torch.Tensor:
        f = batch.forces.norm(dim=-1).masked_fill(batch.fixed, 0.0)
        fmax = f.new_zeros(batch.num_systems).scatter_reduce(0, batch.system_idx, f, "amax")
        return fmax < self.fmax


class ToyHarmonic(Model):
    """Harmonic springs ``k [(r - r0)^2 - (rc - r0)^2] / 2`` between pairs closer than ``rc``."""

    def __init__(self, k: float = 1.0, r0: float = 3.8, cutoff: float = 5.0) -> None:
        super().__init__(cutoff)
        self.k = float(k)
        self.r0 = float(r0)

    def energy(self, batch: Batch, edges: Edges) -> torch.Tensor:
        r = edges.vec.norm(dim=-1)
        e = 0.5 * self.k * ((r - self.r0) ** 2 - (self.cutoff - self.r0) ** 2)
        e = torch.where(r < self.cutoff, e, torch.zeros_like(e))  # the list includes the skin
        return torch.zeros(batch.num_systems, dtype=e.dtype, device=e.device).index_add(
            0, edges.system, e
        )


def register_plugins() -> None:
    from alchemi_lit.core.registry import register

    register("integrator")(ToyDamped)
    register("model")(ToyHarmonic)


__all__ = ["ToyDamped", "ToyHarmonic", "register_plugins"]
