"""Models with exactly known dynamics, for checking observables against analytic results.

* :class:`FreeParticles`: no forces at all.  Under Langevin dynamics each atom is an
  Ornstein-Uhlenbeck particle whose diffusion coefficient is ``kT / (m gamma)``
  (Einstein-Smoluchowski), whatever the time step of BAOAB (its O step is exact).
* :class:`EinsteinCrystal`: every atom tied by a spring ``k`` to the nearest site of a
  simple-cubic lattice of spacing ``a`` (``E = k/2 |r - a round(r / a)|^2``): 3N
  independent oscillators of angular frequency ``sqrt(k / m)``; the potential energy
  averages to ``3 N kT / 2`` at temperature T (equipartition).

Neither computes a meaningful stress (it is zero): not for barostats.
"""

from __future__ import annotations

import torch

from ..core.state import Batch
from ..models.base import Model


class FreeParticles(Model):
    """Zero energy and forces: an ideal gas (module docstring)."""

    def __init__(self) -> None:
        super().__init__(cutoff=1.0)

    def forward(self, batch: Batch, compute_stress: bool | None = None,
                neighbors: object = None) -> dict[str, torch.Tensor]:  # fmt: skip
        out = {"energy": torch.zeros_like(batch.energy),
               "forces": torch.zeros_like(batch.positions)}  # fmt: skip
        if self.compute_stress if compute_stress is None else compute_stress:
            out["stress"] = torch.zeros_like(batch.cell)
        return out

    def stress(self, batch: Batch) -> torch.Tensor:
        return torch.zeros_like(batch.cell)


class EinsteinCrystal(Model):
    """Atoms on springs ``k`` (eV/Å^2) to the sites of a cubic lattice of spacing ``a``
    (Å): independent harmonic oscillators of angular frequency ``sqrt(k / m)``."""

    def __init__(self, k: float = 1.0, a: float = 3.0) -> None:
        super().__init__(cutoff=1.0)
        if not k > 0 or not a > 0:
            raise ValueError(f"EinsteinCrystal: k and a must be > 0, got k={k}, a={a}")
        self.k, self.a = float(k), float(a)

    def forward(self, batch: Batch, compute_stress: bool | None = None,
                neighbors: object = None) -> dict[str, torch.Tensor]:  # fmt: skip
        r = batch.positions
        u = r - self.a * torch.round(r / self.a)
        energy = batch.segments.sum(0.5 * self.k * (u * u).sum(-1))
        out = {"energy": energy, "forces": -self.k * u}
        if self.compute_stress if compute_stress is None else compute_stress:
            out["stress"] = torch.zeros_like(batch.cell)
        return out

    def stress(self, batch: Batch) -> torch.Tensor:
        return torch.zeros_like(batch.cell)


__all__ = ["EinsteinCrystal", "FreeParticles"]
