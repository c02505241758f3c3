"""Temperature ladders of a replica exchange: checked, and the geometric one.

A ladder is the temperatures of a replica group's rungs, lowest first.  Neighbours must
overlap in energy for exchanges to be accepted; in a constant ratio ``T_k+1 / T_k``
(geometric) the acceptance is the same for every pair where the heat capacity is
constant (Kofke, J. Chem. Phys. 117, 6911 (2002)), the usual first choice.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..core.errors import ConfigError
from .params import check_count


def check_ladder(owner: str, temperatures: Sequence[float]) -> list[float]:
    """A temperature ladder: at least 2 finite temperatures > 0 K, strictly increasing."""
    values = [float(t) for t in np.asarray(temperatures, dtype=np.float64).ravel()]
    if len(values) < 2:
        raise ConfigError(
            f"{owner}: a temperature ladder needs at least 2 temperatures (replicas), got "
            f"{values}; e.g. temperatures=geometric_ladder(300, 600, 8)"
        )
    if not all(math.isfinite(t) and t > 0 for t in values):
        raise ConfigError(
            f"{owner}: every ladder temperature must be finite and > 0 K, got {values}"
        )
    steps = [k for k in range(len(values) - 1) if not values[k + 1] > values[k]]
    if steps:
        k = steps[0]
        raise ConfigError(
            f"{owner}: the ladder must increase strictly, but temperature {k + 1} "
            f"({values[k + 1]:g} K) is not above temperature {k} ({values[k]:g} K); sort it "
            f"(sorted(...)) and drop repeats"
        )
    return values


def geometric_ladder(t_min: float, t_max: float, n: int) -> list[float]:
    """``n`` temperatures from ``t_min`` to ``t_max`` (K) in a constant ratio: equal
    exchange acceptance between neighbours where the heat capacity is constant."""
    n = check_count("geometric_ladder", "n", n, 2, "the number of replicas")
    if not (0 < float(t_min) < float(t_max) and math.isfinite(float(t_max))):
        raise ConfigError(f"geometric_ladder: need 0 < t_min < t_max, got {t_min}, {t_max}")
    return np.geomspace(float(t_min), float(t_max), n).tolist()


__all__ = ["check_ladder", "geometric_ladder"]
