"""Time correlations over windows of independent origins, and the vibrational density
of states: the arithmetic shared by the MSD/VACF callbacks
(:mod:`alchemi_lit.callbacks.correlation`, module docstring there) and the functions
over a stored trajectory (:mod:`alchemi_lit.io.trajectory_analysis`)."""

from __future__ import annotations

import numpy as np
import torch


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


__all__ = ["fit_weights", "vdos", "windowed"]
