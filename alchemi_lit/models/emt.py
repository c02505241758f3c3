"""Effective-medium theory (EMT), a batched port of ``ase.calculators.emt.EMT``.

EMT (Jacobsen, Stoltze and Nørskov, Surf. Sci. 366, 394 (1996)) gives each atom a
cohesive energy from the electron density its neighbours put on it, plus a pair-like
correction ("atomic-sphere" term).  Per atom ``i`` with neighbours ``j`` (within
``rc_list``, weighted by the Fermi cutoff ``w(r) = 1 / (1 + exp(acut (r - rc)))``):

* ``sigma1_i = sum_j chi_ij w exp(-eta2_j (r - beta s0_j))`` with ``chi_ij = n0_j / n0_i``;
* ``ds_i = -ln(sigma1_i / (12 gamma1_i)) / (beta eta2_i)`` (the neutral-sphere radius
  minus its equilibrium value);
* ``sigma2_ij = chi_ij w exp(-kappa_j (r/beta - s0_j))``;
* ``E_i = E0_i (1 + lambda_i ds_i) exp(-lambda_i ds_i) + 6 V0_i exp(-kappa_i ds_i) - E0_i
  - (1/2) sum_j [V0_i sigma2_ij / (2 gamma2_i) + V0_j sigma2_ji / (2 gamma2_j)]``.

The gammas are fcc reference sums over the first three neighbour shells and so depend
on ``rc`` and ``acut``.  ASE derives those from the largest ``s0`` in its table, or,
with ``asap_cutoff=True``, from the largest ``s0`` among the elements *present*; here
that maximum is a per-system segment max, so every system in a batch gets exactly the
parameters ASE would give it alone.

Differences from ASE, none of which change results beyond round-off:

* ASE loops over atoms with a two-sided neighbour list and differentiates by hand.
  Here a half list feeds both ends of each pair with ``index_add`` and forces and
  stress come from autograd on the edge vectors (:class:`~.base.Model`).
* The Fermi function ``1 / (1 + exp(acut (r - rc)))`` has its argument clamped (no
  overflow in float32; see ``_fermi`` for why not ``sigmoid``); atoms with no
  neighbour inside ``rc_list`` get ``-E0`` like in ASE, via a guarded logarithm so
  that their gradient is exactly zero rather than NaN.
* ASE symmetrises its stress; the edge virial of a rotation-invariant energy already
  is symmetric up to round-off.
"""

from __future__ import annotations

import math

import torch
from ase.data import atomic_numbers
from ase.units import Bohr

from ..core.state import Batch
from ..core.tensor_ops import on_device
from .base import Model, per_system_sum
from .neighbors import Edges

#: EMT parameters in ASE's (atomic) units, per element:
#: E0 [eV], s0 [bohr], V0 [eV], eta2 [1/bohr], kappa [1/bohr], lambda [1/bohr], n0 [1/bohr^3].
#: The seven metals are the standard set; H, C, N and O are ASE's "just for fun" extras.
_PARAMETERS: dict[str, tuple[float, float, float, float, float, float, float]] = {
    "Al": (-3.28, 3.00, 1.493, 1.240, 2.000, 1.169, 0.00700),
    "Cu": (-3.51, 2.67, 2.476, 1.652, 2.740, 1.906, 0.00910),
    "Ag": (-2.96, 3.01, 2.132, 1.652, 2.790, 1.892, 0.00547),
    "Au": (-3.80, 3.00, 2.321, 1.674, 2.873, 2.182, 0.00703),
    "Ni": (-4.44, 2.60, 3.673, 1.669, 2.757, 1.948, 0.01030),
    "Pd": (-3.90, 2.87, 2.773, 1.818, 3.107, 2.155, 0.00688),
    "Pt": (-5.85, 2.90, 4.067, 1.812, 3.145, 2.192, 0.00802),
    "H": (-3.21, 1.31, 0.132, 2.652, 2.790, 3.892, 0.00547),
    "C": (-3.50, 1.81, 0.332, 1.652, 2.790, 1.892, 0.01322),
    "N": (-5.10, 1.88, 0.132, 1.652, 2.790, 1.892, 0.01222),
    "O": (-4.60, 1.95, 0.332, 1.652, 2.790, 1.892, 0.00850),
}
_COLUMNS = ("E0", "s0", "V0", "eta2", "kappa", "lambda", "n0")
#: Power of the bohr in each column's unit, to convert to Å.
_BOHR_POWER = (0, 1, 0, -1, -1, -1, -3)

