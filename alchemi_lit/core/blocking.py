"""Block averaging (Flyvbjerg & Petersen, J. Chem. Phys. 91, 461 (1989)): the mean of a
correlated time series and its statistical error.

Why: successive MD samples are correlated, so ``std / sqrt(n)`` understates the error of
their mean.  Averaging blocks of ``2^l`` consecutive samples gives block means that are
nearly independent once the block outlasts the correlation time; the naive error of
those means, ``sigma_l = sqrt(var_l / (m_l - 1))`` over the ``m_l = floor(n / 2^l)``
complete blocks, grows with ``l`` and levels off at the true error.  The level read is
the smallest ``l`` with ``(2^l)^3 > 2 n (sigma_l / sigma_0)^4`` (Lee, Drummond & Needs,
Phys. Rev. B 83, 245117 (2011), the rule pyblock uses); if no level meets it the series
is too short for its correlation time and the last level with at least 4 blocks is
read, flagged ``plateau=False``.  ``sigma_l / sqrt(2 (m_l - 1))`` is the error of the
error.

Two forms, the same arithmetic: :class:`BlockState` accumulates many series at once in
torch (one ``[B, Q, L]`` set of sums, updated in a few elementwise operations per
sample whatever the number of levels: level ``l`` adds the sample to its running block
sum and closes the block when the sample count is a multiple of ``2^l``), and
:func:`block_average` takes a finished series.  Samples are taken relative to the
first one (``shift``) so the sums of squares keep their digits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .backends import primitive

#: block sizes 1, 2, ..., 2^(LEVELS - 1)
LEVELS = 24


@dataclass
class BlockResult:
    """The block-averaged mean of one series, its error (``error``), the error of that
    error, the block size it was read at, whether the Lee et al. criterion found a
    plateau, the number of samples and the naive error per level (``errors``)."""

    mean: float
    error: float
    error_of_error: float
    block_size: int
    plateau: bool
    samples: int
    errors: np.ndarray


@primitive
def update(
    n: torch.Tensor, shift: torch.Tensor, partial: torch.Tensor, sums: torch.Tensor,
    squares: torch.Tensor, x: torch.Tensor, rows: torch.Tensor,
) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """*Primitive* (a numba kernel on CPU).  One sample ``x`` ``[B, Q]`` of the series of
    ``rows`` ``[B]``: the new ``n`` ``[B]``
    (samples so far), ``shift`` ``[B, Q]`` (the first sample), and the block sums
    ``partial`` (open blocks), ``sums`` and ``squares`` (of closed block means), each
    ``[B, Q, L]``.  Rows not in ``rows`` keep their bits."""
    levels = partial.shape[-1]
    first = rows & (n == 0)
    shift = torch.where(first.unsqueeze(-1), x, shift)
    y = (x - shift).unsqueeze(-1)
    size = 2 ** torch.arange(levels, device=x.device)
    count = n + 1
    closes = rows.unsqueeze(-1) & (count.unsqueeze(-1) % size == 0)  # [B, L]
    live = rows.view(-1, 1, 1)
    partial = torch.where(live, partial + y, partial)
    mean = partial / size.to(x.dtype)
    shut = closes.unsqueeze(1)
    sums = torch.where(shut, sums + mean, sums)
    squares = torch.where(shut, squares + mean * mean, squares)
    partial = torch.where(shut, torch.zeros_like(partial), partial)
    return torch.where(rows, count, n), shift, partial, sums, squares


def result(n: int, shift: float, sums: np.ndarray, squares: np.ndarray) -> BlockResult:
    """The :class:`BlockResult` of one series from its accumulated sums ``[L]``."""
    levels = len(sums)
    m = np.array([n >> l for l in range(levels)], dtype=np.float64)
    errors = np.full(levels, np.nan)
    ok = m >= 2
    mean_l = np.where(ok, sums / np.maximum(m, 1), np.nan)
    var = np.where(ok, squares / np.maximum(m, 1) - mean_l**2, np.nan)
    errors[ok] = np.sqrt(np.maximum(var[ok], 0.0) / (m[ok] - 1))
    mean = shift + (sums[0] / n if n else np.nan)
    if n < 2:
        return BlockResult(float(mean), np.nan, np.nan, 1, False, int(n), errors)
    size = 2.0 ** np.arange(levels)
    sigma0 = errors[0]
    if sigma0 > 0:
        meets = ok & (size**3 > 2.0 * n * (errors / sigma0) ** 4)
    else:  # a constant series: every level's error is 0
        meets = ok.copy()
    if meets.any():
        level, plateau = int(np.argmax(meets)), True
    else:
        enough = np.nonzero(m >= 4)[0]
        level, plateau = (int(enough[-1]) if len(enough) else 0), False
    err = float(errors[level])
    return BlockResult(
        float(mean), err, err / np.sqrt(2.0 * (m[level] - 1)), int(size[level]), plateau,
        int(n), errors,
    )  # fmt: skip


def block_average(series: np.ndarray | torch.Tensor, levels: int = LEVELS) -> BlockResult:
    """The block-averaged mean and error of a 1-D series (module docstring): the same
    sums :class:`~alchemi_lit.callbacks.BlockAverages` accumulates during a run (equal to
    rounding: here each block is summed at once)."""
    x = np.asarray(series, dtype=np.float64).reshape(-1)
    n = len(x)
    if n == 0:
        raise ValueError("block_average: the series is empty")
    y = x - x[0]
    sums, squares = np.zeros(levels), np.zeros(levels)
    for level in range(levels):
        size = 1 << level
        m = n // size
        if m == 0:
            break
        means = y[: m * size].reshape(m, size).sum(axis=1) / size
        sums[level], squares[level] = means.sum(), (means * means).sum()
    return result(n, float(x[0]), sums, squares)


__all__ = ["LEVELS", "BlockResult", "block_average", "result", "update"]
