"""Integrator base class: the plugin contract of optimizers and MD methods.

An integrator is a pure description (parameters only).  Everything it remembers
about a system lives in batch fields it declares in :attr:`Integrator.fields`, so a
system can be moved, packed or checkpointed mid-stage without its help.  The step
loop calls, for the systems of its stage (``mask``, a ``[B]`` bool tensor)::

    init_systems(batch, mask)   # a system enters the stage: fresh state
    pre_update(batch, mask)     # before the force call (positions move here)
    post_update(batch, mask)    # after the force call (second half-kick ...)
    converged(batch)            # optimizers: [B] bool, checked on the new forces

Updates must leave unmasked systems bit-for-bit untouched (``torch.where``, never
in-place writes over the whole batch) -- several stages share one batch.  The steps
they are made of (kick, drift, FIRE's update, keyed noise ...) are in :mod:`.ops`,
parameter checks in :mod:`.params`; MD methods subclass :class:`~.md.MDIntegrator`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch

from ..core.state import Batch
from . import ops
from .convergence import Criterion
from .params import check_count

if TYPE_CHECKING:
    from .stages import Fused, Pipeline


@dataclass(frozen=True)
class FieldSpec:
    """A batch field owned by an integrator; created by :meth:`Integrator.setup`."""

    kind: Literal["atom", "system"]
    shape: tuple[int, ...] = ()
    dtype: Literal["float", "int64", "bool"] = "float"
    fill: float | int | bool = 0


class Integrator:
    """Base class of every stage method.  See the module docstring for the contract.

    Args:
        max_steps: the stage's step budget (force calls), >= 0.
    """

    #: Optimizers converge (criterion) and leave velocities at zero when they exit.
    is_optimizer: ClassVar[bool] = False
    #: Fields this integrator keeps in the batch.
    fields: ClassVar[dict[str, FieldSpec]] = {}
    #: Set by :meth:`compile` (``Simulator(compile=True)``): hot kernels run compiled.
    compiled_kernels: bool = False
    #: the name of the step budget in messages (MD: ``steps``)
    budget_name: ClassVar[str] = "max_steps"

    def __init__(self, max_steps: int) -> None:
        owner = type(self).__name__
        self.max_steps = check_count(owner, self.budget_name, max_steps, 0, "the step budget")
        self.seed = 0
        self.criterion: Criterion | None = None

    # ----------------------------------------------------------------- plans
    def __add__(self, other: Integrator | Fused) -> Fused:
        from .stages import Fused

        return Fused([self]) + other

    def __or__(self, other: Any) -> Pipeline:
        from .stages import Fused

        return Fused([self]) | other

    def __repr__(self) -> str:
        return type(self).__name__

    # ----------------------------------------------------------------- framework calls
    def setup(self, batch: Batch, seed: int, prefix: str) -> None:
        """Declare fields on ``batch`` and bind the run's seed (called once per run)."""
        self.seed = int(seed)
        dtypes = {"float": batch.dtype, "int64": torch.int64, "bool": torch.bool}
        for name, spec in self.fields.items():
            batch.ensure_field(name, spec.kind, spec.shape, dtypes[spec.dtype], spec.fill)
        if self.criterion is not None:
            self.criterion.bind(prefix)
            self.criterion.declare(batch)

    def init_systems(self, batch: Batch, mask: torch.Tensor) -> None:
        """Reset this integrator's fields for systems entering the stage."""
        for name, spec in self.fields.items():
            t = getattr(batch, name)
            m = mask if spec.kind == "system" else batch.atom_mask(mask)
            t.masked_fill_(m.view(-1, *([1] * (t.dim() - 1))), spec.fill)
        if self.criterion is not None:
            self.criterion.reset(batch, mask)

    def pre_update(self, batch: Batch, mask: torch.Tensor) -> None:
        """Update before the force call; default: nothing."""

    def post_update(self, batch: Batch, mask: torch.Tensor) -> None:
        """Update after the force call; default: nothing."""

    def converged(self, batch: Batch) -> torch.Tensor | None:
        """Per-system convergence ``[B]`` on the current forces; None for MD."""
        return None if self.criterion is None else self.criterion(batch)

    def compile(self) -> None:
        """Draw this integrator's keyed noise with the kernel compiled by
        ``torch.compile`` (:func:`~alchemi_lit.core.random.compiled_atom_normals`).  Called for
        every stage by ``Simulator(compile=True)``.  Only a flag: the integrator stays a
        picklable description; compiled functions are looked up where they are used."""
        self.compiled_kernels = True

    def normals(self, batch: Batch, purpose: int) -> torch.Tensor:
        """This step's keyed standard normals ``[N, 3]`` (:func:`.noise.normals`)."""
        return ops.normals(batch, self, purpose)

    # selection helpers, kept as methods for integrators written against them (see ops)
    atom_mask = staticmethod(ops.atom_mask)
    moving_atoms = staticmethod(ops.moving_atoms)
    masked = staticmethod(ops.masked)
    per_system = staticmethod(ops.per_system)
    per_xyz = staticmethod(ops.per_xyz)


__all__ = ["FieldSpec", "Integrator"]
