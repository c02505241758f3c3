"""BlockAverages: time averages of energy, temperature, pressure and volume per system,
with their statistical errors by block averaging, accumulated during the run.

The blocking sums of every quantity and level live in batch fields
(:func:`alchemi_lit.core.blocking.update`: a few elementwise operations per sample,
whatever the number of levels); when a system finishes they become the mean, the error
read at the Flyvbjerg-Petersen plateau (Lee et al.'s criterion), its error and the block
size -- :func:`~alchemi_lit.core.blocking.block_average` of the same samples.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from ..core import blocking
from ..core.errors import ConfigError
from ..core.units import GPa
from ..engine.hooks import StepContext
from ..integrators.barostat import instantaneous_pressure
from .observables import Observable
from .thermo import stress_computed

#: the quantities and how a sample reads them from the batch ([B] tensors)
QUANTITIES: dict[str, tuple[str, Callable[[Any], torch.Tensor]]] = {
    "energy": ("eV", lambda b: b.energy),
    "kinetic_energy": ("eV", lambda b: b.kinetic_energy()),
    "total_energy": ("eV", lambda b: b.energy + b.kinetic_energy()),
    "temperature": ("K", lambda b: b.temperature()),
    "pressure": ("GPa", lambda b: instantaneous_pressure(b) / GPa),
    "volume": ("Å^3", lambda b: b.volume),
}


class BlockAverages(Observable):
    """Block-averaged means and errors per system (module docstring).

    Args:
        quantities: any of ``energy`` (potential, eV), ``kinetic_energy``,
            ``total_energy`` (eV), ``temperature`` (K, 3N degrees of freedom, as
            thermostats hold it), ``pressure`` (GPa, ideal-gas term included: needs the
            stress, from a barostat or ``Simulator(stress=True)``), ``volume`` (Å^3).
        levels: block sizes ``1 .. 2^(levels - 1)`` samples.
        every: loop steps between two samples (>= 1).
        skip: stage steps a system takes before its first sample (equilibration).
        path: zarr store the results are appended to (None: in memory only).
        stages: indices of the plan's stages sampled (None: every MD stage).

    Results per system, for each quantity ``q``: ``q`` (the mean), ``q_error``,
    ``q_error_of_error``, ``q_block_size`` (samples per block where the error was read),
    ``q_plateau`` (False: the run is too short for the quantity's correlation time and
    the error an underestimate), ``q_errors`` (the naive error at each level); and
    ``samples``.
    """

    name = "averages"

    def __init__(
        self,
        quantities: Sequence[str] = ("energy", "temperature"),
        levels: int = blocking.LEVELS,
        every: int = 1,
        skip: int = 0,
        path: str | os.PathLike[str] | None = None,
        stages: Sequence[int] | None = None,
    ) -> None:
        super().__init__(every, skip, path, stages)
        if isinstance(quantities, str):
            quantities = (quantities,)
        unknown = sorted(set(quantities) - set(QUANTITIES))
        if unknown or not quantities or len(set(quantities)) != len(quantities):
            raise ConfigError(
                f"BlockAverages: quantities must be distinct names of {sorted(QUANTITIES)}, "
                f"got {list(quantities)}"
            )
        if isinstance(levels, bool) or int(levels) != levels or not 2 <= levels <= 62:
            raise ConfigError(f"BlockAverages: levels must be an int in 2..62, got {levels!r}")
        self.quantities, self.levels = tuple(quantities), int(levels)

    def meta(self) -> dict[str, Any]:
        units = {q: QUANTITIES[q][0] for q in self.quantities}
        return {**super().meta(), "quantities": list(self.quantities), "units": units}

    def declare(self, ctx: StepContext) -> None:
        if "pressure" in self.quantities and not stress_computed(ctx):
            raise ConfigError(
                "BlockAverages: 'pressure' needs the stress, which this run does not compute; "
                "run a barostat or pass Simulator(stress=True), or drop 'pressure'"
            )
        b, q, n = ctx.batch, len(self.quantities), self.levels
        b.ensure_field(self.field("n"), "system", (), torch.int64)
        b.ensure_field(self.field("shift"), "system", (q,))
        for key in ("partial", "sums", "squares"):
            b.ensure_field(self.field(key), "system", (q, n))

    def accumulate(self, ctx: StepContext, rows: torch.Tensor) -> None:
        b, f = ctx.batch, self.field
        s = b.system
        x = torch.stack([QUANTITIES[q][1](b).to(b.dtype) for q in self.quantities], -1)
        keys = ("n", "shift", "partial", "sums", "squares")
        new = blocking.update(*(s[f(k)] for k in keys), x, rows)
        for k, value in zip(keys, new):
            s[f(k)] = value

    def summarize(self, sums: dict[str, np.ndarray]) -> dict[str, Any]:
        n = int(sums["n"])
        out: dict[str, Any] = {"samples": np.int64(n)}
        for k, q in enumerate(self.quantities):
            r = blocking.result(n, float(sums["shift"][k]), sums["sums"][k], sums["squares"][k])
            out.update({q: np.float64(r.mean), f"{q}_error": np.float64(r.error),
                        f"{q}_error_of_error": np.float64(r.error_of_error),
                        f"{q}_block_size": np.int64(r.block_size),
                        f"{q}_plateau": np.bool_(r.plateau), f"{q}_errors": r.errors})  # fmt: skip
        return out


__all__ = ["QUANTITIES", "BlockAverages"]
