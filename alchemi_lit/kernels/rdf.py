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
    ``first[p]`` and second ``second[p]`` (:func:`alchemi_lit.core.rdf.pair_weights`).

    Each atom's row of pairs is two loops: the bins of all its partners, with no branch
    (the compiler vectorises the minimum image, the root and the division; a
    non-periodic axis subtracts ``0 * rint``), then the counts of the bins in range."""
    dr = rmax / nbins
    partials = first.shape[0]
    for b in range(starts.shape[0]):
        s, n = starts[b], counts[b]
        fx = np.empty(n, dtype=positions.dtype)
        fy = np.empty(n, dtype=positions.dtype)
        fz = np.empty(n, dtype=positions.dtype)
        for i in range(n):
            x, y, z = positions[s + i, 0], positions[s + i, 1], positions[s + i, 2]
            fx[i] = x * inverse[b, 0, 0] + y * inverse[b, 1, 0] + z * inverse[b, 2, 0]
            fy[i] = x * inverse[b, 0, 1] + y * inverse[b, 1, 1] + z * inverse[b, 2, 1]
            fz[i] = x * inverse[b, 0, 2] + y * inverse[b, 1, 2] + z * inverse[b, 2, 2]
        c00, c01, c02 = cell[b, 0, 0], cell[b, 0, 1], cell[b, 0, 2]
        c10, c11, c12 = cell[b, 1, 0], cell[b, 1, 1], cell[b, 1, 2]
        c20, c21, c22 = cell[b, 2, 0], cell[b, 2, 1], cell[b, 2, 2]
        w0 = 1.0 if pbc[b, 0] else 0.0
        w1 = 1.0 if pbc[b, 1] else 0.0
        w2 = 1.0 if pbc[b, 2] else 0.0
        q = np.empty(n, dtype=positions.dtype)
        for i in range(n - 1):
            a0, a1, a2 = fx[i], fy[i], fz[i]
            for j in range(i + 1, n):
                f0 = fx[j] - a0
                f1 = fy[j] - a1
                f2 = fz[j] - a2
                f0 = f0 - w0 * np.rint(f0)  # (half to even, as torch.round)
                f1 = f1 - w1 * np.rint(f1)
                f2 = f2 - w2 * np.rint(f2)
                x = f0 * c00 + f1 * c10 + f2 * c20
                y = f0 * c01 + f1 * c11 + f2 * c21
                z = f0 * c02 + f1 * c12 + f2 * c22
                q[j] = np.ceil(np.sqrt(x * x + y * y + z * z) / dr)  # (NaN: no bin)
            zi = numbers[s + i]
            for j in range(i + 1, n):
                if not (q[j] >= 1 and q[j] <= nbins):
                    continue
                k = int(q[j]) - 1
                out[b, 0, k] += 2
                if partials:
                    zj = numbers[s + j]
                    for p in range(partials):
                        if zi == first[p] and zj == second[p]:
                            out[b, p + 1, k] += 1
                        if zi == second[p] and zj == first[p]:
                            out[b, p + 1, k] += 1
    return out
