"""What a batch's status tensor says, and the per-step bookkeeping of stage exits.

The step loop (:mod:`.step`) reads these every step, so they are made to cost nothing
on the steps where no system changes stage: masks are recomputed only when the status
tensor changes, and an MD stage whose systems all have steps left skips its exit test
(:class:`Countdown`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .. import kernels
from ..core.state import EXIT_MODEL_ERROR, EXIT_QUARANTINED, Batch
from ..core.tensor_ops import may_be_set
from ..integrators.convergence import Criterion

#: Status of systems appended by a refill: no stage touches them until the next
#: forward has computed their forces; then they enter the plan.
PENDING = -1


class StatusMasks(NamedTuple):
    """What a batch's status tensor says, per :class:`FusedLoop` plan (see
    :meth:`FusedLoop.status_masks`)."""

    stages: list[torch.Tensor]  # [B] mask of each stage's systems, in plan order
    held: list[bool]  # whether each stage may hold a system (always True off CPU)
    steps: torch.Tensor  # [B] int64: 1 for the systems a step moves (in any stage), else 0
    finished: torch.Tensor  # [B] systems at the plan's exit code
    any_finished: bool  # whether there may be one (always True off CPU)


def failed_exit(exit_code: torch.Tensor) -> torch.Tensor:
    """``[B]`` systems that left for a failure (non-finite values, a model error): never
    reported converged, whatever an earlier stage said."""
    return (exit_code == EXIT_QUARANTINED) | (exit_code == EXIT_MODEL_ERROR)


def step_increments(stage_masks: list[torch.Tensor]) -> torch.Tensor:
    """``[B]`` int64 step-counter increments: 1 for systems in any of the stages."""
    return torch.stack(stage_masks).any(0).to(torch.int64)


def leaving(
    batch: Batch, max_steps: int, mask: torch.Tensor, converged: torch.Tensor | None
) -> tuple[torch.Tensor, bool, int | None]:
    """The systems of ``mask`` that leave their stage (out of steps, or ``converged``)
    ``[B]``, whether any does (True on an accelerator, where that is not read), and on
    CPU the fewest steps any other system of ``mask`` has left (None elsewhere)."""
    judged = converged if converged is not None else mask[:0]
    if kernels.usable(batch.step, mask, judged):  # one compiled call
        exits = kernels.load("bookkeeping").stage_exits
        leave, anyone, left = exits(batch.step.numpy(), max_steps, mask.numpy(), judged.numpy())
        return torch.from_numpy(leave), anyone, left
    leave = mask & (batch.step >= max_steps)
    if converged is not None:
        leave = leave | (mask & converged)
    return leave, may_be_set(leave), None


class Countdown(NamedTuple):
    """How many more steps every system of a stage without a criterion has before the
    first runs out of them, valid while the batch has these step and status tensors
    at these versions and the stage this budget: until then nobody can leave, and
    transitions need not look."""

    step: torch.Tensor
    step_version: int
    status: torch.Tensor
    status_version: int
    max_steps: int
    left: int

    def holds(self, batch: Batch, max_steps: int) -> bool:
        step, status = batch.step, batch.status
        return (
            self.left > 0
            and self.max_steps == max_steps
            and self.step is step
            and self.step_version == step._version
            and self.status is status
            and self.status_version == status._version
        )


def records_history(criterion: Criterion) -> bool:
    """Whether ``criterion`` keeps a history (:meth:`~alchemi_lit.integrators.convergence.Criterion.
    update` overridden), which transitions must then update every step."""
    return type(criterion).update is not Criterion.update
