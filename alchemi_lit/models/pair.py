"""Pair potentials with analytic gradients: Lennard-Jones and Morse.

Both reproduce ASE's calculators term for term (``ase.calculators.lj.LennardJones``
and ``ase.calculators.morse.MorsePotential``), including their cutoff treatment, so
results can be checked against ASE to round-off.  Gradients are analytic: no
autograd graph, which makes these the fastest models for benchmarks and tests.
"""

from __future__ import annotations

import torch

from ..core.state import Batch
from ..core.tensor_ops import row_dot
from .base import Model
from .neighbors import Edges


class PairPotential(Model):
    """A model that is a sum of pair terms: subclasses implement :meth:`pair_terms`.

    The per-system sum happens outside :meth:`pair_terms`, so ``compile=True`` compiles
    a function of edge vectors alone (shape-polymorphic, no scatter inside).
    """

    def pair_terms(self, vec: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise TypeError(f"{type(self).__name__} must implement pair_terms(vec)")

    def compile_target(self):
        return self.pair_terms

    def energy_and_edge_gradient(
        self, batch: Batch, edges: Edges
    ) -> tuple[torch.Tensor, torch.Tensor]:
        fn = self._edge_fn or self.pair_terms
        e_pair, grad = fn(edges.vec)
        return edges.system_sum(e_pair, batch.num_systems), grad


class LennardJones(PairPotential):
    """Single-species Lennard-Jones, ``4ε[(σ/r)^12 - (σ/r)^6]``.

    Like ASE: ``cutoff`` defaults to 3σ; with ``smooth=False`` the pair energy is shifted
    to zero at the cutoff (forces jump to zero there); with ``smooth=True`` it is
    multiplied by a C^1 switch between ``onset`` (default 0.66·cutoff) and the cutoff.

    Args:
        epsilon: well depth ε in eV (> 0).
        sigma: zero-crossing distance σ in Å (> 0).
        cutoff: interaction cutoff in Å (default 3σ, as ASE).
        onset: start of the smooth switch in Å (``smooth`` only; default 0.66·cutoff).
        smooth: switch the energy off smoothly between ``onset`` and ``cutoff`` instead
            of shifting it to zero at the cutoff.
        skin: neighbour-list skin in Å (the list is rebuilt when an atom moved skin/2).
        compute_stress: also compute the stress (eV/Å^3) of periodic systems.
    """

    def __init__(
        self,
        epsilon: float = 1.0,
        sigma: float = 1.0,
        cutoff: float | None = None,
        onset: float | None = None,
        smooth: bool = False,
        skin: float = 1.0,
        compute_stress: bool = True,
    ) -> None:
        cutoff = 3.0 * sigma if cutoff is None else cutoff
        if not epsilon > 0:
            raise ValueError(f"LennardJones: epsilon must be > 0 eV, got {epsilon}")
        if not sigma > 0:
            raise ValueError(f"LennardJones: sigma must be > 0 Å, got {sigma}")
        super().__init__(cutoff, skin, compute_stress)
        self.epsilon = float(epsilon)
        self.sigma = float(sigma)
        self.smooth = bool(smooth)
        self.onset = 0.66 * self.cutoff if onset is None else float(onset)
        if smooth and not 0 < self.onset < self.cutoff:
            raise ValueError(f"LennardJones onset must be in (0, cutoff), got {self.onset}")

    def pair_terms(self, vec: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Pair energies ``[P]`` and ``dE/dvec`` ``[P, 3]`` (pure per-edge: compilable).

        Written with few, mostly in-place passes over the edges: this is the whole cost of
        an LJ step besides the gather and scatter.  ``r2 > 0`` for every listed pair (the
        list never pairs an atom with itself), so pairs beyond the cutoff are computed and
        then zeroed by the mask rather than branched around.
        """
        r2 = row_dot(vec)
        rc2 = self.cutoff**2
        inside = (r2 <= rc2).to(r2.dtype)
        s2 = r2.reciprocal().mul_(self.sigma**2)  # (sigma/r)^2
        c6 = s2 * s2 * s2
        c12 = c6 * c6
        e_pair = (c12 - c6).mul_(4.0 * self.epsilon)
        # dE/dr / r = -24 eps (2 c12 - c6) / r^2,  with 1/r^2 = s2 / sigma^2
        de = c12.mul_(2.0).sub_(c6).mul_(s2).mul_(-24.0 * self.epsilon / self.sigma**2)
        if self.smooth:
            ro2 = self.onset**2
            x = (rc2 - r2) / (rc2 - ro2) ** 3
            switching = (r2 > ro2) & (inside > 0)
            fc = torch.where(switching, (rc2 - r2) * x * (rc2 + 2 * r2 - 3 * ro2), inside)
            dfc = torch.where(switching, 6.0 * x * (ro2 - r2), torch.zeros_like(r2))
            de = (fc * de).add_(2.0 * dfc * e_pair)
            e_pair = e_pair.mul_(fc)
        else:
            sr6 = (self.sigma / self.cutoff) ** 6
            e_pair = e_pair.sub_(4.0 * self.epsilon * (sr6 * sr6 - sr6)).mul_(inside)
            de = de.mul_(inside)
        return e_pair, de.unsqueeze(-1) * vec


class Morse(PairPotential):
    """Morse potential ``ε[e^{-2ρ0(r/r0-1)} - 2e^{-ρ0(r/r0-1)}]`` with ASE's smooth cutoff.

    The quintic switch runs from ``rcut1·r0`` to ``rcut2·r0`` exactly as in
    ``ase.calculators.morse.MorsePotential`` (same parameter names and defaults).

    Args:
        epsilon: well depth ε in eV (> 0).
        rho0: dimensionless stiffness ρ0 (> 0).
        r0: equilibrium distance in Å (> 0).
        rcut1: start of the cutoff switch, in units of ``r0``.
        rcut2: cutoff, in units of ``r0`` (> ``rcut1``).
        skin: neighbour-list skin in Å (the list is rebuilt when an atom moved skin/2).
        compute_stress: also compute the stress (eV/Å^3) of periodic systems.
    """

    def __init__(
        self,
        epsilon: float = 1.0,
        rho0: float = 6.0,
        r0: float = 1.0,
        rcut1: float = 1.9,
        rcut2: float = 2.7,
        skin: float = 1.0,
        compute_stress: bool = True,
    ) -> None:
        for name, value in (("epsilon", epsilon), ("rho0", rho0), ("r0", r0)):
            if not value > 0:
                raise ValueError(f"Morse: {name} must be > 0, got {value}")
        if not rcut1 > 0:
            raise ValueError(f"Morse: rcut1 must be > 0, got {rcut1}")
        if not rcut2 > rcut1:
            raise ValueError(f"Morse: rcut2 must be larger than rcut1 ({rcut1}), got rcut2={rcut2}")
        super().__init__(rcut2 * r0, skin, compute_stress)
        self.epsilon, self.rho0, self.r0 = float(epsilon), float(rho0), float(r0)
        self.r_on, self.r_off = rcut1 * r0, rcut2 * r0

    def pair_terms(self, vec: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Pair energies ``[P]`` and ``dE/dvec`` ``[P, 3]`` (pure per-edge: compilable)."""
        d = row_dot(vec).sqrt()
        inside = d < self.r_off
        d_safe = torch.where(d > 0, d, torch.ones_like(d))
        expf = torch.exp(self.rho0 * (1.0 - d_safe / self.r0))
        e_pair = self.epsilon * expf * (expf - 2.0)
        de = (-2.0 * self.epsilon * self.rho0 / self.r0) * expf * (expf - 1.0)
        s = 1.0 - (d - self.r_on) / (self.r_off - self.r_on)
        mid = (s > 0.0) & (s < 1.0)
        fc = torch.where(
            s >= 1.0,
            torch.ones_like(s),
            torch.where(mid, s**3 * (6 * s * s - 15 * s + 10), torch.zeros_like(s)),
        )
        dfc = torch.where(
            mid, -30.0 * s * s * (s - 1.0) ** 2 / (self.r_off - self.r_on), torch.zeros_like(s)
        )
        de = torch.where(inside, de * fc + e_pair * dfc, torch.zeros_like(d))
        e_pair = torch.where(inside, e_pair * fc, torch.zeros_like(d))
        return e_pair, (de / d_safe).unsqueeze(-1) * vec


__all__ = ["LennardJones", "Morse"]
