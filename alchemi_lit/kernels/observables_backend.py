"""The MD observables' compiled CPU kernels (:mod:`.rdf`, :mod:`.observables`) as a
backend: implementations of the RDF's pair histogram (:func:`alchemi_lit.core.rdf.
pair_histogram`), the MSD/VACF sample (:func:`alchemi_lit.core.correlation.
window_sample`) and the block sums
(:func:`alchemi_lit.core.blocking.update`), registered with
:mod:`alchemi_lit.core.backends` when it first dispatches.

Each takes the inputs :func:`~alchemi_lit.kernels.usable` accepts and returns new
tensors (the batch fields it read keep their bits).  Held to the torch references by
``tests/kernels/test_observable_kernels.py`` and ``tests/kernels/test_rdf_kernel.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .. import kernels
from ..core import blocking, correlation, rdf
from ..core.segments import Segments
from .backend import BACKEND


def _histogram_takes(positions: torch.Tensor, cell: torch.Tensor, pbc: torch.Tensor,
                     system: torch.Tensor, numbers: torch.Tensor, n_atoms: torch.Tensor,
                     *args: Any) -> bool:  # fmt: skip
    return kernels.usable(positions, cell, pbc, numbers, n_atoms) and positions.shape[0] > 0


@rdf.pair_histogram.register(BACKEND, _histogram_takes)
def pair_histogram(
    positions: torch.Tensor, cell: torch.Tensor, pbc: torch.Tensor, system: torch.Tensor,
    numbers: torch.Tensor, n_atoms: torch.Tensor, pairs: tuple[torch.Tensor, torch.Tensor],
    weights: torch.Tensor, rmax: float, nbins: int, partials: Sequence[tuple[int, int]],
) -> torch.Tensor:  # fmt: skip
    counts = n_atoms.to(torch.int64).numpy()
    starts = np.cumsum(counts) - counts
    inverse = torch.linalg.inv_ex(cell).inverse.numpy()
    inverse = np.ascontiguousarray(inverse)  # (LAPACK's order is not C's: the loop vectorises less)
    first = np.array([a for a, _ in partials], dtype=np.int64)
    second = np.array([b for _, b in partials], dtype=np.int64)
    out = np.zeros((len(counts), 1 + len(partials), nbins), dtype=positions.numpy().dtype)
    kernels.load("rdf").pair_histogram(
        positions.numpy(), cell.numpy(), inverse, pbc.numpy(), starts, counts,
        numbers.to(torch.int64).numpy(), first, second, float(rmax), int(nbins), out,
    )  # fmt: skip
    return torch.from_numpy(out)


def _copy(t: torch.Tensor) -> np.ndarray:
    return t.numpy().copy()


def _update_takes(*tensors: Any) -> bool:
    return kernels.usable(*(t for t in tensors if isinstance(t, torch.Tensor)))


def _sample_takes(x: torch.Tensor, *args: Any) -> bool:
    return x.shape[0] > 0 and _update_takes(x, *args)


@correlation.window_sample.register(BACKEND, _sample_takes)
def window_sample(
    x: torch.Tensor, origin: torch.Tensor, rows: torch.Tensor, free: torch.Tensor,
    count: torch.Tensor, segments: Segments, samples: torch.Tensor, curve: torch.Tensor,
    total: torch.Tensor, estimates: torch.Tensor, windows: torch.Tensor, dt: torch.Tensor,
    step_dt: torch.Tensor, weights: torch.Tensor, squared: bool, dt_power: int, scale: float,
) -> tuple[torch.Tensor, ...]:  # fmt: skip
    out = [_copy(t) for t in (origin, curve, dt, total, estimates, windows, samples)]
    o, c, d, tot, est, win, n = out
    xs = x.numpy()
    starts, counts = segments.bounds
    kernels.load("observables").window_sample(
        xs, o, rows.numpy(), free.to(x.dtype).numpy(), count.to(x.dtype).numpy(), starts,
        counts, bool(squared), n, c, tot, est, win, d, step_dt.to(x.dtype).numpy(),
        weights.to(x.dtype).numpy(), int(dt_power), float(scale),
        np.zeros(len(counts), dtype=xs.dtype),
    )  # fmt: skip
    return tuple(torch.from_numpy(a) for a in out)


@blocking.update.register(BACKEND, _update_takes)
def block_update(
    n: torch.Tensor, shift: torch.Tensor, partial: torch.Tensor, sums: torch.Tensor,
    squares: torch.Tensor, x: torch.Tensor, rows: torch.Tensor,
) -> tuple[torch.Tensor, ...]:  # fmt: skip
    out = [_copy(t) for t in (n, shift, partial, sums, squares)]
    kernels.load("observables").block_update(*out, x.numpy(), rows.numpy())
    return tuple(torch.from_numpy(a) for a in out)
