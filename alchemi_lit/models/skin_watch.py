"""When the accelerator path rebuilds its neighbour list: the skin check, read one call late.

Why: deciding on the host whether any atom moved ``skin / 2`` means reading a device
value at every model call, a blocking sync that stalls the launch queue (the main one
left in a GPU step, REFERENCE.md section 7).  Here each call measures on the device how
close the list is to its limit -- ``worst``, the largest ``max|u| - limit`` over systems
(``u``: the atoms' moves beyond the cell's affine deformation since the build, ``limit``:
``skin / 2`` in an unchanged cell, see :mod:`.neighbors`) --, how fast that can grow per
call -- ``rate``, the largest move of an atom in one call plus the largest drop of a
limit -- and whether a system must be rebuilt anyway (it turned non-finite or finite
again), and copies the three to the host without waiting.  The next call reads that
copy (its event is a call old: complete, or nearly) and keeps the list while

    worst + safety * rate <= 0,

i.e. unless the list could run out within one more call moving up to ``safety`` (3)
times as far as the last; otherwise it rebuilds (a rebuild reads sizes on the host
anyway).  So the list stays exact as long as no call moves an atom more than three
times as far as the call before, which dynamics and relaxations never do (a FIRE
restart ramps its steps up by 2.2 times at most).  Every call checks its own list on
the device too, and a late read that finds it was inexact counts a violation, warns,
and doubles ``safety``.
Where the history is unknown (a new layout) the next call reads the exact check at once.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

from ..core.tensor_ops import kept, row_dot, rows_times, small_matmul

log = logging.getLogger(__name__)

#: how much farther than in the last call an atom may move in the next one (a FIRE
#: restart ramps its steps up by 2.2 times a step at most; MD by a few per cent)
SAFETY = 3.0


class SkinWatch:
    """One-call-late rebuild decisions for a :class:`~.neighbors.NeighborList`."""

    def __init__(self, cutoff: float, skin: float) -> None:
        self.cutoff, self.skin = cutoff, skin
        self.safety = SAFETY
        self.violations = 0  # late reads that found an inexact list (never, in tests)
        self.exact_reads = 0  # calls that had to read the exact check at once
        self._known = False  # whether the previous call's u and limits are known
        self._prev_u: torch.Tensor | None = None  # None: all zero (just rebuilt)
        self._prev_limit: torch.Tensor | None = None  # None: skin / 2 (just rebuilt)
        self._staged: torch.Tensor | None = None  # (worst, rate, changed) of this call
        self._pending: tuple[torch.Tensor, torch.cuda.Event | None, bool] | None = None
        self._verdict: tuple[float, float, bool] | None = None  # a late read keeps() refused
        self._buffers: list[torch.Tensor] = []
        self._buffer_kind: tuple[torch.dtype, bool] | None = None
        self._rate: float | None = None  # the last rate read (host)
        self._inverse: tuple[torch.Tensor, int, Any] | None = None  # of the reference cells
        self._graph_staged: torch.Tensor | None = None  # a captured call's measure

    def strain(self, ref_cell: torch.Tensor, cell: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """:func:`strain_limits`, the reference cells' inverses kept while they are."""
        self._inverse = kept(self._inverse, ref_cell, reference_inverse)
        return strain_limits(ref_cell, cell, self.cutoff, self.skin, self._inverse[2])

    def forget_inverse(self) -> None:
        """Drop the kept reference-cell inverses (recomputed at the next use)."""
        self._inverse = None

    def forget(self, built: bool = False) -> None:
        """Drop the history: the next call reads the exact check at once.  ``built``: the
        whole list was just built (its moves count from zero, so the call after that
        has a rate again); else (a refill) the call after that reads it once more."""
        self._known = built
        self._prev_u = self._prev_limit = self._staged = self._pending = self._verdict = None

    def remap(
        self,
        atom_keep: torch.Tensor,
        new_index: torch.Tensor,
        num_atoms: int,
        old_rows: torch.Tensor,
        kept: torch.Tensor,
    ) -> None:
        """Carry the history over to a batch whose systems left or joined (see
        ``NeighborList.remap``): kept atoms keep their last moves, systems that joined
        start from zero (they are built at the next call).  The last call's copy still
        bounds the kept systems, so the next call needs no exact read."""
        if self._prev_u is not None:
            u = self._prev_u.new_zeros((num_atoms, 3))
            self._prev_u = u.index_copy_(0, new_index, self._prev_u.index_select(0, atom_keep))
        if self._prev_limit is not None:
            limit = self._prev_limit.new_full((len(kept),), 0.5 * self.skin)
            limit[kept] = self._prev_limit[old_rows[kept]]
            self._prev_limit = limit

    def must_rebuild(self, *where: Any) -> bool:
        """Whether to rebuild at this call; then :meth:`publish` must follow.  ``where``:
        positions, system index, number of systems, the build's positions, ``strain``
        (each system's deformation since the build and the limit ``[B]`` of its atoms'
        moves, :func:`strain_limits`, or None for an unchanged cell) and the systems
        built finite."""
        u, limit, worst, changed, self._staged = self._measure(*where)
        self._known = True
        self._prev_u, self._prev_limit = u, limit
        late, self._verdict = self._verdict or self._read(), None
        if late is None:
            self.exact_reads += 1
            return not bool((worst <= 0) & ~changed)  # (a blocking read, after a reset only)
        return not self._still_exact(*late)

    def prepare_graph(self, num_atoms: int, num_systems: int, like: torch.Tensor) -> bool:
        """Make the history static tensors a captured call updates in place (a CUDA
        graph replays the same addresses); False where the next call would read the
        exact check (no history yet), which a graph cannot.  ``like``: a tensor of the
        positions' dtype and device (the measure is made in it: an integer one, such as
        the edge indices, truncates it to zero and the list is never rebuilt)."""
        if not self._known:
            return False
        if self._prev_u is None:  # (just rebuilt: no moves, limits skin / 2)
            self._prev_u = like.new_zeros((num_atoms, 3))
        if self._prev_limit is None:
            self._prev_limit = like.new_full((num_systems,), 0.5 * self.skin)
        self._graph_staged = like.new_zeros(3)
        return True

    def measure_in_graph(self, *where: Any) -> None:
        """:meth:`must_rebuild`'s measure, written into the static tensors of
        :meth:`prepare_graph` (no decision, no read: the graph's replayer decides from
        the previous replay's copy, :meth:`keeps`, and sends this one with
        :meth:`publish_graph`)."""
        u, limit, _, _, staged = self._measure(*where)
        self._prev_u.copy_(u)
        self._prev_limit.copy_(limit)
        self._graph_staged.copy_(staged)

    def _measure(self, *where: Any) -> tuple[torch.Tensor, ...]:
        """This call's moves ``u``, limits, ``worst``, ``changed`` and the three numbers
        the host reads a call late (the rate NaN where there is no history)."""
        u, worst, changed, limit = _measure(*where, 0.5 * self.skin)
        if self._known:
            rate = _rate(u, self._prev_u, limit, self._prev_limit, 0.5 * self.skin)
        else:
            rate = u.new_full((), math.nan)
        return u, limit, worst, changed, torch.stack([worst, rate, changed.to(worst.dtype)])

    def publish_graph(self) -> None:
        """After a replay: its measure to the host without waiting (see :meth:`publish`)."""
        self._staged = self._graph_staged
        self.publish(False)

    def keeps(self) -> bool:
        """Whether the list may serve one more call, from the last call's copy (False
        where there is none: the next call must run eagerly and check at once).  A
        refusal is kept for that eager call, which rebuilds on it (its own late read
        would find nothing: an exact check without a margin, and the capture after it
        would run unchecked on a list at its limit)."""
        late = self._read()
        if late is None:
            return False
        if self._still_exact(*late):
            return True
        self._verdict = late  # (the eager call that follows rebuilds on it)
        return False

    def _still_exact(self, worst: float, rate: float, changed: bool) -> bool:
        """Whether a list ``worst`` from its limit, growing by ``rate`` a call, stays
        exact for one more call moving up to ``safety`` times as far."""
        return not changed and worst + self.safety * rate <= 0

    def publish(self, rebuilt: bool) -> None:
        """Send this call's measure to the host without waiting (read at the next call).
        After a rebuild the atoms' moves count from here, and the list is at its
        limit's farthest: ``worst = -skin / 2``, known on the host."""
        values, self._staged = self._staged, None
        if rebuilt:
            self._prev_u, self._prev_limit = None, None  # zero moves, limits skin / 2
        cuda = values.device.type == "cuda"
        if self._buffer_kind != (values.dtype, cuda):  # two, used in turn; pinned for CUDA
            self._buffer_kind = (values.dtype, cuda)
            self._buffers = [torch.empty(3, dtype=values.dtype, pin_memory=cuda) for _ in "ab"]
            for host in self._buffers:
                host.host_buffer = True  # (a host copy: reading it never waits on the device)
        host = self._buffers[0]
        self._buffers.reverse()
        host.copy_(values, non_blocking=cuda)
        event = torch.cuda.Event() if cuda else None
        if event is not None:
            event.record()
        self._pending = (host, event, rebuilt)

    def _read(self) -> tuple[float, float, bool] | None:
        """The previous call's (worst, rate, changed), or None where unknown."""
        if self._pending is None:
            return None
        host, event, rebuilt = self._pending
        self._pending = None
        if event is not None:
            event.synchronize()  # (recorded a call ago: complete, or nearly)
        worst, rate, changed = host.tolist()
        if rebuilt:
            worst, changed = -0.5 * self.skin, 0.0
        elif worst > 0:  # the list used then was not exact: a faster move than allowed for
            self.violations += 1
            self.safety *= 2.0
            log.warning(
                "neighbour list: an atom moved more than %.3g times as far as in the call "
                "before, past the skin; rebuilding earlier from now on",
                self.safety / 2,
            )
        if math.isnan(rate):
            if self._rate is None:
                return None
            rate = self._rate
        self._rate = rate
        return worst, rate, changed > 0


