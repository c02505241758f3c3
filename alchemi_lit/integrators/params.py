"""Checks of integrator parameters: clear errors for impossible values, a warning for
values most likely given in another unit.

An integrator's parameters are numbers in the units of :mod:`alchemi_lit.core.units` (time
in fs, temperature in K, force in eV/Å) or per-system lists/tensors indexed by
``system_id``.  Text such as ``"300K"`` is refused with the number to write instead.
A value far outside its usual range (:class:`Usual`) is allowed but reported once as
a :class:`~alchemi_lit.core.errors.UnitWarning` naming the value most likely meant: TorchSim
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from ..core.errors import ConfigError, UnitWarning
from ..core.schedule import Ramp
from ..core.units import GPa, bar

#: a parameter: a number, one per system_id, or (temperatures and pressures) a ramp --
#: :class:`~alchemi_lit.core.schedule.Ramp`, in YAML a mapping ``{start: .., stop: ..}``
Param = float | torch.Tensor | dict[str, Any]
#: the parameters a :class:`~alchemi_lit.core.schedule.Ramp` may stand for
RAMPED = frozenset({"temperature", "pressure_gpa", "pressure_bar", "scalar_pressure"})


@dataclass(frozen=True)
class Rows:
    """A per-system parameter read from the batch field ``field`` (``[B]``, one value per
    batch row, not indexed by ``system_id``): what a value that moves between systems
    during a run is -- a replica exchange's temperatures
    (:class:`~.tempering.ReplicaExchange`).  :func:`~.ops.per_system` reads it."""

    field: str


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
#: external pressures (GPa): a value in bar given as GPa
PRESSURE_GPA = Usual(-100.0, 1000.0, (1e-4, "{value} bar"), (1e-4, "{value} bar"))
#: external pressures (bar): a value in Pa given as bar
PRESSURE_BAR = Usual(-1e6, 1e7, (1e-5, "{value} Pa"), (1e-5, "{value} Pa"))
#: external pressures (eV/Å^3): a value in GPa given as eV/Å^3 (1 reads as 160 GPa; the
#: range stops at 80 GPa, as a GPa number people give is 1-100)
PRESSURE_EV_A3 = Usual(-0.5, 0.5, (GPa, "{value} GPa"), (GPa, "{value} GPa"))
#: the units an external pressure is given in: name -> (unit, eV/Å^3 per unit, Usual)
PRESSURES = {
    "pressure_gpa": ("GPa", GPa, PRESSURE_GPA),
    "pressure_bar": ("bar", bar, PRESSURE_BAR),
    "scalar_pressure": ("eV/Å^3", 1.0, PRESSURE_EV_A3),
}

_warned: set[tuple[str, str, float]] = set()
_PACKAGE = str(Path(__file__).resolve().parents[1]) + os.sep


def as_param(
    value: Param | Sequence[float], name: str = "value", owner: str = "", unit: str = ""
) -> Param:
    """A number or tensor as it is, a list/tuple as a float64 tensor (per-system values
    indexed by ``system_id``); text (``"300K"``) is a :class:`ConfigError` naming the fix."""
    if isinstance(value, Ramp):
        return value
    if isinstance(value, Mapping):  # YAML's spelling of a ramp
        return Ramp.from_mapping(value)
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        items = [as_param(v, name, owner, unit) for v in value]
        if any(isinstance(v, torch.Tensor) and v.dim() for v in items):
            raise ConfigError(
                f"{owner + ': ' if owner else ''}{name} must be a number or a flat list of "
                f"them (one per system_id), got {value!r}"
            )
        return torch.as_tensor(items, dtype=torch.float64)
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
    if isinstance(value, Ramp) and name not in RAMPED:
        raise ConfigError(
            f"{owner}: {name} cannot ramp (got {value!r}); a Ramp stands for a temperature "
            f"or a pressure -- give {name} a number or one per system_id"
        )
    if isinstance(value, Ramp):  # its start and stop are checked
        return value.map(
            lambda v: check_param(name, owner, v, minimum, strict, unit=unit, usual=usual)
        )
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


#: the fewest time steps a thermostat's or barostat's time constant may span: a Nosé-Hoover
#: chain with ``tdamp <= dt`` (and MTK's, NPTLangevin's cell with ``pdamp <= dt``) is
#: non-finite within steps, and no coupling can act faster than the steps resolve
MIN_STEPS_PER_TIME_CONSTANT = 2


def check_temperature(owner: str, value: Param | Sequence[float], no_zero: str | None) -> Param:
    """A bath temperature in K (:func:`check_param`): ``>= 0``, where 0 K is a quench
    (the thermostat drains the kinetic energy), or ``> 0`` for a method that cannot do
    0 K: then a :class:`ConfigError` gives ``no_zero`` (why) and what to use instead."""
    value = check_param("temperature", owner, value, strict=False, unit="K", usual=TEMPERATURE)
    ends = value.endpoints() if hasattr(value, "endpoints") else torch.as_tensor(value)
    if no_zero is not None and bool((ends == 0).any()):
        raise ConfigError(
            f"{owner}: temperature must be > 0 K, got {shown(value)}: {no_zero}; to quench to "
            f"0 K use Langevin, Bussi or Berendsen (NVT), CRescale or NPTLangevin (NPT), or an "
            f"optimizer"
        )
    return value


def check_time_constant(owner: str, name: str, value: Param | Sequence[float], dt: Param) -> Param:
    """A thermostat's or barostat's time constant in fs: ``> 0`` and at least
    :data:`MIN_STEPS_PER_TIME_CONSTANT` time steps ``dt`` (fs; per system where either is
    a list), else a :class:`ConfigError` naming both values."""
    value = check_param(name, owner, value, unit="fs")
    tau, step = (torch.as_tensor(v, dtype=torch.float64).flatten() for v in (value, dt))
    if len(tau) > 1 and len(step) > 1:  # both per system: the ids both cover
        tau, step = tau[: len(step)], step[: len(tau)]
    tau, step = torch.broadcast_tensors(tau, step)
    short = (tau < MIN_STEPS_PER_TIME_CONSTANT * step).nonzero().flatten().tolist()
    if short:
        k = short[0]
        per_system = isinstance(value, torch.Tensor) or isinstance(dt, torch.Tensor)
        where = f" for system_id {k}" if per_system else ""
        least = MIN_STEPS_PER_TIME_CONSTANT * float(step[k])
        raise ConfigError(
            f"{owner}: {name}={float(tau[k]):g} fs is shorter than {MIN_STEPS_PER_TIME_CONSTANT} "
            f"time steps (dt={float(step[k]):g} fs){where}: a coupling faster than the steps "
            f"resolve is not integrated (a Nosé-Hoover chain goes non-finite at once); give "
            f"{name} >= {least:g} fs (usually 100 dt or more) or a smaller dt"
        )
    return value


def check_pressure(owner: str, **given: Param | Sequence[float] | None) -> Param:
    """The external pressure in eV/Å^3 from the one of ``given`` that is not None
    (``pressure_gpa``, ``pressure_bar`` or ``scalar_pressure`` in eV/Å^3; 0 if none is;
    a number or one per ``system_id``), checked once for barostats and cell filters
    alike: two given, text or a non-finite value is a :class:`ConfigError`, a value
    outside its unit's usual range a :class:`UnitWarning` naming the value meant."""
    named = [n for n, v in given.items() if v is not None]
    if len(named) > 1:
        *rest, last = given
        many = "both" if len(named) == len(given) == 2 else f"{len(named)} of them"
        got = " and ".join(f"{given[n]!r} {PRESSURES[n][0]}" for n in named)
        raise ConfigError(
            f"{owner}: give one pressure, {', '.join(rest)} or {last}, not {many} (got {got})"
        )
    if not named:
        return 0.0
    name = named[0]
    unit, scale, usual = PRESSURES[name]
    value = as_param(given[name], name, owner, unit)  # type: ignore[arg-type]
    ramp = hasattr(value, "endpoints")  # a Ramp: its start and stop are checked
    ends = value.endpoints() if ramp else torch.as_tensor(value, dtype=torch.float64)
    if not bool(torch.isfinite(ends).all()):
        raise ConfigError(f"{owner}: {name} ({unit}) must be finite, got {value}")
    warn_if_unusual(owner, name, ends if ramp else value, unit, usual)
    return value * scale if isinstance(value, torch.Tensor) or ramp else float(value) * scale


