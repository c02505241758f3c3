"""The Hessian by autograd: second derivatives of the model's energy, all systems at once.

A model whose energy is a differentiable function of its edge vectors (it implements
``energy(batch, edges)`` and leaves forces to the base class's autograd) is twice
differentiable by autograd: the Hessian is the gradient of the forces.  The Hessian of
a batch is block-diagonal (one block per system), so one backward pass gives row
``(k, axis)`` of every system's block at once: ``3 x`` (most atoms vibrated in any
system) passes for the whole batch, instead of ``6 n`` force calls per system.

Of the built-in models, :class:`~alchemi_lit.models.EMT` qualifies (smooth Fermi cutoff,
exponentials and a guarded logarithm).  The pair potentials (``LennardJones``,
``Morse``) compute their gradient by hand with in-place operations, and the
``ASECalculatorModel`` gets forces from its calculator: neither can, and asking for
``hessian="analytic"`` with them is an error before anything runs.  MLIP plugins that
override ``forward`` or ``energy_and_edge_gradient`` are refused the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..core.errors import ConfigError
from ..models.base import Model


def twice_differentiable(model: Model) -> bool:
    """The model's energy comes from ``energy(batch, edges)`` and its forces from the base
    class's autograd (so a second autograd pass through it is exact)."""
    cls = type(model)
    return (
        cls.energy is not Model.energy
        and cls.energy_and_edge_gradient is Model.energy_and_edge_gradient
        and cls.forward is Model.forward
    )


def require_twice_differentiable(model: Model) -> None:
    """An error naming the model when autograd cannot give its Hessian."""
    if not twice_differentiable(model):
        raise ConfigError(
            f"vibrations: hessian='analytic' needs a model whose energy autograd can "
            f"differentiate twice (energy(batch, edges), forces from the base class, as "
            f"EMT); {type(model).__name__} computes its forces itself: use "
            f"hessian='finite_difference'"
        )


def analytic_hessians(
    systems: Sequence[Any], model: Model, indices: Sequence[np.ndarray], precision: Any
) -> list[np.ndarray]:
    """Per system the ``(3n, 3n)`` Hessian (eV/Å^2) of the atoms ``indices`` at its
    positions, from one batched graph (float64 unless ``precision`` is "32")."""
    import torch

    from ..core.state import Batch
    from ..models.base import list_skin
    from ..models.neighbors import Edges, NeighborList

    require_twice_differentiable(model)
    if not systems:
        return []
    dtype = torch.float32 if str(precision or "64").startswith("32") else torch.float64
    device = next((t.device for t in [*model.parameters(), *model.buffers()]), "cpu")
    batch = Batch.from_atoms(list(systems), dtype=dtype, device=device)
    edges = NeighborList(model.cutoff, list_skin(model.cutoff, 0.0))(batch)
    with torch.enable_grad():
        x = batch.positions.detach().clone().requires_grad_(True)
        moved = x[edges.j] - x[edges.i]
        vec = edges.vec.detach() + moved - moved.detach()  # same values, x-dependent
        energy = model.energy(batch, Edges(edges.i, edges.j, vec, edges.system, edges.cutoff))
        (grad,) = torch.autograd.grad(energy.sum(), x, create_graph=True)
        counts = [len(a) for a in systems]
        offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        blocks = [np.zeros((3 * len(sel), 3 * len(sel))) for sel in indices]
        most = max(len(sel) for sel in indices)
        for k in range(most):
            for axis in range(3):
                seed = torch.zeros_like(x)
                having = [s for s, sel in enumerate(indices) if len(sel) > k]
                rows = [int(offsets[s] + indices[s][k]) for s in having]
                seed[rows, axis] = 1.0
                (row,) = torch.autograd.grad(grad, x, seed, retain_graph=True)
                row = row.detach().to(torch.float64).cpu().numpy()
                for s in having:
                    atoms = offsets[s] + indices[s]
                    blocks[s][3 * k + axis] = row[atoms].ravel()
    return [0.5 * (b + b.T) for b in blocks]
