"""Base of molecular-dynamics integrators: time step, step count, starting velocities."""

from __future__ import annotations

import torch

from ..state import Batch
from ..tensor_ops import row_sum
from ..units import fs
from . import ops
from .base import Integrator
from .ops import maxwell_boltzmann
from .params import TEMPERATURE, TIME_STEP, Param, check_param


class MDIntegrator(Integrator):
    """Base of molecular-dynamics integrators: time step, step count, temperature.

    ``steps`` is the stage's length.  With a ``temperature``, a system entering the
    stage with all-zero velocities gets Maxwell-Boltzmann velocities at that
    temperature (zero total momentum), drawn from its own random stream; systems that
    arrive moving keep their velocities.

    Args:
        dt: time step in fs (a number, or one per system as a list indexed by system_id).
        steps: the stage's number of steps.
        temperature: K; seeds Maxwell-Boltzmann velocities for systems at rest (None:
            no velocities drawn).
    """

    budget_name = "steps"

    def __init__(self, dt: Param, steps: int, temperature: Param | None = None) -> None:
        super().__init__(steps)
        owner = type(self).__name__
        self.dt_fs = check_param("dt", owner, dt, unit="fs", usual=TIME_STEP)
        self.dt = self.dt_fs * fs
        self.temperature = None if temperature is None else check_param(
            "temperature", owner, temperature, strict=False, unit="K", usual=TEMPERATURE
        )  # fmt: skip

    @property
    def steps(self) -> int:
        return self.max_steps

    def init_systems(self, batch: Batch, mask: torch.Tensor) -> None:
        super().init_systems(batch, mask)
        if self.temperature is not None:
            still = ops.system_sum(batch, row_sum(batch.velocities.abs())) == 0
            maxwell_boltzmann(batch, mask & still, self.temperature, self.seed)

    def dt_tensor(self, batch: Batch) -> Param:
        """The time step per system (:func:`~.ops.per_system`), in ASE's time unit."""
        return ops.per_system(batch, self.dt)


def describe(value: Param | None) -> str:
    """Short text for a parameter in a repr: a number, or ``per-system`` for tensors."""
    if isinstance(value, torch.Tensor):
        return "per-system"
    return repr(float(value)) if value is not None else "None"


__all__ = ["MDIntegrator", "describe", "maxwell_boltzmann"]
