"""Ramps of a thermostat's temperature or a barostat's pressure over a stage.

Why one object for every thermostat and barostat: each of them reads its targets through
:func:`alchemi_lit.integrators.ops.per_system` (a number, or a tensor indexed by
``system_id``), so a :class:`Ramp` given in their place is evaluated there, per system,
from the system's own step in the stage (``batch.step``, reset to 0 when it enters the
stage).  Nothing in the integrators changes, the same spelling works everywhere::

    Langevin(temperature=Ramp(300, 1000))                       # linear over the stage
    NoseHoover(temperature=Ramp(1000, 300, shape="cosine"))      # cosine annealing
    CRescale(temperature=300, pressure_gpa=Ramp(0, 10, steps=5000, shape="step", levels=6))

and in YAML a mapping in place of the number (``temperature: {start: 300, stop: 1000}``).

The value at stage step ``s`` (``u = min(s / steps, 1)``; after ``steps`` it stays at
``stop``):

* ``linear``: ``start + (stop - start) u``
* ``cosine``: ``stop + (start - stop) (1 + cos(pi u)) / 2`` (cosine annealing)
* ``step``: ``start + (stop - start) k / (levels - 1)``, ``k = min(floor(levels s / steps),
  levels - 1)``: ``levels`` equal plateaus from ``start`` to ``stop``

During step ``s`` (its ``pre_update`` and ``post_update``) the target is the value at
``s``.  It is a function of ``batch.step`` alone -- a field the batch checkpoints -- so a
run resumed mid-ramp gives the same bits, and a system's ramp does not depend on the
systems beside it or on when it joined the batch.  ``start``, ``stop`` and ``steps`` may
each be one value per ``system_id`` (a list) for a different ramp per system.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from .errors import ConfigError
from .tensor_ops import on_device

SHAPES = ("linear", "cosine", "step")


class Ramp:
    """A target going from ``start`` to ``stop`` over ``steps`` steps of its stage.

    Args:
        start: the value at the system's first step in the stage (K, GPa or bar: the
            unit of the parameter it is given for; a number or one per ``system_id``).
        stop: the value from step ``steps`` on.
        steps: stage steps the ramp takes (None: the stage's ``steps``; a number or one
            per ``system_id``), > 0.
        shape: ``"linear"``, ``"cosine"`` (cosine annealing) or ``"step"`` (plateaus).
        levels: number of plateaus of a ``"step"`` ramp (>= 2), the first at ``start``
            and the last at ``stop``.
    """

    def __init__(
        self,
        start: float | Sequence[float] | torch.Tensor,
        stop: float | Sequence[float] | torch.Tensor,
        steps: int | Sequence[int] | torch.Tensor | None = None,
        shape: str = "linear",
        levels: int | None = None,
    ) -> None:
        if shape not in SHAPES:
            raise ConfigError(f"Ramp: shape must be one of {SHAPES}, got {shape!r}")
        if shape == "step":
            if isinstance(levels, bool) or not isinstance(levels, numbers.Integral) or levels < 2:
                raise ConfigError(
                    f"Ramp: a 'step' ramp needs levels (the number of plateaus) >= 2, got "
                    f"{levels!r}; e.g. Ramp(300, 900, shape='step', levels=4) holds 300, 500, "
                    f"700 and 900 K for a quarter of the steps each"
                )
        elif levels is not None:
            raise ConfigError(f"Ramp: levels is for shape='step' only, got shape={shape!r}")
        self.start, self.stop = _value(start, "start"), _value(stop, "stop")
        if steps is not None:
            steps = _value(steps, "steps")
            if not bool((torch.as_tensor(steps) > 0).all()):
                raise ConfigError(f"Ramp: steps must be > 0 (stage steps), got {steps!r}")
        self.steps = steps
        self.shape, self.levels = shape, None if levels is None else int(levels)

    @classmethod
    def from_mapping(cls, spec: Mapping[str, Any]) -> Ramp:
        """A ramp from a YAML mapping (``{start: 300, stop: 1000, shape: cosine}``)."""
        unknown = sorted(set(spec) - {"start", "stop", "steps", "shape", "levels"})
        if unknown or not {"start", "stop"} <= set(spec):
            raise ConfigError(
                f"a ramp is a mapping with start and stop (and optionally steps, shape, "
                f"levels), got {dict(spec)!r}"
            )
        return cls(**spec)

    # ------------------------------------------------------------ derived ramps
    def map(self, fn: Callable[[Any], Any]) -> Ramp:
        """The same ramp with ``fn`` applied to ``start`` and ``stop`` (checks, units)."""
        out = object.__new__(Ramp)
        out.__dict__.update(self.__dict__, start=fn(self.start), stop=fn(self.stop))
        return out

    def __mul__(self, factor: float) -> Ramp:
        return self.map(lambda v: v * factor)

    __rmul__ = __mul__

    def bind(self, steps: int) -> Ramp:
        """This ramp over ``steps`` stage steps where it was given none (an integrator
        calls this with its stage's length)."""
        if self.steps is not None:
            return self
        out = object.__new__(Ramp)
        out.__dict__.update(self.__dict__, steps=max(int(steps), 1))
        return out

    def endpoints(self) -> torch.Tensor:
        """``start`` and ``stop`` as one flat float64 tensor (for checks)."""
        return torch.cat([torch.as_tensor(v, dtype=torch.float64).flatten()
                          for v in (self.start, self.stop)])  # fmt: skip

    def tensors(self) -> dict[str, torch.Tensor]:
        """The per-``system_id`` parts (lists given for start, stop or steps)."""
        parts = {"start": self.start, "stop": self.stop, "steps": self.steps}
        return {k: v for k, v in parts.items() if isinstance(v, torch.Tensor) and v.dim()}

    # ------------------------------------------------------------ values
    def values(self, batch: Any) -> torch.Tensor:
        """``[B]`` the target of each system of ``batch`` at its step in the stage."""
        if self.steps is None:
            raise ConfigError("Ramp: steps unknown; give steps= or pass the ramp to an MD stage")
        dtype, device = batch.dtype, batch.device

        def rows(v: Any) -> Any:
            if isinstance(v, torch.Tensor):
                return on_device(v, device, dtype)[batch.system_id]
            return float(v)

        return self.formula(batch.step.to(dtype), rows(self.start), rows(self.stop),
                            rows(self.steps))  # fmt: skip

    def formula(self, s: torch.Tensor, start: Any, stop: Any, steps: Any) -> torch.Tensor:
        """The module docstring's formulas at steps ``s`` (elementwise; torch)."""
        u = torch.clamp(s / steps, max=1.0)
        if self.shape == "linear":
            return start + (stop - start) * u
        if self.shape == "cosine":
            return stop + (start - stop) * (1.0 + torch.cos(math.pi * u)) * 0.5
        n = self.levels
        k = torch.clamp(torch.floor(s * n / steps), max=n - 1)
        return start + (stop - start) * (k / (n - 1))

    def __repr__(self) -> str:
        def show(v: Any) -> str:
            return "per-system" if isinstance(v, torch.Tensor) else f"{v:g}"

        extra = f", levels={self.levels}" if self.levels else ""
        steps = "stage" if self.steps is None else show(self.steps)
        return (f"Ramp({show(self.start)} -> {show(self.stop)}, steps={steps}, "
                f"shape={self.shape!r}{extra})")  # fmt: skip


def _value(value: Any, name: str) -> float | torch.Tensor:
    """A number, or one per ``system_id`` (a list or tensor) as a float64 tensor."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple)) and all(
        isinstance(v, numbers.Real) and not isinstance(v, bool) for v in value
    ):
        return torch.as_tensor(value, dtype=torch.float64)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    raise ConfigError(
        f"Ramp: {name} must be a number or a list of numbers (one per system_id), got "
        f"{value!r}"
    )


def bind_steps(value: Any, steps: int) -> Any:
    """``value`` as it is, or a :class:`Ramp` over ``steps`` where it gave none."""
    return value.bind(steps) if isinstance(value, Ramp) else value


__all__ = ["SHAPES", "Ramp", "bind_steps"]
