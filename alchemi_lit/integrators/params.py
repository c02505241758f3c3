"""Checks of integrator parameters: clear errors for impossible values, a warning for
values most likely given in another unit.

An integrator's parameters are numbers in the units of :mod:`alchemi_lit.units` (time
in fs, temperature in K, force in eV/Å) or per-system lists/tensors indexed by
``system_id``.  Text such as ``"300K"`` is refused with the number to write instead.
A value far outside its usual range (:class:`Usual`) is allowed but reported once as
a :class:`~alchemi_lit.errors.UnitWarning` naming the value most likely meant: TorchSim
takes time in ps, so ``Langevin(dt=0.002)`` would otherwise run 0.002 fs steps in
silence, and ``fmax=50`` (meV/Å) would converge at step 0.
"""

from __future__ import annotations

import math
import numbers
import os
import re
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from ..errors import ConfigError, UnitWarning

Param = float | torch.Tensor


class Usual(NamedTuple):
    """The usual range of a parameter, and what a value outside it most likely means:
    ``below``/``above`` is ``(factor, reading)``: the value meant is ``value * factor``,
    and ``reading`` says how the given one reads (``{value}``, its inverse ``{inverse}``)."""

    low: float
    high: float
    below: tuple[float, str] | None = None
    above: tuple[float, str] | None = None


#: time steps (fs): a step in ps, or in as
TIME_STEP = Usual(0.05, 20.0, (1e3, "{value} ps"), (1e-3, "{value} as"))
#: Langevin friction (1/fs): a rate per ps
FRICTION = Usual(1e-5, 1.0, (1e3, "a damping time of {inverse} fs"), (1e-3, "{value} 1/ps"))
#: temperatures (K)
TEMPERATURE = Usual(0.0, 1e5, None, (1e-3, "{value} mK"))
#: force thresholds (eV/Å): meV/Å
FORCE = Usual(0.0, 5.0, None, (1e-3, "{value} meV/Å"))

_warned: set[tuple[str, str, float]] = set()
_PACKAGE = str(Path(__file__).resolve().parents[1]) + os.sep


def as_param(
    value: Param | Sequence[float], name: str = "value", owner: str = "", unit: str = ""
) -> Param:
    """A number or tensor as it is, a list/tuple as a float64 tensor (per-system values
    indexed by ``system_id``); text (``"300K"``) is a :class:`ConfigError` naming the fix."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        value = [as_param(v, name, owner, unit) for v in value]
        return torch.as_tensor(value, dtype=torch.float64)
    if isinstance(value, torch.Tensor) or (
        isinstance(value, numbers.Real) and not isinstance(value, bool)
    ):
        return value
    number = re.match(r"\s*([-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?)", str(value))
    fix = f"{name}={float(number.group(1))!r}" if number else f"{name}=<a number>"
    in_unit, implied = (f" in {unit}", f" ({unit} is implied)") if unit else ("", "")
    raise ConfigError(
        f"{owner + ': ' if owner else ''}{name} must be a number{in_unit} (or a list of them, "
        f"one per system), got {value!r}; write {fix}{implied}"
    )


def check_param(
    name: str,
    owner: str,
    value: Param | Sequence[float],
    minimum: float = 0.0,
    strict: bool = True,
    *,
    unit: str = "",
    usual: Usual | None = None,
) -> Param:
    """``value`` (see :func:`as_param`) as a float or a tensor, finite and ``> minimum``
    (``>=`` unless ``strict``), else a :class:`ConfigError` naming ``owner``'s ``name``
    and ``unit``; outside ``usual`` a :class:`UnitWarning` (:func:`warn_if_unusual`)."""
    value = as_param(value, name, owner, unit)
    label, op = f"{name} ({unit})" if unit else name, ">" if strict else ">="
    if isinstance(value, torch.Tensor):
        bad = ~torch.isfinite(value) | ((value <= minimum) if strict else (value < minimum))
        if bool(bad.any()):
            raise ConfigError(f"{owner}: every {label} must be {op} {minimum}, got {value}")
    else:
        value = float(value)
        if not math.isfinite(value) or not (value > minimum if strict else value >= minimum):
            raise ConfigError(f"{owner}: {label} must be {op} {minimum}, got {value}")
    if usual is not None:
        warn_if_unusual(owner, name, value, unit, usual)
    return value


def check_positive(
    owner: str, name: str, value: Param | Sequence[float], unit: str = "",
    usual: Usual | None = None,
) -> Param:  # fmt: skip
    """:func:`check_param`: finite and > 0."""
    return check_param(name, owner, value, unit=unit, usual=usual)


def check_range(owner: str, name: str, value: float, low: float, high: float) -> float:
    """A number in ``[low, high]`` (either end may be infinite), else a ConfigError."""
    number = float(as_param(value, name, owner))
    if not low <= number <= high:
        raise ConfigError(f"{owner}: {name} must be in [{low}, {high}], got {value}")
    return number


def check_count(owner: str, name: str, value: int, minimum: int = 0, what: str = "") -> int:
    """An integer ``>= minimum`` (integral floats pass), else a ConfigError."""
    label = f"{name} ({what})" if what else name
    if isinstance(value, str) or not isinstance(value, numbers.Real) or value != int(value):
        raise ConfigError(f"{owner}: {label} must be an integer >= {minimum}, got {value!r}")
    if int(value) < minimum:
        raise ConfigError(f"{owner}: {label} must be >= {minimum}, got {value}")
    return int(value)


def warn_if_unusual(owner: str, name: str, value: Param, unit: str, usual: Usual) -> None:
    """A :class:`UnitWarning` (once per owner, parameter and value) when ``value`` (or
    an element of it) lies outside ``usual``, naming the value most likely meant."""
    values = value.flatten().tolist() if isinstance(value, torch.Tensor) else [value]
    for v in values:
        side = usual.below if v < usual.low else usual.above if v > usual.high else None
        if side is None or (owner, name, v) in _warned:
            continue
        _warned.add((owner, name, v))
        factor, reading = side
        meant = f"{v * factor:.6g} {unit}"
        why = reading.format(value=f"{v:g}", inverse=f"{1 / v:g}" if v else "inf")
        warnings.warn(
            f"{owner}: {name}={v:g} {unit} is outside the usual {usual.low:g}-{usual.high:g} "
            f"{unit}; did you mean {meant} ({why})?  {name} is in {unit}.",
            UnitWarning,
            stacklevel=_user_stacklevel(),
        )


def _user_stacklevel() -> int:
    """The stack level of the first caller outside alchemi_lit (the line that made the
    integrator), for ``warnings.warn``."""
    frame, level = sys._getframe(2), 2
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


__all__ = [
    "FORCE",
    "FRICTION",
    "TEMPERATURE",
    "TIME_STEP",
    "Param",
    "Usual",
    "as_param",
    "check_count",
    "check_param",
    "check_positive",
    "check_range",
    "warn_if_unusual",
]
