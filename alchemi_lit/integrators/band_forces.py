"""NEB forces of bands packed densely: ASE's ``NEB.get_forces`` as tensor math.

A group holds ``G`` bands of ``n`` images (endpoints included) of ``a`` atoms each:
positions ``x [G, n, a, 3]``, energies ``e [G, n]``, the interior images' model forces
``f [G, n - 2, a, 3]``, spring constants ``k [G, n - 1]`` and one cell and pbc per band.
Everything below follows ``ase.mep.neb`` (3.29) formula by formula -- spring vectors
by the minimum-image convention (``find_mic``), the three tangents (``aseneb``,
``improvedtangent``, ``spline``), the climbing image -- so that an optimizer fed these
forces takes ASE's steps; the batch bookkeeping around it is in :mod:`.neb`.
"""

from __future__ import annotations

import itertools

import torch

from ..core.tensor_ops import small_matmul

METHODS = ("aseneb", "improvedtangent", "spline")


def minimum_image(d: torch.Tensor, cell: torch.Tensor, pbc: torch.Tensor | None) -> torch.Tensor:
    """Shortest periodic images of displacements ``d [G, ..., 3]`` per band (``cell [G,
    3, 3]``, ``pbc [G, 3]``; None: no band is periodic): wrapped to fractional
    ``[-1/2, 1/2)``, then the nearest of the 27 (9, 3) neighbouring shifts, as ASE's
    ``find_mic`` for any cell shape."""
    if pbc is None:
        return d
    periodic = pbc & (cell.abs().sum(-1) > 0)  # ASE: cell.any(1) & pbc
    eye = torch.eye(3, dtype=cell.dtype, device=cell.device)
    full = torch.where(periodic[..., None], cell, eye)  # a complete basis to solve in
    shape = d.shape
    flat = d.reshape(len(d), -1, 3)
    frac = torch.linalg.solve(full.transpose(-1, -2), flat.transpose(-1, -2)).transpose(-1, -2)
    frac = torch.where(periodic[:, None, :], frac - torch.floor(frac + 0.5), frac)
    base = small_matmul(frac, full)
    shifts = torch.tensor(list(itertools.product((-1, 0, 1), repeat=3)), dtype=cell.dtype)
    shifts = shifts.to(cell.device)[None] * periodic[:, None, :]  # [G, 27, 3]
    candidates = base[:, :, None, :] + small_matmul(shifts, full)[:, None, :, :]  # [G, M, 27, 3]
    best = (candidates * candidates).sum(-1).argmin(-1, keepdim=True)
    out = candidates.gather(2, best[..., None].expand(-1, -1, 1, 3)).squeeze(2)
    return out.reshape(shape)


