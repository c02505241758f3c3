"""The fused loop's per-step bookkeeping as compiled CPU loops (see
:mod:`alchemi_lit.kernels`): the step counters and the test of who leaves a stage,
one call each instead of two to five torch operations on a few dozen numbers."""

from __future__ import annotations

import numpy as np

from .cache import compiled


@compiled
def advance_steps(step, total_steps, increments):
    """New ``(step, total_steps)``: both plus ``increments`` ``[B]``."""
    return step + increments, total_steps + increments


@compiled
def stage_exits(step, max_steps, mask, converged):
    """The systems of ``mask`` that leave their stage -- ``step >= max_steps``, or
    ``converged`` where that is given (an empty array: no criterion) --, whether any
    does, and the fewest steps any other system of ``mask`` has left (2**62 if none)."""
    leave = np.zeros(mask.shape[0], dtype=np.bool_)
    judged = converged.shape[0] > 0
    anyone = False
    left = 2**62
    for b in range(mask.shape[0]):
        if not mask[b]:
            continue
        if step[b] >= max_steps or (judged and converged[b]):
            leave[b] = anyone = True
        else:
            left = min(left, max_steps - step[b])
    return leave, anyone, left
