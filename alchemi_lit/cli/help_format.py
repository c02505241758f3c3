"""Readable defaults in ``alchemi-lit ... --X.help NAME``: in the parameter's unit, rounded.

jsonargparse prints each parameter with the meaning its class docstring gives it (the
Google-style ``Args:`` section, read by docstring-parser) and ``default: <repr>``.  A
default computed from a unit conversion then prints as ``1.0180505671156725``: FIRE's
time step, ASE's 0.1 time units in fs.  :class:`ReadableDefaults` prints it as
``≈1.018 fs (exactly 0.1 in ASE time units)`` instead: the unit is the one the
parameter's description names (``dt: initial time step (fs)``), the value is rounded
to four significant digits and marked ``≈`` only when rounding changed it, and a time
in fs that is a round number of ASE time units says so (the value to give ASE for the
same run).  The exact value stays what the class gets and what ``--print_config`` shows.
"""

from __future__ import annotations

import math
import re
from typing import Any

from jsonargparse import DefaultHelpFormatter

_TOKEN = r"(?:fs|ps|ns|K|eV|meV|Å|amu|GPa|bar|e|1)(?:\^?-?\d|[²³])?"
_UNIT = rf"{_TOKEN}(?:\s?[/·*]\s?{_TOKEN})*"
#: "(fs)", "[eV/Å]" or "in fs" within a parameter's description
_UNIT_IN_TEXT = re.compile(rf"[(\[]({_UNIT})[)\]]|\bin ({_UNIT})(?![\w/])")


def unit_of(description: str | None) -> str | None:
    """The unit a parameter's description names (``"time step (fs)"`` -> ``"fs"``)."""
    if not description:
        return None
    match = _UNIT_IN_TEXT.search(description)
    if match is None:
        return None
    unit = match.group(1) or match.group(2)
    return None if unit == "1" else unit


def _round_number(value: float, digits: int = 6) -> bool:
    """``value`` is written exactly with ``digits`` significant digits (up to round-off)."""
    short = float(f"{value:.{digits}g}")
    return math.isclose(short, value, rel_tol=1e-12, abs_tol=0.0)


def readable_default(value: Any, description: str | None) -> str | None:
    """The default as help prints it, or None to leave jsonargparse's text."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int):
        unit = unit_of(description)
        return None if unit is None else f"{value} {unit}"
    if not math.isfinite(value):
        return None
    unit = unit_of(description)
    if _round_number(value):
        text = f"{value:.6g}"
    else:
        text = f"≈{value:.4g}"
    if unit is None:
        return text if text.startswith("≈") else None
    text = f"{text} {unit}"
    if unit == "fs" and not _round_number(value):
        from ase.units import fs

        in_ase = value * fs
        if _round_number(in_ase, 4):
            text += f" (exactly {float(f'{in_ase:.4g}'):g} in ASE time units)"
    return text


class ReadableDefaults(DefaultHelpFormatter):
    """jsonargparse's help with defaults as :func:`readable_default` writes them."""

    def _get_help_string(self, action: Any) -> str:
        text = super()._get_help_string(action)
        placeholder = "default: %(default)s"
        if placeholder not in text:
            return text
        readable = readable_default(action.default, action.help)
        return text if readable is None else text.replace(placeholder, f"default: {readable}")
