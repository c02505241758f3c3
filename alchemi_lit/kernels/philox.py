"""The keyed Philox4x32-10 words of :func:`alchemi_lit.core.random.atom_normals`, and the
uniforms made of them, as one compiled CPU loop (see :mod:`alchemi_lit.kernels`).

Why: Philox's ten rounds are ~100 integer passes over the atoms in torch, and turning
words into uniforms twelve more: together most of a Langevin step's noise draw on CPU;
here they are one loop that reads each key once (figures in BENCHMARKS.md, "Relaxation
and MD against the peers").  The words are bit for bit those of
:func:`~alchemi_lit.core.random.philox4x32` (the same keys, counters, constants and key
schedule, in uint32 words with 64-bit products) and the uniforms are computed as torch
does (exact sum, one rounded product), so the normals are the same to the bit (tested).
Box-Muller's logarithm, sine and cosine stay in torch, whose vectorised (SLEEF) ones
beat the scalar libm a numba loop gets here (no SVML).
"""

from __future__ import annotations

import numpy as np

from ..core.random import _M0, _M1, _MASK32, _W0, _W1
from .cache import compiled


@compiled
def atom_uniforms(
    seed_lo, seed_hi, system_id, step, system_idx, local_index, purpose, two_pi, ahead
):  # fmt: skip
    """Each atom's four Philox4x32-10 words of the key ``(seed, system_id, step, purpose,
    local index)`` as the uniforms Box-Muller takes, float64 ``[4, ahead N]``: ``u0``,
    ``u2`` on (0, 1) and ``phi0``, ``phi1`` on (0, 2 pi) (words 0, 2, 1, 3; see
    :func:`~alchemi_lit.core.random.box_muller_block`); block ``k`` of ``N`` columns is
    drawn at ``step + k``."""
    n = system_idx.shape[0]
    # each atom's key words and step, gathered once for every block
    key0, key1 = np.empty(n, np.uint32), np.empty(n, np.uint32)
    at0 = np.empty(n, np.int64)
    for i in range(n):
        b = system_idx[i]
        if b < 0 or b >= system_id.shape[0]:
            raise IndexError("atom_normals: a system_idx is not a row of system_id")
        key0[i] = np.uint32((system_id[b] ^ seed_lo) & _MASK32)
        key1[i] = np.uint32(((system_id[b] >> 32) ^ seed_hi ^ 0x5BD1E995) & _MASK32)
        at0[i] = step[b]
    m0, m1, w0, w1 = np.uint64(_M0), np.uint64(_M1), np.uint32(_W0), np.uint32(_W1)
    shift, salt = np.uint64(32), np.uint32(purpose & _MASK32)
    unit, angle = 1.0 / 4294967296.0, two_pi / 4294967296.0  # as random._uniform scales
    out = np.empty((4, ahead * n), dtype=np.float64)
    # uint32 words and contiguous reads: LLVM vectorises the rounds (a 32 x 32 -> 64-bit
    # product of zero-extended words is one SIMD multiply), unlike a scalar uint64 loop
    for block in range(ahead):
        first = block * n
        for i in range(n):
            at = at0[i] + block
            c0, c1 = np.uint32(local_index[i] & _MASK32), np.uint32(at & _MASK32)
            c2, c3 = np.uint32((at >> 32) & _MASK32), salt
            k0, k1 = key0[i], key1[i]
            for _ in range(10):
                p0, p2 = np.uint64(c0) * m0, np.uint64(c2) * m1
                c0 = np.uint32(p2 >> shift) ^ c1 ^ k0
                c2 = np.uint32(p0 >> shift) ^ c3 ^ k1
                c1, c3 = np.uint32(p2), np.uint32(p0)
                k0, k1 = np.uint32(k0 + w0), np.uint32(k1 + w1)  # the Weyl key schedule
            # (word + 0.5) * scale: exact sum, one rounding, as in torch
            out[0, first + i] = (np.float64(c0) + 0.5) * unit
            out[1, first + i] = (np.float64(c2) + 0.5) * unit
            out[2, first + i] = (np.float64(c1) + 0.5) * angle
            out[3, first + i] = (np.float64(c3) + 0.5) * angle
    return out
