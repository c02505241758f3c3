"""The RDF's pair histogram as a compiled CPU loop (see :mod:`alchemi_lit.kernels`):
each system's unordered pairs visited in place, none stored.

Why: the torch reference (:func:`alchemi_lit.core.rdf.pair_histogram`) gathers per pair
the fractional coordinates, the system's cell and a bin index -- tens of bytes of
temporaries per pair, and an RDF sample of 64 argon crystals of 108 atoms has 370k pairs.
Here a pair costs its arithmetic: the same operations in the same order (fractional
coordinates per atom, minimum image on periodic axes, Cartesian length, ASE's bin), so
the counts are the reference's.
"""

from __future__ import annotations

import numpy as np

from .cache import compiled


@compiled
def pair_histogram(positions, cell, inverse, pbc, starts, counts, numbers, first, second,
                   rmax, nbins, out):  # fmt: skip
    """Add into ``out`` ``[B, 1 + P, nbins]`` (zeros) each system's pair counts: 2 per
    unordered pair in the total, and for partial ``p`` one per order whose first atom is
    ``first[p]`` and second ``second[p]`` (:func:`alchemi_lit.core.rdf.pair_weights`)."""
    dr = rmax / nbins
    beyond = (rmax * (1.0 + 1e-12)) ** 2  # (surely past the last bin: no root, no bin)
    for b in range(starts.shape[0]):
        s, n = starts[b], counts[b]
        frac = np.empty((n, 3), dtype=positions.dtype)
        for i in range(n):
            for c in range(3):
                frac[i, c] = (positions[s + i, 0] * inverse[b, 0, c]
                              + positions[s + i, 1] * inverse[b, 1, c]
                              + positions[s + i, 2] * inverse[b, 2, c])  # fmt: skip
        for i in range(n):
            zi = numbers[s + i]
            for j in range(i + 1, n):
                f0 = frac[j, 0] - frac[i, 0]
                f1 = frac[j, 1] - frac[i, 1]
                f2 = frac[j, 2] - frac[i, 2]
                if pbc[b, 0]:
                    f0 -= np.rint(f0)  # (half to even, as torch.round)
                if pbc[b, 1]:
                    f1 -= np.rint(f1)
                if pbc[b, 2]:
                    f2 -= np.rint(f2)
                x = f0 * cell[b, 0, 0] + f1 * cell[b, 1, 0] + f2 * cell[b, 2, 0]
                y = f0 * cell[b, 0, 1] + f1 * cell[b, 1, 1] + f2 * cell[b, 2, 1]
                z = f0 * cell[b, 0, 2] + f1 * cell[b, 1, 2] + f2 * cell[b, 2, 2]
                d2 = x * x + y * y + z * z
                if d2 > beyond:
                    continue
                q = np.ceil(np.sqrt(d2) / dr)  # (NaN: no bin)
                if not (q >= 1 and q <= nbins):
                    continue
                k = int(q) - 1
                out[b, 0, k] += 2
                zj = numbers[s + j]
                for p in range(first.shape[0]):
                    if zi == first[p] and zj == second[p]:
                        out[b, p + 1, k] += 1
                    if zi == second[p] and zj == first[p]:
                        out[b, p + 1, k] += 1
    return out