def _measure(
    positions: torch.Tensor,
    system: torch.Tensor,
    num_systems: int,
    ref_positions: torch.Tensor,
    strain: tuple[torch.Tensor, torch.Tensor] | None,
    built_ok: torch.Tensor,
    half_skin: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The atoms' moves ``u`` beyond the affine one; the largest ``max|u| - limit`` over
    the systems built and still finite (-inf if none); whether a system must be rebuilt
    whatever the moves (it turned non-finite, or finite again, since its build, or its
    cell was squeezed or sheared past what the skin allows: a NaN or negative limit);
    and the limits ``[B]``."""
    pos = positions.detach()
    if strain is None:
        u = pos - ref_positions
        limit = torch.full((num_systems,), half_skin, dtype=pos.dtype, device=pos.device)
    else:
        m, limit = strain
        affine = rows_times(ref_positions, m.index_select(0, system))
        u = pos - affine
    disp2 = row_dot(u)
    finite = torch.isfinite(pos).all(1)
    farthest = torch.zeros(num_systems, dtype=pos.dtype, device=pos.device)
    farthest = farthest.scatter_reduce(0, system, disp2, "amax", include_self=True)
    ok = torch.ones(num_systems, dtype=torch.int64, device=pos.device)
    ok = ok.scatter_reduce(0, system, finite.to(torch.int64), "amin", include_self=True).bool()
    both = ok & built_ok
    q = farthest.sqrt() - limit
    usable = both & ~torch.isnan(q)
    q = torch.where(usable, q, torch.full_like(q, -math.inf))
    worst = q.max() if num_systems else q.new_full((), -math.inf)
    changed = ((ok != built_ok) | (both & ~usable) | (both & (limit < 0))).any()
    return u, worst, changed, limit


def _rate(
    u: torch.Tensor,
    prev_u: torch.Tensor | None,
    limit: torch.Tensor,
    prev_limit: torch.Tensor | None,
    half_skin: float,
) -> torch.Tensor:
    """How much ``worst`` grew at most in this call: the largest move of an atom (finite
    ones) plus the largest drop of a limit (None: just rebuilt, u = 0, limits skin / 2)."""
    step2 = row_dot(u if prev_u is None else u - prev_u)
    step2 = torch.where(torch.isfinite(step2), step2, torch.zeros_like(step2))
    rate = step2.max().sqrt() if len(step2) else u.new_zeros(())
    if len(limit):
        drop = (half_skin - limit) if prev_limit is None else (prev_limit - limit)
        drop = torch.nan_to_num(drop, nan=0.0, posinf=0.0, neginf=0.0)
        rate = rate + drop.clamp_min(0).max()
    return rate


def reference_inverse(ref_cell: torch.Tensor) -> torch.Tensor:
    """Inverses ``[B, 3, 3]`` of the cells a list was built in (NaN where singular or
    non-finite), from the adjugate: elementwise, no sync.  Kept per build."""
    adj = _adjugate(ref_cell)
    det = (ref_cell[:, 0] * adj[:, :, 0]).sum(1)  # (row 0 times its cofactors)
    usable = (det.abs() > 1e-12) & torch.isfinite(det)
    safe = torch.where(usable, det, torch.full_like(det, math.nan))
    return adj / safe[:, None, None]


def strain_limits(
    ref_cell: torch.Tensor,
    cell: torch.Tensor,
    cutoff: float,
    skin: float,
    ref_inverse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each system's deformation ``M`` since the build (``h = h0 M``) and how far ``[B]``
    its atoms may move beyond it, without a host sync (the CPU path's version,
    ``NeighborList._strain``, calls LAPACK, which checks its errors on the host).

    ``0.5 ((cutoff + skin) s - cutoff)`` with ``s`` the smallest singular value of ``M``
    from the closed-form eigenvalues of ``M^T M``, less a relative 1e-8 for rounding (a
    bound from below: never later than the exact rule).  Where the cell is unchanged,
    ``M = I`` and ``skin / 2``; where a cell is singular or non-finite the limit is NaN
    or negative (the list is rebuilt).  ``ref_inverse``: :func:`reference_inverse` of
    ``ref_cell``, when the caller keeps it.
    """
    eye = torch.eye(3, dtype=cell.dtype, device=cell.device).expand_as(cell)
    cell = cell.detach()
    reshaped = (cell != ref_cell).flatten(1).any(1)
    inv = reference_inverse(ref_cell) if ref_inverse is None else ref_inverse
    m = torch.where(reshaped[:, None, None], small_matmul(inv, cell), eye)
    low = _smallest_eigenvalue(small_matmul(m.transpose(1, 2), m))
    s_low = (low - 1e-8 * low.abs()).clamp_min(0).sqrt()
    limit = 0.5 * ((cutoff + skin) * s_low - cutoff)
    return m, torch.where(reshaped, limit, torch.full_like(limit, 0.5 * skin))


def _smallest_eigenvalue(g: torch.Tensor) -> torch.Tensor:
    """Smallest eigenvalue of symmetric 3x3 matrices ``[B, 3, 3]`` in closed form (the
    trigonometric solution of the characteristic cubic; elementwise, so no sync)."""
    q = torch.diagonal(g, dim1=1, dim2=2).sum(1) / 3
    d = g - q[:, None, None] * torch.eye(3, dtype=g.dtype, device=g.device)
    p = ((d * d).sum((1, 2)) / 6).sqrt()
    b = d / torch.where(p > 0, p, torch.ones_like(p))[:, None, None]
    half_det = 0.5 * (b[:, 0] * _adjugate(b)[:, :, 0]).sum(1)
    phi = torch.acos(half_det.clamp(-1.0, 1.0)) / 3
    return torch.where(p > 0, q + 2 * p * torch.cos(phi + 2 * math.pi / 3), q)


def _adjugate(a: torch.Tensor) -> torch.Tensor:
    """Adjugate of 3x3 matrices ``[B, 3, 3]`` (``a @ adj(a) = det(a) I``), elementwise."""
    r0, r1, r2 = a[:, 0], a[:, 1], a[:, 2]
    return torch.stack(
        [torch.linalg.cross(r1, r2), torch.linalg.cross(r2, r0), torch.linalg.cross(r0, r1)], 2
    )