#: ``(16 pi / 3)^(1/3) / sqrt(2)`` with ASE's historical rounding (fcc s0 -> nn distance).
BETA = 1.809
#: Value of the Fermi cutoff at the fourth-neighbour fcc distance (fixes its slope).
_CUTOFF_EPS = 1e-4
#: squared distances (in units of the first) and sizes of the first three fcc shells
_SHELLS = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
_SHELL_COUNTS = torch.tensor([12.0, 6.0, 24.0], dtype=torch.float64)
_MAX_S0 = max(p[1] for p in _PARAMETERS.values()) * Bohr


def emt_cutoffs(max_s0: float | torch.Tensor, asap_cutoff: bool = False):
    """``(rc, rc_list, acut)`` from the largest ``s0`` (Å) that sets the cutoff.

    ``rc`` is midway between the third and fourth fcc neighbour shells of the largest
    atom; ``acut`` makes ``w`` equal ``1e-4`` at the fourth shell.  Works on floats and
    on per-system tensors alike.
    """
    r1nn = BETA * max_s0
    rc = r1nn * 0.5 * (math.sqrt(3.0) + 2.0)
    acut = math.log(1.0 / _CUTOFF_EPS - 1.0) / (2.0 * r1nn - rc)
    rc_list = rc * 1.045 if asap_cutoff else rc + 0.5
    return rc, rc_list, acut


