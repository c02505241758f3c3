"""Edges of a neighbour list: the pairs a model sees, the sums it makes over them, and
their canonical order (which every builder gives, so that sums do not depend on it).

(Moved out of :mod:`.neighbors` and :mod:`.pair_search`, which still export them.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.segments import run_sums


@dataclass
class Edges:
    """Half list of pairs (each unordered pair once) within ``cutoff + skin``.

    ``vec = positions[j] - positions[i] + shift`` points from i to j.  Pairs with
    ``|vec| > cutoff`` are present and must be masked by the model (they are what
    makes the skin work).

    ``atom_counts``/``system_counts``/``j_flat`` are set by :class:`NeighborList` on CPU, where its
    edges are sorted by ``i`` (hence by system).  There the sum over each atom's run of edges and
    each system's are run sums (:func:`~alchemi_lit.core.segments.run_sums`: cheaper than
    ``index_add_`` on CPU), the pull on atoms j a flat bincount: all three add their terms one after
    another in edge order, so a sum depends on its own terms alone -- not on the edges of other
    systems around it (no BLAS product, whose blocking follows the whole array's shape:
    docs/design/45-batch-independence-by-construction.md), nor on edges beyond the cutoff (exact
    zeros).  On GPU they stay None and the reductions use ``index_add_`` (no host sync).
    """

    i: torch.Tensor
    j: torch.Tensor
    vec: torch.Tensor
    system: torch.Tensor
    cutoff: float
    atom_counts: torch.Tensor | None = None  # edges per atom i  [N]
    system_counts: torch.Tensor | None = None  # edges per system  [B]
    j_flat: torch.Tensor | None = None  # 3 j + (0, 1, 2)  [3 P]

    def directed(self) -> Edges:
        """Both directions of every pair (for message-passing models)."""
        return Edges(
            torch.cat([self.i, self.j]),
            torch.cat([self.j, self.i]),
            torch.cat([self.vec, -self.vec]),
            torch.cat([self.system, self.system]),
            self.cutoff,
        )

    def system_sum(self, values: torch.Tensor, num_systems: int) -> torch.Tensor:
        """Sum per-edge ``values`` ``[P]`` or ``[P, k]`` into systems ``[B]`` / ``[B, k]``."""
        if self.system_counts is not None:
            return run_sums(values, self.system_counts)
        out = values.new_zeros((num_systems, *values.shape[1:]))
        return out.index_add_(0, self.system, values)

    def forces(self, grad: torch.Tensor, num_atoms: int) -> torch.Tensor:
        """``F_i = sum_j dE/dvec_ij - sum_k dE/dvec_ki`` from the edge gradient ``[P, 3]``."""
        if self.atom_counts is not None and self.j_flat is not None:
            out = run_sums(grad, self.atom_counts)
            pulled = torch.bincount(self.j_flat, weights=grad.reshape(-1), minlength=3 * num_atoms)
            return out.sub_(pulled.view(num_atoms, 3))
        out = grad.new_zeros((num_atoms, 3))
        # (-grad, not alpha=-1: index_add_ with alpha takes a slower path on CPU)
        return out.index_add_(0, self.i, grad).index_add_(0, self.j, -grad)


def canonical_order(i: torch.Tensor, j: torch.Tensor, ishift: torch.Tensor, n: int) -> torch.Tensor:
    """Permutation sorting edges by (i, j, shift): deterministic whatever the build order.

    One sort of a combined int64 key (i, j and the three integer shifts in mixed radix).
    """
    if len(i) == 0:
        return torch.zeros(0, dtype=torch.long, device=i.device)
    span = int(ishift.abs().max()) if ishift.numel() else 0
    base = 2 * span + 1
    if n * n * base**3 >= 2**62:  # astronomically large: fall back to chained stable sorts
        order = torch.arange(len(i), device=i.device)
        for key in (ishift[:, 2], ishift[:, 1], ishift[:, 0], j, i):
            order = order[torch.sort(key[order], stable=True).indices]
        return order
    s = ishift + span
    key = ((i * n + j) * base + s[:, 0]) * base * base + s[:, 1] * base + s[:, 2]
    return torch.sort(key).indices
