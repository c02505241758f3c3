"""Radial distribution functions of many systems at once, in torch.

Why its own all-pairs code and not the models' neighbour list: an RDF sample needs every
pair within ``rmax`` of one frame, binned exactly as ``ase.geometry.rdf.get_rdf`` bins
them, on whatever device the batch lives, reading nothing on the host.  Each unordered
pair ``i < j`` of a system is counted once with weight 2 (both orders: ASE's counts), so a
sample handles ``n (n - 1) / 2`` pairs per system, from fractional coordinates computed
once per atom; the counts are sums of small integers, exact whatever their order -- a
system's histogram does not depend on its batch mates, on any device.  The histogram is a
primitive (:class:`~alchemi_lit.core.backends.Primitive`): on CPU a numba kernel loops
over each system's pairs without building them (``alchemi_lit.kernels.rdf``); the torch
reference below is the accelerator path, its pairs enumerated once per batch layout
(``n^2 / 2`` per system: it suits systems up to a few thousand atoms).

Conventions (ASE's, so that :func:`rdf_frame` equals ``get_rdf`` to rounding): bin edges
``linspace(0, rmax, nbins + 1)``; a pair at distance ``d`` goes to bin
``ceil(d / dr) - 1`` (``d == 0``, an atom with itself, to none); the minimum image on
periodic axes, which is the only image within ``rmax`` because ``rmax`` may not exceed
half the cell's smallest periodic height (:func:`cell_fits`; ASE raises ``CellTooSmall``);
``g(r) = counts / (n_i rho_j V_shell)`` with ``n_i`` the atoms of the first element (all
atoms for the total RDF), ``rho_j`` the number density of the second and ``V_shell`` the
exact shell volume.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .backends import primitive
from .system_sums import cell_volume


def all_pairs(n_atoms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every unordered pair ``i < j`` of atoms of the same system, as global atom indices
    ``[P]`` -- ``sum(n (n - 1) / 2)`` pairs.  (Host reads of the counts, made once per
    batch layout.)"""
    device = n_atoms.device
    n = n_atoms.to(torch.int64)
    squares = n * n
    total = int(squares.sum())  # once per layout: the pairs' count sizes the tensors
    system = torch.repeat_interleave(torch.arange(len(n), device=device), squares,
                                     output_size=total)  # fmt: skip
    first_pair = torch.cumsum(squares, 0) - squares
    first_atom = torch.cumsum(n, 0) - n
    local = torch.arange(total, device=device) - first_pair[system]
    size = n[system]
    i, j = local // size, local % size
    keep = i < j
    return first_atom[system][keep] + i[keep], first_atom[system][keep] + j[keep]


def cell_fits(cell: torch.Tensor, pbc: torch.Tensor, rmax: float) -> torch.Tensor:
    """``[B]`` whether ``rmax`` is at most half of every periodic height of the cell
    (then the minimum image is the only image within ``rmax``; ASE's check)."""
    volume = cell_volume(cell)
    heights = []
    for k in range(3):
        cross = torch.linalg.cross(cell[:, (k + 1) % 3], cell[:, (k + 2) % 3])
        heights.append(volume / torch.linalg.vector_norm(cross, dim=-1).clamp_min(1e-300))
    h = torch.stack(heights, -1)
    return (~pbc | (h >= 2.0 * rmax)).all(-1) & (volume > 1e-10)


def pair_distances(
    positions: torch.Tensor, cell: torch.Tensor, pbc: torch.Tensor, system: torch.Tensor,
    i: torch.Tensor, j: torch.Tensor,
) -> torch.Tensor:  # fmt: skip
    """``[P]`` minimum-image distances of the pairs ``(i, j)`` (``system``: each atom's
    row): fractional coordinates once per atom, then elementwise per pair -- no matrix
    product spans systems."""
    inverse = torch.linalg.inv_ex(cell).inverse  # [B, 3, 3] (no error check: no host read)
    frac = (positions.unsqueeze(-1) * inverse[system]).sum(-2)  # [N, 3]
    row = system[i]
    df = frac[j] - frac[i]
    df = df - torch.where(pbc[row], torch.round(df), torch.zeros_like(df))
    d = (df.unsqueeze(-1) * cell[row]).sum(-2)
    return torch.sqrt((d * d).sum(-1))


