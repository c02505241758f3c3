"""Per-system convergence criteria as batched tensor operations.

A criterion maps the batch to a ``[B]`` boolean tensor with no host sync.  Criteria
combine with ``&`` and ``|`` (or ``All(parts=[...])`` / ``Any(parts=[...])`` in a
config, where they are registered plugins of kind ``criterion``: ``criterion:
{class_path: ForceMax, init_args: {fmax: 0.01}}``).  The step budget is not a
criterion: a stage that runs out of steps exits with reason ``max_steps`` and the
system is reported as not converged, which keeps "converged" meaning what users expect.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from ..core.backends import primitive

if TYPE_CHECKING:
    from ..core.state import Batch


class Criterion:
    """Base: ``criterion(batch) -> [B] bool``; ``update(batch)`` after every step."""

    def __call__(self, batch: Batch) -> torch.Tensor:
        raise TypeError(f"{type(self).__name__} does not define __call__")

    def bind(self, prefix: str) -> None:
        """Name this criterion's fields after its stage (stable across processes)."""

    def declare(self, batch: Batch) -> None:
        """Create the per-system fields the criterion needs (none by default)."""

    def reset(self, batch: Batch, mask: torch.Tensor) -> None:
        """Forget history for systems entering the stage."""

    def update(self, batch: Batch, mask: torch.Tensor) -> None:
        """Record what the next evaluation compares against."""

    def __and__(self, other: Criterion) -> Criterion:
        return All(self, other)

    def __or__(self, other: Criterion) -> Criterion:
        return Any_(self, other)


class ForceMax(Criterion):
    """Largest per-atom force norm below ``fmax`` (eV/Å), as ``ase.optimize`` checks it.

    Args:
        fmax: force threshold in eV/Å (> 0).
    """

    def __init__(self, fmax: float) -> None:
        if not fmax > 0:
            raise ValueError(f"fmax must be > 0 eV/Å, got {fmax}")
        self.fmax = float(fmax)

    def __call__(self, batch: Batch) -> torch.Tensor:
        return largest_force_below(batch, self.fmax)

    def __repr__(self) -> str:
        return f"ForceMax({self.fmax})"


@primitive
def largest_force_below(batch: Batch, fmax: float) -> torch.Tensor:
    """Whether each system's largest atomic force is below ``fmax`` ``[B]`` (a system
    with a NaN force is not).  A primitive: one compiled pass on CPU (:mod:`.backends`)."""
    f2 = batch.force_sq_norms()
    fmax2 = torch.zeros(batch.num_systems, dtype=f2.dtype, device=f2.device)
    fmax2 = fmax2.scatter_reduce(0, batch.system_idx, f2, "amax", include_self=True)
    return fmax2 < fmax**2


class EnergyChange(Criterion):
    """Energy changed by less than ``tol`` eV (per atom with ``per_atom``) since the last step.

    Args:
        tol: energy tolerance in eV (eV/atom with ``per_atom``; > 0).
        per_atom: compare the change per atom instead of per system.
    """

    def __init__(self, tol: float, per_atom: bool = False) -> None:
        if not tol > 0:
            raise ValueError(f"energy tolerance must be > 0 eV, got {tol}")
        self.tol = float(tol)
        self.per_atom = per_atom
        self.field = "crit_prev_energy"

    def bind(self, prefix: str) -> None:
        self.field = f"{prefix}_prev_energy"

    def declare(self, batch: Batch) -> None:
        batch.ensure_field(self.field, "system", fill=float("nan"))

    def reset(self, batch: Batch, mask: torch.Tensor) -> None:
        prev = getattr(batch, self.field)
        prev.masked_fill_(mask, float("nan"))

    def __call__(self, batch: Batch) -> torch.Tensor:
        delta = (batch.energy - getattr(batch, self.field)).abs()
        if self.per_atom:
            delta = delta / batch.n_atoms.to(delta.dtype)
        return delta < self.tol  # NaN (no previous energy) compares False

    def update(self, batch: Batch, mask: torch.Tensor) -> None:
        prev = getattr(batch, self.field)
        prev.copy_(torch.where(mask, batch.energy, prev))

    def __repr__(self) -> str:
        return f"EnergyChange({self.tol}{', per_atom=True' if self.per_atom else ''})"


class _Combined(Criterion):
    def __init__(self, *criteria: Criterion, parts: Sequence[Criterion] = ()) -> None:
        self.parts = (*criteria, *parts)
        name = "Any" if isinstance(self, Any_) else type(self).__name__
        if not self.parts:
            raise ValueError(f"{name} needs at least one criterion in parts, got none")
        for p in self.parts:
            if not isinstance(p, Criterion):
                raise TypeError(f"{name}: parts must be criteria, got {type(p).__name__}")

    def bind(self, prefix: str) -> None:
        for k, p in enumerate(self.parts):
            p.bind(f"{prefix}_{k}")

    def declare(self, batch: Batch) -> None:
        for p in self.parts:
            p.declare(batch)

    def reset(self, batch: Batch, mask: torch.Tensor) -> None:
        for p in self.parts:
            p.reset(batch, mask)

    def update(self, batch: Batch, mask: torch.Tensor) -> None:
        for p in self.parts:
            p.update(batch, mask)


class All(_Combined):
    """Every part holds (``a & b``).

    Args:
        parts: the criteria that must all hold.
    """

    def __call__(self, batch: Batch) -> torch.Tensor:
        out = self.parts[0](batch)
        for p in self.parts[1:]:
            out = out & p(batch)
        return out

    def __repr__(self) -> str:
        return " & ".join(map(repr, self.parts))


class Any_(_Combined):
    """At least one part holds (``a | b``); registered as ``Any``.

    Args:
        parts: the criteria of which one must hold.
    """

    def __call__(self, batch: Batch) -> torch.Tensor:
        out = self.parts[0](batch)
        for p in self.parts[1:]:
            out = out | p(batch)
        return out

    def __repr__(self) -> str:
        return " | ".join(map(repr, self.parts))
