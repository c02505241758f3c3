"""Time correlations over windows of independent origins, and the vibrational density
of states: the arithmetic shared by the MSD/VACF callbacks
(:mod:`alchemi_lit.callbacks.correlation`, module docstring there) and the functions
over a stored trajectory (:mod:`alchemi_lit.io.trajectory_analysis`)."""

from __future__ import annotations

import numpy as np
import torch

from .backends import primitive
from .segments import Segments


def fit_weights(window: int, start: float, stop: float) -> torch.Tensor:
    """``[window]`` float64 weights ``w`` with ``sum(w * curve)`` the least-squares slope
    (per lag) of ``curve`` over the lags ``floor(start (window - 1)) ..
    ceil(stop (window - 1))``, 0 elsewhere."""
    last = window - 1
    lo, hi = int(np.floor(start * last)), int(np.ceil(stop * last))
    if hi - lo < 1:
        raise ValueError(f"the fit range {start}..{stop} of a {window}-sample window spans "
                         f"fewer than two lags; widen it or lengthen the window")  # fmt: skip
    k = np.arange(window, dtype=np.float64)
    inside = (k >= lo) & (k <= hi)
    centred = np.where(inside, k - k[inside].mean(), 0.0)
    return torch.from_numpy(centred / (centred * centred).sum())


def window_lag(
    x: torch.Tensor, origin: torch.Tensor, start: torch.Tensor, free: torch.Tensor,
    count: torch.Tensor, segments: Segments, squared: bool,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """A sample's per-atom part (:func:`window_sample`): the origins
    ``[N, 3]`` with those of the systems whose window starts (``start`` ``[B]``) set to
    ``x``, and ``[B]`` the mean over each system's free atoms (``free`` 0/1 ``[N]``,
    ``count`` of them ``[B]``) of ``|x - origin|^2`` (``squared``: MSD) or
    ``x . origin`` (VACF)."""
    atoms = start.index_select(0, segments.system_idx)
    origin = torch.where(atoms.unsqueeze(-1), x, origin)
    if squared:
        d = x - origin
        per_atom = (d * d).sum(-1)
    else:
        per_atom = (x * origin).sum(-1)
    return origin, segments.sum(per_atom * free) / count


def window_update(
    value: torch.Tensor, rows: torch.Tensor, samples: torch.Tensor, curve: torch.Tensor,
    total: torch.Tensor, estimates: torch.Tensor, windows: torch.Tensor, dt: torch.Tensor,
    step_dt: torch.Tensor, weights: torch.Tensor, dt_power: int, scale: float,
) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """A sample's per-system part (:func:`window_sample`) for the systems
    ``rows`` ``[B]``: ``value`` ``[B]`` into lag ``samples % W`` of ``curve`` ``[B, W]``,
    the lag ``step_dt`` into ``dt``; a window completed adds its curve to ``total`` and
    its estimate ``scale * dt^dt_power * sum(weights * curve)`` and its square to
    ``estimates`` ``[B, 2]``, and counts in ``windows``.  Returns the new ``curve, dt,
    total, estimates, windows, samples`` (other rows keep their bits)."""
    w = curve.shape[-1]
    pos = samples % w
    lags = torch.arange(w, device=curve.device)
    at = rows.unsqueeze(-1) & (lags == pos.unsqueeze(-1))
    curve = torch.where(at, value.unsqueeze(-1), curve)
    dt = torch.where(rows, step_dt, dt)
    done = rows & (pos == w - 1)
    factor = dt if dt_power > 0 else 1.0 / torch.where(dt > 0, dt, 1.0)
    est = (curve * weights).sum(-1) * factor * scale
    total = torch.where(done.unsqueeze(-1), total + curve, total)
    both = torch.stack([est, est * est], -1)
    estimates = torch.where(done.unsqueeze(-1), estimates + both, estimates)
    windows = windows + done.to(windows.dtype)
    return curve, dt, total, estimates, windows, torch.where(rows, samples + 1, samples)


@primitive
def window_sample(
    x: torch.Tensor, origin: torch.Tensor, rows: torch.Tensor, free: torch.Tensor,
    count: torch.Tensor, segments: Segments, samples: torch.Tensor, curve: torch.Tensor,
    total: torch.Tensor, estimates: torch.Tensor, windows: torch.Tensor, dt: torch.Tensor,
    step_dt: torch.Tensor, weights: torch.Tensor, squared: bool, dt_power: int, scale: float,
) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """*Primitive* (one numba kernel on CPU).  One sample ``x`` ``[N, 3]`` of the systems
    ``rows``: a window starts where a system's sample count is a multiple of ``W``
    (:func:`window_lag` with those origins), then :func:`window_update` with the lag
    value.  Returns the new ``origin, curve, dt, total, estimates, windows, samples``."""
    start = rows & (samples % curve.shape[-1] == 0)
    origin, value = window_lag(x, origin, start, free, count, segments, squared)
    updated = window_update(value, rows, samples, curve, total, estimates, windows, dt,
                            step_dt, weights, dt_power, scale)  # fmt: skip
    return (origin, *updated)


def trapezoid_weights(window: int) -> torch.Tensor:
    """``[window]`` float64 weights ``w`` with ``sum(w * curve)`` the trapezoid integral
    of ``curve`` in units of its lag (VACF's Green-Kubo integral)."""
    w = torch.ones(window, dtype=torch.float64)
    w[0] = w[-1] = 0.5
    return w


def windowed(values: np.ndarray, window: int) -> np.ndarray:
    """``[K, window]`` the consecutive complete windows of a series ``[F, ...]`` of
    samples: ``values[k * window : (k + 1) * window]`` for each ``k``."""
    k = len(values) // window
    return values[: k * window].reshape(k, window, *values.shape[1:])


def vdos(vacf: np.ndarray, dt: float) -> tuple[np.ndarray, np.ndarray]:
    """Frequencies (THz) and the vibrational density of states (1/THz, unit area over the
    frequencies >= 0) from a VACF ``[W]`` sampled every ``dt`` fs: the real FFT of its
    even extension ``C(0) .. C(W-1), C(W-2) .. C(1)``, i.e. ``dt (C(0) + 2 sum_k C(k)
    cos(2 pi nu k dt))``, without a window function (resolution ``1 / (2 (W - 1) dt)``)."""
    c = np.asarray(vacf, dtype=np.float64)
    if len(c) < 2 or not np.isfinite(c).all() or not dt > 0:
        return np.full(max(len(c), 1), np.nan), np.full(max(len(c), 1), np.nan)
    even = np.concatenate([c, c[-2:0:-1]])
    spectrum = np.fft.rfft(even).real * dt
    frequency = np.fft.rfftfreq(len(even), d=dt) * 1e3  # 1/fs -> THz
    step = frequency[1] - frequency[0]
    area = (spectrum.sum() - 0.5 * (spectrum[0] + spectrum[-1])) * step
    return frequency, spectrum / area if area != 0 else spectrum * np.nan


__all__ = [
    "fit_weights", "trapezoid_weights", "vdos", "window_lag", "window_update", "windowed",
]  # fmt: skip