def bin_edges(rmax: float, nbins: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """``[nbins + 1]`` ASE's bin edges, ``linspace(0, rmax, nbins + 1)``."""
    return torch.linspace(0.0, rmax, nbins + 1, dtype=dtype)


def shell_volumes(rmax: float, nbins: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """``[nbins]`` volume of each spherical shell, as ASE writes it."""
    dr = float(rmax / nbins)
    e = bin_edges(rmax, nbins, dtype)[:-1]
    return 4.0 * math.pi * dr * (e * e + e * dr + dr * dr / 3.0)


def pair_weights(numbers: torch.Tensor, i: torch.Tensor, j: torch.Tensor,
                 partials: Sequence[tuple[int, int]]) -> torch.Tensor:  # fmt: skip
    """``[1 + len(partials), P]`` weights of the unordered pairs :func:`all_pairs` gives:
    2 for every pair (both orders), then for each ``(a, b)`` of ``partials`` how many of
    the pair's two orders have the first atom of element ``a`` and the second of ``b``."""
    zi, zj = numbers[i], numbers[j]
    rows = [torch.full_like(zi, 2)]
    rows += [((zi == a) & (zj == b)).long() + ((zi == b) & (zj == a)).long()
             for a, b in partials]  # fmt: skip
    return torch.stack(rows).to(torch.float64)


@primitive
def pair_histogram(
    positions: torch.Tensor, cell: torch.Tensor, pbc: torch.Tensor, system: torch.Tensor,
    numbers: torch.Tensor, n_atoms: torch.Tensor, pairs: tuple[torch.Tensor, torch.Tensor],
    weights: torch.Tensor, rmax: float, nbins: int, partials: Sequence[tuple[int, int]],
) -> torch.Tensor:  # fmt: skip
    """*Primitive.*  ``[B, 1 + len(partials), nbins]`` pair counts of one frame, in the
    positions' dtype: bin ``ceil(d / dr) - 1`` of each pair within ``rmax`` (ASE's), with
    the :func:`pair_weights` of ``pairs`` (the numba kernel counts the same pairs from
    ``n_atoms`` and ``numbers`` alone)."""
    i, j = pairs
    b, k = len(n_atoms), weights.shape[0]
    dr = float(rmax / nbins)
    d = pair_distances(positions, cell, pbc, system, i, j)
    index = torch.clamp(torch.ceil(d / dr), max=nbins + 1).to(torch.int64)  # 0: none, nbins+1: out
    row = system[i]
    flat = (row * k).unsqueeze(0) + torch.arange(k, device=d.device).unsqueeze(1)
    flat = flat * (nbins + 2) + index.unsqueeze(0)
    counts = torch.zeros(b * k * (nbins + 2), dtype=positions.dtype, device=d.device)
    counts.index_add_(0, flat.reshape(-1), weights.to(positions.dtype).reshape(-1))
    return counts.reshape(b, k, nbins + 2)[:, :, 1 : nbins + 1]


def rdf_frame(
    positions: torch.Tensor, cell: torch.Tensor, pbc: torch.Tensor, system: torch.Tensor,
    numbers: torch.Tensor, n_atoms: torch.Tensor, pairs: tuple[torch.Tensor, torch.Tensor],
    weights: torch.Tensor, rmax: float, nbins: int,
    partials: Sequence[tuple[int, int]] = (),
) -> torch.Tensor:  # fmt: skip
    """``[B, 1 + len(partials), nbins]`` g(r) of one frame of every system: the total
    RDF, then the partial of each ``(a, b)`` of ``partials`` (atomic numbers; NaN where
    a system has no atom of ``a`` or ``b``).  ``weights`` are :func:`pair_weights`."""
    counts = pair_histogram(positions, cell, pbc, system, numbers, n_atoms, pairs, weights,
                            rmax, nbins, tuple(partials))  # fmt: skip
    norm = normalization(cell, numbers, system, rmax, nbins, partials, positions.dtype)
    return normalized(counts, norm)


def normalization(
    cell: torch.Tensor, numbers: torch.Tensor, system: torch.Tensor, rmax: float, nbins: int,
    partials: Sequence[tuple[int, int]], dtype: torch.dtype,
) -> torch.Tensor:  # fmt: skip
    """``[B, 1 + len(partials), nbins]`` ``n_i rho_j V_shell`` of each RDF of each system
    (0 where it lacks an element): a function of the cells and the layout alone, so a
    run keeps it while they are unchanged."""
    volume = cell_volume(cell)
    centres, others = element_counts(numbers, system, len(cell), partials, dtype)
    density = others / volume.unsqueeze(-1)
    shells = shell_volumes(rmax, nbins, dtype).to(cell.device)
    return (centres * density).unsqueeze(-1) * shells


def normalized(counts: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
    """g(r) from a frame's pair counts and their :func:`normalization` (NaN: no atoms)."""
    return torch.where(norm > 0, counts / norm.clamp_min(1e-300), float("nan"))


def element_counts(
    numbers: torch.Tensor, system: torch.Tensor, b: int, partials: Sequence[tuple[int, int]],
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``[B, 1 + P]`` the centre atoms and the neighbour atoms each RDF counts."""
    ones = torch.ones_like(numbers, dtype=dtype)
    total = torch.zeros(b, dtype=dtype, device=numbers.device).index_add_(0, system, ones)
    centres, others = [total], [total]
    for a, c in partials:
        for z, out in ((a, centres), (c, others)):
            hit = (numbers == z).to(dtype)
            zeros = torch.zeros(b, dtype=dtype, device=numbers.device)
            out.append(zeros.index_add_(0, system, hit))
    return torch.stack(centres, -1), torch.stack(others, -1)


def element_pairs(spec: Sequence[Sequence[int | str]]) -> list[tuple[int, int]]:
    """``[("Si", "O"), (8, 8)]`` as atomic-number pairs (a clear error for unknown names)."""
    from ase.symbols import symbols2numbers

    out = []
    for pair in spec:
        if isinstance(pair, str) or len(pair) != 2:
            raise ValueError(f"RDF element pairs are (a, b) pairs like ('Si', 'O'), got {pair!r}")
        try:
            a, b = symbols2numbers(list(pair))
        except (KeyError, ValueError) as exc:
            raise ValueError(f"RDF: unknown element in pair {pair!r}: {exc}") from exc
        out.append((int(a), int(b)))
    return out


__all__ = [
    "all_pairs", "bin_edges", "cell_fits", "element_counts", "element_pairs", "normalization",
    "normalized", "pair_distances", "pair_histogram", "pair_weights", "rdf_frame",
    "shell_volumes",
]  # fmt: skip
