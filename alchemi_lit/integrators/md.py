"""Base of molecular-dynamics integrators: time step, step count, starting velocities."""

from __future__ import annotations

from typing import ClassVar

import torch

from ..core.schedule import Ramp, bind_steps
from ..core.state import Batch
from ..core.tensor_ops import row_sum
from ..core.units import fs
from . import ops
from .base import Integrator
from .params import TIME_STEP, Param, Rows, check_param, check_temperature, check_time_constant
from .velocities import maxwell_boltzmann


class MDIntegrator(Integrator):
    """Base of molecular-dynamics integrators: time step, step count, temperature.

    ``steps`` is the stage's length; ``temperature`` may be a
    :class:`~alchemi_lit.core.schedule.Ramp` (over the stage's ``steps`` unless it gives
    its own).  With a ``temperature``, a
    system entering the
    stage with all-zero velocities gets Maxwell-Boltzmann velocities at that
    temperature (zero total momentum), drawn from its own random stream; systems that
    arrive moving keep their velocities.

    Temperature 0, one rule for every thermostat and barostat: ``temperature >= 0``,
    and 0 K is a quench (the thermostat drains the kinetic energy; a system entering at
    rest stays at rest).  A method that cannot do 0 K says why in :attr:`no_zero_kelvin`
    and refuses it with that reason (Nosé-Hoover chains: their masses are ``∝ kT``).
    Time constants (``taut``, ``tdamp``, ``pdamp``, ``taup``) must span at least two time
    steps (:meth:`time_constant`).

    Args:
        dt: time step in fs (a number, or one per system as a list indexed by system_id).
        steps: the stage's number of steps.
        temperature: K; seeds Maxwell-Boltzmann velocities for systems at rest (None:
            no velocities drawn).
    """

    budget_name = "steps"
    #: the fraction of ``dt`` the last drift before the force call spans: the step loop
    #: turns a constraint's position correction into a velocity over it (RATTLE;
    #: :mod:`.constrain`)
    constraint_drift: ClassVar[float] = 1.0
    #: why this method cannot run at 0 K (None: it can, as a quench)
    no_zero_kelvin: ClassVar[str | None] = None

    def __init__(self, dt: Param, steps: int, temperature: Param | None = None) -> None:
        super().__init__(steps)
        owner = type(self).__name__
        self.dt_fs = check_param("dt", owner, dt, unit="fs", usual=TIME_STEP)
        self.dt = self.dt_fs * fs
        self.temperature = None if temperature is None else bind_steps(check_temperature(
            owner, temperature, type(self).no_zero_kelvin
        ), self.max_steps)  # fmt: skip

    @property
    def steps(self) -> int:
        return self.max_steps

    def init_systems(self, batch: Batch, mask: torch.Tensor) -> None:
        super().init_systems(batch, mask)
        if self.temperature is not None:
            still = ops.system_sum(batch, row_sum(batch.velocities.abs())) == 0
            maxwell_boltzmann(batch, mask & still, self.temperature, self.seed)

    def time_constant(self, name: str, value: Param) -> Param:
        """A thermostat's or barostat's time constant ``name`` in fs, checked against the
        time step (:func:`~.params.check_time_constant`)."""
        return check_time_constant(type(self).__name__, name, value, self.dt_fs)


def describe(value: Param | None) -> str:
    """Short text for a parameter in a repr: a number, or ``per-system`` for tensors."""
    if isinstance(value, (torch.Tensor, Rows)):
        return "per-system"
    if isinstance(value, Ramp):
        return repr(value)
    return repr(float(value)) if value is not None else "None"


__all__ = ["MDIntegrator", "describe", "maxwell_boltzmann"]