class EMT(Model):
    """ASE's EMT for Al, Cu, Ag, Au, Ni, Pd, Pt (and toy H, C, N, O), batched.

    ``asap_cutoff`` has ASE's meaning: take the cutoff from the largest atom present in
    each system instead of the largest in the table (ASAP's and older EMT's behaviour).
    The neighbour list always uses the largest ``rc_list`` any system can need; each
    system's own ``rc_list`` is applied per edge.

    Args:
        asap_cutoff: take each system's cutoff from its largest element (ASAP's
            convention) instead of the largest in the parameter table.
        skin: neighbour-list skin in Å (the list is rebuilt when an atom moved skin/2).
        compute_stress: also compute the stress (eV/Å^3) of periodic systems.
    """

    supported_elements = frozenset(atomic_numbers[s] for s in _PARAMETERS)

    def __init__(
        self, asap_cutoff: bool = False, skin: float = 1.0, compute_stress: bool = True
    ) -> None:
        # The largest s0 in the table gives the largest rc_list in either mode.
        _, rc_list_max, _ = emt_cutoffs(_MAX_S0, asap_cutoff)
        super().__init__(rc_list_max, skin, compute_stress)
        self.asap_cutoff = bool(asap_cutoff)
        table = torch.zeros(max(self.supported_elements) + 1, len(_COLUMNS), dtype=torch.float64)
        for symbol, values in _PARAMETERS.items():
            row = [v * Bohr**p for v, p in zip(values, _BOHR_POWER)]
            table[atomic_numbers[symbol]] = torch.tensor(row, dtype=torch.float64)
        # Indexed by atomic number; rows of unsupported elements stay zero (check_batch
        # rejects them).
        self.register_buffer("params", table, persistent=False)

    def _cutoffs(self, batch: Batch, s0: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Per-system ``(rc, rc_list, acut)`` ``[B]``, as ASE would set them per system."""
        if self.asap_cutoff:
            max_s0 = torch.zeros(batch.num_systems, dtype=s0.dtype, device=s0.device)
            max_s0 = max_s0.scatter_reduce(0, batch.system_idx, s0, "amax", include_self=False)
        else:
            max_s0 = torch.full((batch.num_systems,), _MAX_S0, dtype=s0.dtype, device=s0.device)
        return emt_cutoffs(max_s0, self.asap_cutoff)

    def energy(self, batch: Batch, edges: Edges) -> torch.Tensor:
        dtype = batch.dtype
        p = self.params.to(batch.device, dtype)[batch.atomic_numbers]  # [N, 7] per-atom parameters
        e0, s0, v0, eta2, kappa, lam, n0 = p.unbind(-1)
        rc_sys, rc_list_sys, acut_sys = self._cutoffs(batch, s0)

        # fcc reference sums over the first three shells, per atom since rc and acut
        # may differ between systems.
        # (constants copied once, not made from Python values in every forward: a CUDA
        # graph cannot capture that)
        shells = on_device(_SHELLS, p.device, dtype).sqrt()
        counts = on_device(_SHELL_COUNTS, p.device, dtype) / 12.0
        rc_a, acut_a = rc_sys[batch.system_idx, None], acut_sys[batch.system_idx, None]
        r1 = (BETA * s0)[:, None]
        r_shell = r1 * shells
        x = counts * _fermi(acut_a * (r_shell - rc_a))
        gamma1 = (x * torch.exp(-eta2[:, None] * (r_shell - r1))).sum(-1)
        gamma2 = (x * torch.exp(-(kappa / BETA)[:, None] * (r_shell - r1))).sum(-1)

        # Per edge: Fermi weight, zero (with zero gradient) beyond the system's rc_list.
        i, j = edges.i, edges.j
        r = edges.vec.norm(dim=-1)
        inside = r < rc_list_sys[edges.system]
        w = _fermi(acut_sys[edges.system] * (r - rc_sys[edges.system]))
        w = torch.where(inside, w, torch.zeros_like(w))
        chi_ij = n0[j] / n0[i]  # density ratio seen by i from j

        # Density contributions in both directions: j's parameters for i and vice versa.
        to_i = torch.exp(-eta2[j] * (r - BETA * s0[j])) * chi_ij * w
        to_j = torch.exp(-eta2[i] * (r - BETA * s0[i])) / chi_ij * w
        sigma1 = torch.zeros_like(s0).index_add(0, i, to_i).index_add(0, j, to_j)

        # Atoms without neighbours inside rc_list keep only -E0, as in ASE.
        has_nb = (
            torch.zeros_like(s0).index_add(0, i, inside.to(dtype)).index_add(0, j, inside.to(dtype))
            > 0
        )
        arg = torch.where(has_nb, sigma1 / (12.0 * gamma1), torch.ones_like(sigma1))
        ds = -torch.log(arg) / (BETA * eta2)
        lds = lam * ds
        e_coh = e0 * (1.0 + lds) * torch.exp(-lds) + 6.0 * v0 * torch.exp(-kappa * ds)
        e_atom = torch.where(has_nb, e_coh, torch.zeros_like(e_coh)) - e0

        # Atomic-sphere pair term; each unordered pair once (ASE sums both directions / 2).
        a = -0.5 * v0 / gamma2  # -V0 / (2 gamma2) per atom
        sig2_i = torch.exp(-kappa[j] * (r / BETA - s0[j])) * chi_ij * w
        sig2_j = torch.exp(-kappa[i] * (r / BETA - s0[i])) / chi_ij * w
        e_pair = a[i] * sig2_i + a[j] * sig2_j

        return per_system_sum(e_atom, batch.system_idx, batch.num_systems) + per_system_sum(
            e_pair, edges.system, batch.num_systems
        )


def _fermi(z: torch.Tensor) -> torch.Tensor:
    """``1 / (1 + exp(z))``, the Fermi cutoff.  Not ``torch.sigmoid(-z)``: on CPU its SIMD
    body and scalar tail round differently, so an edge's weight would depend on where it
    lands in the array -- on the batch (tests/models/test_model_batch_independence.py);
    ``exp`` rounds the same in both.  Clamped below float32's overflow: the weight is
    ~1e-35 there, and such edges lie beyond ``rc_list`` (masked) anyway."""
    return 1.0 / (1.0 + torch.exp(z.clamp(max=80.0)))


__all__ = ["EMT", "emt_cutoffs"]