def _dot(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Per image ``[G, m]`` dot product over atoms and xyz."""
    return (u * v).sum((-1, -2))


def highest_image(e: torch.Tensor) -> torch.Tensor:
    """ASE's ``imax``: the interior image of highest energy ``[G]`` (the last of a tie,
    as ``argsort(...)[-1]``)."""
    inner = e[:, 1:-1]
    last = inner.flip(-1).argmax(-1)
    return inner.shape[1] - last  # 1-based image index


def band_forces(
    x: torch.Tensor,
    e: torch.Tensor,
    f: torch.Tensor,
    k: torch.Tensor,
    cell: torch.Tensor,
    pbc: torch.Tensor | None,
    method: str,
    climbing: torch.Tensor,
) -> torch.Tensor:
    """NEB forces on the interior images ``[G, n - 2, a, 3]``; ``climbing [G]`` bool
    says which bands invert the tangential force on their highest image."""
    n = x.shape[1]
    t = minimum_image(x[:, 1:] - x[:, :-1], cell, pbc)  # springs [G, n - 1, a, 3]
    nt = torch.sqrt(_dot(t, t))  # [G, n - 1]
    t1, t2, nt1, nt2, k1, k2 = t[:, :-1], t[:, 1:], nt[:, :-1], nt[:, 1:], k[:, :-1], k[:, 1:]
    em, ei, ep = e[:, :-2], e[:, 1:-1], e[:, 2:]
    imax = highest_image(e)
    index = torch.arange(1, n - 1, device=x.device)[None, :]
    col = (..., None, None)  # [G, m] -> [G, m, 1, 1]
    if method == "aseneb":
        tangent = torch.where(
            (index < imax[:, None])[col], t2, torch.where((index > imax[:, None])[col], t1, t1 + t2)
        )
        mag = _dot(tangent, tangent)
        mag = torch.where(mag != 0, mag, torch.ones_like(mag))
        along = _dot(f, tangent) / mag
        spring = _dot(t1 * k1[col] - t2 * k2[col], tangent) / mag
        nudged = f - along[col] * tangent - spring[col] * tangent
    else:
        if method == "improvedtangent":
            tangent = _improved_tangent(t1, t2, em, ei, ep)
        else:
            tangent, curvature = _spline_derivatives(x, nt)
        norm = torch.sqrt(_dot(tangent, tangent))
        if method == "spline":  # (ASE's precon norm; identity)
            tangent = tangent / norm[col]
        else:
            tangent = tangent / torch.where(norm > 0, norm, torch.ones_like(norm))[col]
        along = _dot(f, tangent)
        nudged = f - along[col] * tangent
        if method == "improvedtangent":
            nudged = nudged + (nt2 * k2 - nt1 * k1)[col] * tangent
        else:
            kk = 0.5 * (k1 + k2) / n**2
            nudged = nudged + (kk * _dot(curvature, tangent))[col] * tangent
    climber = (index == imax[:, None]) & climbing[:, None]
    climbed = f - (2 * along)[col] * tangent  # (aseneb: along is F.t / t.t)
    return torch.where(climber[col], climbed, nudged)


def _improved_tangent(
    t1: torch.Tensor, t2: torch.Tensor, em: torch.Tensor, ei: torch.Tensor, ep: torch.Tensor
) -> torch.Tensor:
    """Henkelman-Jónsson's tangent (ASE's ``ImprovedTangentMethod``), not normalised."""
    col = (..., None, None)
    up = (ep > ei) & (ei > em)
    down = (ep < ei) & (ei < em)
    dp, dm = (ep - ei).abs(), (em - ei).abs()
    vmax, vmin = torch.maximum(dp, dm), torch.minimum(dp, dm)
    mixed = torch.where(
        (ep > em)[col], t2 * vmax[col] + t1 * vmin[col], t2 * vmin[col] + t1 * vmax[col]
    )
    return torch.where(up[col], t2, torch.where(down[col], t1, mixed))


def _spline_derivatives(x: torch.Tensor, nt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """First and second derivatives ``[G, n - 2, a, 3]`` at the interior images of the
    not-a-knot cubic spline through the images' positions against their normalised arc
    length (ASE's ``PreconImages.spline_fit`` with the identity preconditioner, which
    is scipy's ``CubicSpline``)."""
    g, n = x.shape[:2]
    y = x.reshape(g, n, -1)
    d = torch.cat([torch.zeros_like(nt[:, :1]), nt], 1)
    s = d.cumsum(1) / d.sum(1, keepdim=True)
    h = s[:, 1:] - s[:, :-1]  # [G, n - 1]
    slope = (y[:, 1:] - y[:, :-1]) / h[..., None]
    a = torch.zeros(g, n, n, dtype=x.dtype, device=x.device)
    b = torch.empty_like(y)
    if n == 3:  # scipy: a parabola through the three points
        a[:, 0, 0] = a[:, 0, 1] = a[:, 2, 1] = a[:, 2, 2] = 1
        a[:, 1, 0], a[:, 1, 1], a[:, 1, 2] = h[:, 1], 2 * (h[:, 0] + h[:, 1]), h[:, 0]
        b[:, 0], b[:, 2] = 2 * slope[:, 0], 2 * slope[:, 1]
        b[:, 1] = 3 * (h[:, 0, None] * slope[:, 1] + h[:, 1, None] * slope[:, 0])
    else:
        rows = torch.arange(1, n - 1, device=x.device)
        a[:, rows, rows] = 2 * (h[:, :-1] + h[:, 1:])
        a[:, rows, rows + 1] = h[:, :-1]
        a[:, rows, rows - 1] = h[:, 1:]
        b[:, 1:-1] = 3 * (h[:, 1:, None] * slope[:, :-1] + h[:, :-1, None] * slope[:, 1:])
        d0, d1 = s[:, 2] - s[:, 0], s[:, -1] - s[:, -3]
        a[:, 0, 0], a[:, 0, 1] = h[:, 1], d0
        left = (h[:, 0] + 2 * d0)[:, None] * h[:, 1, None] * slope[:, 0]
        b[:, 0] = (left + (h[:, 0] ** 2)[:, None] * slope[:, 1]) / d0[:, None]
        a[:, -1, -1], a[:, -1, -2] = h[:, -2], d1
        right = (2 * d1 + h[:, -1])[:, None] * h[:, -2, None] * slope[:, -1]
        b[:, -1] = ((h[:, -1] ** 2)[:, None] * slope[:, -2] + right) / d1[:, None]
    m = torch.linalg.solve(a, b)  # first derivatives at the knots [G, n, 3a]
    hi = h[:, 1:, None]  # the interval to the right of each interior knot
    sl = slope[:, 1:]
    c1 = (sl - m[:, 1:-1]) / hi - (m[:, 1:-1] + m[:, 2:] - 2 * sl) / hi
    shape = (g, n - 2, *x.shape[2:])
    return m[:, 1:-1].reshape(shape), (2 * c1).reshape(shape)
