"""MSD and VACF: time correlations over windows of independent time origins.

Why windows: a correlation ``C(t)`` at all lags of a run needs the whole trajectory; over
lags up to a window of ``window`` samples it needs one origin per atom.  Each system's
samples are cut into consecutive windows: the first sample of a window is its origin
(positions or velocities kept per atom), each later sample adds one lag of the window's
curve, and a complete window adds its curve to the system's sum and its estimate (a
diffusion coefficient) to the sums of estimates.  Windows do not overlap, so their
estimates are independent samples (the increments of a diffusing particle over disjoint
intervals are independent), and the error of their mean is ``std / sqrt(n_windows)``:
the independent-origin statistics.  A window longer than the correlation time and a few
windows per run are what this needs; a window not complete when the system finishes is
not counted.

* :class:`MSD`: ``<|r(t) - r(0)|^2>`` over the free atoms (the batch's positions, which
  the integrators never wrap; a barostat's rescaling is part of the motion).  ``D`` is the
  least-squares slope over the lags ``fit`` (fractions of the window) divided by 6,
  per window, then averaged (equal to the slope of the averaged curve: the fit is linear).
* :class:`VACF`: ``<v(0) . v(t)>`` over the free atoms, (Å/fs)^2; ``D_green_kubo`` is
  ``(1/3) int C dt`` per window (trapezoid); the vibrational density of states is the
  cosine transform of the averaged curve (:func:`~alchemi_lit.core.correlation.vdos`).

Units: lags in fs, MSD in Å^2, D in Å^2/fs (1 Å^2/fs = 0.1 cm^2/s).
"""

from __future__ import annotations

import abc
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..core.correlation import fit_weights, trapezoid_weights, vdos, window_sample
from ..core.errors import ConfigError
from ..core.tensor_ops import kept
from ..core.units import fs
from ..engine.hooks import StepContext
from .observables import Observable, stage_time_step


