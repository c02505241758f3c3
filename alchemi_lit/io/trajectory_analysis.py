"""The MD observables as functions of a stored trajectory: the same arithmetic as the
callbacks that accumulate them during a run (:mod:`alchemi_lit.callbacks.rdf`,
:mod:`~alchemi_lit.callbacks.correlation`, :mod:`~alchemi_lit.callbacks.averages`).

Each takes the frames of one system as ``ase.Atoms`` -- :func:`~alchemi_lit.io.
trajectory_store.read_trajectory` of a :class:`~alchemi_lit.callbacks.TrajectoryWriter`
store, or any ASE trajectory -- equally spaced in time.  Frames marked ``final`` (the
extra frame a writer adds when a system finishes) are left out, so a store written
every ``k`` steps gives what a callback sampling every ``k`` steps gives.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..core import rdf as core_rdf
from ..core.blocking import BlockResult, block_average
from ..core.correlation import fit_weights, vdos, windowed

#: pairs per chunk of frames binned at once by :func:`rdf`
CHUNK_PAIRS = 1 << 24


def regular(frames: Sequence[Any]) -> list[Any]:
    """The frames without the ``final`` ones (``atoms.info["final"]``)."""
    return [a for a in frames if not a.info.get("final", False)]


def frame_spacing(frames: Sequence[Any], timestep: float | None, dt: float | None) -> float:
    """Femtoseconds between two frames: ``dt``, or ``timestep`` (fs per MD step) times
    the steps between frames (``atoms.info["step"]``, which must be evenly spaced)."""
    if dt is not None:
        return float(dt)
    if timestep is None:
        raise ValueError("give dt (fs between frames) or timestep (fs per MD step)")
    steps = np.array([a.info.get("step", np.nan) for a in frames], dtype=np.float64)
    gaps = np.diff(steps)
    if len(gaps) == 0 or not np.isfinite(gaps).all() or not np.all(gaps == gaps[0]):
        raise ValueError(
            f"frames are not evenly spaced in atoms.info['step'] (gaps {np.unique(gaps)[:5]}); "
            f"pass dt= (fs between frames) for frames without step numbers"
        )
    return float(timestep) * float(gaps[0])


def rdf(
    frames: Sequence[Any], rmax: float, nbins: int = 100,
    pairs: Sequence[Sequence[int | str]] = (),
) -> dict[str, np.ndarray]:  # fmt: skip
    """The mean RDF of ``frames``: ``r`` (Å) and ``g`` ``[1 + P, nbins]`` (total, then
    each element pair), as ``ase.geometry.rdf.get_rdf`` averages frames; frames with a
    cell too small for ``rmax`` are refused (ASE raises ``CellTooSmall``)."""
    frames = regular(frames)
    if not frames:
        raise ValueError("rdf: no frames")
    partials = core_rdf.element_pairs(pairs)
    n = len(frames[0])
    per_chunk = max(1, CHUNK_PAIRS // max(n * n, 1))
    total = None
    for lo in range(0, len(frames), per_chunk):
        part = frames[lo : lo + per_chunk]
        counts = torch.tensor([len(a) for a in part])
        cell = torch.tensor(np.stack([a.cell[:] for a in part]), dtype=torch.float64)
        pbc = torch.tensor(np.stack([a.pbc for a in part]))
        fits = core_rdf.cell_fits(cell, pbc, rmax)
        if not bool(fits.all()):
            k = lo + int((~fits).nonzero()[0, 0])
            raise ValueError(f"rdf: frame {k}'s cell is smaller than 2 rmax = {2 * rmax} Å "
                             f"in a periodic direction; lower rmax")  # fmt: skip
        numbers = torch.tensor(np.concatenate([a.numbers for a in part]))
        system = torch.repeat_interleave(torch.arange(len(part)), counts)
        pair_index = core_rdf.all_pairs(counts)
        weights = core_rdf.pair_weights(numbers, *pair_index, partials)
        positions = torch.tensor(np.concatenate([a.positions for a in part]), dtype=torch.float64)
        g = core_rdf.rdf_frame(positions, cell, pbc, system, numbers, counts, pair_index,
                               weights, rmax, nbins, partials).sum(0)  # fmt: skip
        total = g if total is None else total + g
    edges = np.linspace(0.0, rmax, nbins + 1)
    return {"r": 0.5 * (edges[:-1] + edges[1:]), "g": total.numpy() / len(frames)}


def unwrapped_positions(frames: Sequence[Any]) -> np.ndarray:
    """``[F, N, 3]`` positions with each step between frames taken as its minimum image
    (frames wrapped into their cell come out continuous; unwrapped ones unchanged, up to
    rounding, while atoms move less than half a cell between frames)."""
    from ase.geometry import find_mic

    out = [np.asarray(frames[0].positions, dtype=np.float64)]
    for before, after in itertools.pairwise(frames):
        step = after.positions - before.positions
        if after.pbc.any():
            step, _ = find_mic(step, after.cell, after.pbc)
        out.append(out[-1] + step)
    return np.stack(out)


def msd(
    frames: Sequence[Any], window: int = 100, fit: tuple[float, float] = (0.2, 1.0),
    timestep: float | None = None, dt: float | None = None, unwrap: bool = True,
) -> dict[str, Any]:  # fmt: skip
    """MSD over consecutive windows of ``window`` frames and ``D`` with its error
    (independent origins), as :class:`~alchemi_lit.callbacks.MSD` computes them: ``t``
    (fs), ``msd`` (Å^2), ``D``, ``D_error`` (Å^2/fs), ``windows``."""
    frames = regular(frames)
    step = frame_spacing(frames, timestep, dt)
    r = unwrapped_positions(frames) if unwrap else np.stack([a.positions for a in frames])
    blocks = windowed(r, int(window))  # [K, W, N, 3]
    d = blocks - blocks[:, :1]
    curves = (d * d).sum(-1).mean(-1)  # [K, W]
    w = fit_weights(int(window), *fit).numpy()
    estimates = (curves * w).sum(-1) / step / 6.0
    mean, err = _mean_error(estimates)
    return {"t": np.arange(window) * step, "msd": _mean_curve(curves, window), "D": mean,
            "D_error": err, "windows": len(curves)}  # fmt: skip


def vacf(
    frames: Sequence[Any], window: int = 200, timestep: float | None = None,
    dt: float | None = None,
) -> dict[str, Any]:  # fmt: skip
    """VACF over consecutive windows of ``window`` frames, its VDOS and the Green-Kubo
    ``D``, as :class:`~alchemi_lit.callbacks.VACF` computes them: ``t`` (fs), ``vacf``
    ((Å/fs)^2), ``frequency`` (THz), ``vdos``, ``D_green_kubo``, ``D_green_kubo_error``."""
    from ase.units import fs

    frames = regular(frames)
    step = frame_spacing(frames, timestep, dt)
    v = np.stack([a.get_velocities() for a in frames]) * fs
    blocks = windowed(v, int(window))
    curves = (blocks * blocks[:, :1]).sum(-1).mean(-1)  # [K, W]
    trapezoid = curves.sum(-1) - 0.5 * (curves[:, 0] + curves[:, -1])
    mean, err = _mean_error(trapezoid * step / 3.0)
    curve = _mean_curve(curves, window)
    frequency, density = vdos(curve, step)
    return {"t": np.arange(window) * step, "vacf": curve, "frequency": frequency,
            "vdos": density, "D_green_kubo": mean, "D_green_kubo_error": err,
            "windows": len(curves)}  # fmt: skip


def _mean_curve(curves: np.ndarray, window: int) -> np.ndarray:
    return curves.mean(0) if len(curves) else np.full(window, np.nan)


def _mean_error(estimates: np.ndarray) -> tuple[float, float]:
    """Mean and standard error of independent estimates (NaN error below two)."""
    k = len(estimates)
    if k == 0:
        return np.nan, np.nan
    mean = float(estimates.mean())
    return mean, float(estimates.std(ddof=1) / np.sqrt(k)) if k >= 2 else np.nan


def time_average(series: np.ndarray | Sequence[float]) -> BlockResult:
    """The block-averaged mean and error of a time series (:func:`~alchemi_lit.core.
    blocking.block_average`), e.g. ``[a.info["temperature"] for a in frames]``."""
    return block_average(np.asarray(series, dtype=np.float64))


__all__ = ["frame_spacing", "msd", "rdf", "regular", "time_average", "unwrapped_positions",
           "vacf"]  # fmt: skip