#: attributes of the built-in integrators that hold a parameter under another name
_PARAMETER_OF = {"gamma": "friction", "beta": "compressibility"}


def check_system_ids(stage: object, system_ids: Sequence[int]) -> None:
    """Before a run: every per-system parameter of ``stage`` (a list or 1-D tensor
    attribute: one value per ``system_id``) must have a value for each of the run's
    ``system_ids``, else a :class:`ConfigError` naming the parameter, how many values it
    has and the ids without one (rather than an ``IndexError`` mid-run)."""
    ids = sorted(set(int(i) for i in system_ids))
    items: list[tuple[str, Any]] = []
    for attr, value in vars(stage).items():  # a Ramp's per-system parts count as its own
        parts = value.tensors() if hasattr(value, "endpoints") else {}
        items += [(f"{attr} ramp's {k}", v) for k, v in parts.items()] or [(attr, value)]
    for attr, value in items:
        if isinstance(value, (torch.Tensor, np.ndarray)):
            count = len(value) if value.ndim == 1 else None
        elif isinstance(value, (list, tuple)) and value:
            count = len(value) if all(isinstance(v, numbers.Real) for v in value) else None
        else:
            count = None
        missing = [i for i in ids if count is not None and not 0 <= i < count]
        if attr.startswith("_") or not missing:
            continue
        name = _PARAMETER_OF.get(attr, attr.removesuffix("_fs"))
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ConfigError(
            f"{type(stage).__name__}: {name} has {count} value(s), one per system_id "
            f"0..{count - 1} (a list is indexed by system_id, not by position), but none for "
            f"system_id {missing[0]}{more}; give one value per system_id up to {ids[-1]}, or "
            f"one for all"
        )


def shown(value: Param) -> float | list[float]:
    """A parameter as a message shows it: a number, or a list for per-system values."""
    return value.tolist() if isinstance(value, torch.Tensor) else value


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
    "MIN_STEPS_PER_TIME_CONSTANT",
    "PRESSURES",
    "PRESSURE_BAR",
    "PRESSURE_EV_A3",
    "PRESSURE_GPA",
    "RAMPED",
    "TEMPERATURE",
    "TIME_STEP",
    "Param",
    "Rows",
    "Usual",
    "as_param",
    "check_count",
    "check_param",
    "check_positive",
    "check_pressure",
    "check_range",
    "check_system_ids",
    "check_temperature",
    "check_time_constant",
    "warn_if_unusual",
]