class _Windows(Observable):
    """The window machinery of :class:`MSD` and :class:`VACF` (module docstring)."""

    def __init__(self, window: int, every: int, skip: int, path: Any, stages: Any) -> None:
        super().__init__(every, skip, path, stages)
        if isinstance(window, bool) or int(window) != window or window < 3:
            raise ConfigError(f"{type(self).__name__}: window must be an int >= 3 (samples), "
                              f"got {window!r}")  # fmt: skip
        self.window = int(window)
        self._free: tuple[Any, ...] | None = None
        self._dt: tuple[Any, ...] | None = None

    def meta(self) -> dict[str, Any]:
        return {**super().meta(), "window": self.window}

    def declare(self, ctx: StepContext) -> None:
        b, w = ctx.batch, self.window
        b.ensure_field(self.field("origin"), "atom", (3,))
        for key, shape, dtype in (("samples", (), torch.int64), ("windows", (), torch.int64),
                                  ("curve", (w,), None), ("sum", (w,), None),
                                  ("estimates", (2,), None), ("dt", (), None)):  # fmt: skip
            b.ensure_field(self.field(key), "system", shape, dtype)

    @abc.abstractmethod
    def quantity(self, ctx: StepContext) -> torch.Tensor:
        """``[N, 3]`` the per-atom vector correlated."""

    #: the window's estimate: ``SCALE * dt^DT_POWER * sum(weights * curve)``
    SQUARED: bool
    DT_POWER: int
    SCALE: float

    @abc.abstractmethod
    def estimate_weights(self) -> torch.Tensor:
        """``[W]`` float64 weights of a window's estimate over its curve."""

    def free_atoms(self, ctx: StepContext) -> tuple[torch.Tensor, torch.Tensor]:
        """``[N]`` 0/1 weights of the free atoms and ``[B]`` their count (at least 1),
        kept while the layout's ``fixed`` field is."""
        b = ctx.batch

        def weights(fixed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            free = (~fixed).to(b.dtype)
            return free, b.segments.sum(free).clamp_min(1.0)

        self._free = kept(self._free, b.atom["fixed"], weights)
        return self._free[2]

    def accumulate(self, ctx: StepContext, rows: torch.Tensor) -> None:
        b, f = ctx.batch, self.field
        s = b.system
        free, count = self.free_atoms(ctx)
        # the stages' time steps, kept while the status field is (systems rarely move)
        self._dt = kept(self._dt, b.status, lambda _: stage_time_step(ctx) * self.every)
        self._weights = self._weights.to(b.device, b.dtype)
        keys = ("curve", "dt", "sum", "estimates", "windows", "samples")
        origin, *new = window_sample(
            self.quantity(ctx), b.atom[f("origin")], rows, free, count, b.segments,
            s[f("samples")], s[f("curve")], s[f("sum")], s[f("estimates")], s[f("windows")],
            s[f("dt")], self._dt[2].to(b.dtype), self._weights, self.SQUARED, self.DT_POWER,
            self.SCALE,
        )  # fmt: skip
        b.atom[f("origin")] = origin
        for key, v in zip(keys, new):
            s[f(key)] = v

    def _common(self, sums: dict[str, np.ndarray]) -> tuple[dict[str, Any], float, float]:
        """Lag times, the averaged curve, and the mean and error of the estimates."""
        k, dt = int(sums["windows"]), float(sums["dt"])
        curve = sums["sum"] / k if k else np.full(self.window, np.nan)
        total, squares = sums["estimates"]
        mean = total / k if k else np.nan
        err = np.sqrt(max(squares / k - mean * mean, 0.0) / (k - 1)) if k >= 2 else np.nan
        out = {"t": np.arange(self.window) * dt, "windows": np.int64(k),
               "samples": np.int64(sums["samples"])}  # fmt: skip
        return {**out, "curve": curve}, float(mean), float(err)


class MSD(_Windows):
    """Mean squared displacement and diffusion coefficient per system (module docstring).

    Args:
        window: samples per window (its lags are ``0 .. window - 1`` times
            ``every * dt``).
        fit: the lags the slope is fitted over, as fractions ``(start, stop)`` of the
            window (start after the ballistic regime).
        every: loop steps between two samples (>= 1).
        skip: stage steps a system takes before its first sample (equilibration).
        path: zarr store the results are appended to (None: in memory only).
        stages: indices of the plan's stages sampled (None: every MD stage).

    Results per system: ``t`` (fs), ``msd`` (Å^2), ``D`` and ``D_error`` (Å^2/fs; error
    from the spread of the windows' estimates, NaN below two windows), ``windows``,
    ``samples``.
    """

    name = "msd"
    SQUARED, DT_POWER, SCALE = True, -1, 1.0 / 6.0

    def __init__(
        self, window: int = 100, fit: tuple[float, float] = (0.2, 1.0), every: int = 10,
        skip: int = 0, path: str | os.PathLike[str] | None = None,
        stages: Sequence[int] | None = None,
    ) -> None:  # fmt: skip
        super().__init__(window, every, skip, path, stages)
        lo, hi = (float(v) for v in fit)
        if not 0.0 <= lo < hi <= 1.0:
            raise ConfigError(f"MSD: fit must be fractions 0 <= start < stop <= 1, got {fit!r}")
        self.fit = (lo, hi)
        self._weights = self.estimate_weights()

    def meta(self) -> dict[str, Any]:
        return {**super().meta(), "fit": list(self.fit)}

    def quantity(self, ctx: StepContext) -> torch.Tensor:
        return ctx.batch.positions

    def estimate_weights(self) -> torch.Tensor:
        return fit_weights(self.window, *self.fit)  # the slope per lag; D = slope / (6 dt)

    def summarize(self, sums: dict[str, np.ndarray]) -> dict[str, Any]:
        out, mean, err = self._common(sums)
        out["msd"] = out.pop("curve")
        return {**out, "D": np.float64(mean), "D_error": np.float64(err)}


class VACF(_Windows):
    """Velocity autocorrelation and vibrational density of states per system.

    Args:
        window: samples per window (lags ``0 .. window - 1`` times ``every * dt``; the
            spectrum's resolution is ``1 / (2 (window - 1) every dt)``).
        every: loop steps between two samples (>= 1).
        skip: stage steps a system takes before its first sample (equilibration).
        path: zarr store the results are appended to (None: in memory only).
        stages: indices of the plan's stages sampled (None: every MD stage).

    Results per system: ``t`` (fs), ``vacf`` ((Å/fs)^2), ``frequency`` (THz), ``vdos``
    (1/THz, unit area), ``D_green_kubo`` and its ``D_green_kubo_error`` (Å^2/fs),
    ``windows``, ``samples``.
    """

    name = "vacf"
    SQUARED, DT_POWER, SCALE = False, 1, 1.0 / 3.0

    def __init__(
        self, window: int = 200, every: int = 1, skip: int = 0,
        path: str | os.PathLike[str] | None = None, stages: Sequence[int] | None = None,
    ) -> None:  # fmt: skip
        super().__init__(window, every, skip, path, stages)
        self._weights = self.estimate_weights()

    def quantity(self, ctx: StepContext) -> torch.Tensor:
        return ctx.batch.velocities * fs  # Å/fs

    def estimate_weights(self) -> torch.Tensor:
        return trapezoid_weights(self.window)  # D = (1/3) int C dt

    def summarize(self, sums: dict[str, np.ndarray]) -> dict[str, Any]:
        out, mean, err = self._common(sums)
        curve = out.pop("curve")
        frequency, density = vdos(curve, float(sums["dt"]))
        gk = {"D_green_kubo": np.float64(mean), "D_green_kubo_error": np.float64(err)}
        return {**out, "vacf": curve, "frequency": frequency, "vdos": density, **gk}


__all__ = ["MSD", "VACF"]
