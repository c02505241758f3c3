"""Counter-based random numbers keyed per system (Philox4x32-10 in plain torch ops).

A global random stream makes a system's noise depend on where it sits in the batch
and on which other systems are in flight.  Here every draw is a pure function of
``(seed, system_id, step, purpose, atom index within the system)``, so a system's
trajectory is the same alone, in any batch, on any rank, after a resume.

The key is the system's *total* step count, not its step within a stage: two MD
stages in a row (or a stage re-entered) never replay the same noise, and a run
split into consecutive ``Simulator.run`` calls (the batch carries ``total_steps``)
draws exactly what one fused run draws.

Philox is implemented with int64 tensor arithmetic (uint32 values, products taken
modulo 2**64), so it runs on any device and under torch.compile.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from .backends import primitive
from .tensor_ops import host_reads_free, identity_key, same_key

_MASK32 = 0xFFFFFFFF
_M0, _M1 = 0xD2511F53, 0xCD9E8D57
_W0, _W1 = 0x9E3779B9, 0xBB67AE85

#: Purposes keep independent streams apart (salt of the counter).
PURPOSE_NOISE = 1
PURPOSE_VELOCITY_INIT = 2
PURPOSE_THERMOSTAT = 3
#: a barostat's per-system noise (the cell's, not the atoms')
PURPOSE_BAROSTAT = 4
#: a Monte Carlo move's per-system draws (which atoms, which species, accept or not)
PURPOSE_MC = 5
#: a replica exchange's acceptance draws (one per neighbour pair of a replica group)
PURPOSE_EXCHANGE = 6


def philox4x32(
    c0: torch.Tensor,
    c1: torch.Tensor,
    c2: torch.Tensor,
    c3: torch.Tensor,
    k0: torch.Tensor,
    k1: torch.Tensor,
    rounds: int = 10,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Philox4x32 bijection of (counter, key); all inputs int64 holding uint32 values.

    Each round multiplies two words by 32-bit constants.  The products are below
    ``2**64``; int64 multiplication wraps modulo ``2**64`` on every torch backend, so
    a product's bit pattern *is* the unsigned product: its low word is the product
    itself with the high bits masked off, its high word an arithmetic shift by 32
    (with the sign bits masked off).  Masks are applied only where a word is next
    multiplied, i.e. after the xors, which leave the low 32 bits alone -- 10 tensor
    operations a round.  (Checked against the Random123 known-answer vectors in
    ``tests/test_random.py``.)
    """
    for r in range(rounds):
        p0, p2 = c0 * _M0, c2 * _M1
        # round keys: the Weyl sequence k + r W, its carries out of bit 31 masked below
        c0 = (p2 >> 32).bitwise_xor_(c1).bitwise_xor_(k0 + r * _W0).bitwise_and_(_MASK32)
        c2 = (p0 >> 32).bitwise_xor_(c3).bitwise_xor_(k1 + r * _W1).bitwise_and_(_MASK32)
        c1, c3 = p2, p0
    return c0, c1 & _MASK32, c2, c3 & _MASK32


def _uniform(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """uint32 -> float64 in the open interval (0, scale)."""
    return (x.to(torch.float64) + 0.5).mul_(scale / 4294967296.0)


@primitive
def atom_normals(
    seed: int,
    system_id: torch.Tensor,
    step: torch.Tensor,
    system_idx: torch.Tensor,
    local_index: torch.Tensor,
    purpose: int,
    dtype: torch.dtype,
    ahead: int = 1,
) -> torch.Tensor:
    """Standard normal ``[N, 3]``: one independent triple per atom.

    ``system_id``/``step`` are per system ``[B]``; ``system_idx``/``local_index`` per
    atom (index of the atom inside its own system).  With ``ahead = K`` the draws of
    steps ``step .. step + K - 1`` too, as ``[K N, 3]``: block ``k`` holds ``step + k``.
    (A primitive: on CPU Philox and the uniforms run as one compiled loop,
    :mod:`alchemi_lit.kernels.philox`, and Box-Muller as :func:`box_muller_block`.)
    """
    if ahead > 1:  # the same draw for K copies of the batch, copy k at step + k
        b, ks = int(system_id.shape[0]), torch.arange(ahead, device=step.device)
        system_id = system_id.repeat(ahead)
        step = (step.unsqueeze(0) + ks.unsqueeze(1)).reshape(-1)
        system_idx = (system_idx.unsqueeze(0) + b * ks.unsqueeze(1)).reshape(-1)
        local_index = local_index.repeat(ahead)
    # keys per system, then one gather per atom
    k0 = (system_id ^ (seed & _MASK32)) & _MASK32
    k1 = ((system_id >> 32) ^ ((seed >> 32) & _MASK32) ^ 0x5BD1E995) & _MASK32
    st = step.index_select(0, system_idx)  # index_select: step[idx] is slower on CPU
    c0 = local_index & _MASK32
    c1 = st & _MASK32
    c2 = (st >> 32) & _MASK32
    c3 = torch.full_like(c0, purpose & _MASK32)
    k0, k1 = k0.index_select(0, system_idx), k1.index_select(0, system_idx)
    return box_muller(*philox4x32(c0, c1, c2, c3, k0, k1), dtype)


def keyed_uniforms(
    seed: int, key: torch.Tensor, step: torch.Tensor, index: torch.Tensor, purpose: int
) -> torch.Tensor:
    """Uniforms on (0, 1), float64, one per element of ``key``/``step``/``index`` (int64,
    same shape): each a function of ``(seed, key, step, index, purpose)`` alone -- the
    counter layout of :func:`atom_normals` with ``key`` in place of the ``system_id``
    (a replica group's id: its exchanges do not depend on the batch it runs in)."""
    k0 = (key ^ (seed & _MASK32)) & _MASK32
    k1 = ((key >> 32) ^ ((seed >> 32) & _MASK32) ^ 0x5BD1E995) & _MASK32
    c3 = torch.full_like(index, purpose & _MASK32)
    words = philox4x32(index & _MASK32, step & _MASK32, (step >> 32) & _MASK32, c3, k0, k1)
    return _uniform(words[0])


def system_uniforms(
    seed: int, system_id: torch.Tensor, step: torch.Tensor, purpose: int
) -> torch.Tensor:
    """Four uniforms on (0, 1) per system ``[B, 4]`` (float64), keyed by ``(seed,
    system_id, step, purpose)`` like :func:`atom_normals`: a Monte Carlo move's choices
    are the same for a system alone, in any batch, after a resume.  The counter's first
    word is ``2**32 - 1``, an atom index no system reaches, so these never coincide with
    an atom's draws of the same key."""
    k0 = (system_id ^ (seed & _MASK32)) & _MASK32
    k1 = ((system_id >> 32) ^ ((seed >> 32) & _MASK32) ^ 0x5BD1E995) & _MASK32
    c0 = torch.full_like(step, _MASK32)
    c3 = torch.full_like(step, purpose & _MASK32)
    words = philox4x32(c0, step & _MASK32, (step >> 32) & _MASK32, c3, k0, k1)
    return torch.stack([_uniform(w) for w in words], dim=-1)


def box_muller(
    x0: torch.Tensor, x1: torch.Tensor, x2: torch.Tensor, x3: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """Three standard normals ``[N, 3]`` per atom from its four Philox words ``[N]``:
    ``r0 cos phi0``, ``r0 sin phi0``, ``r1 cos phi1`` with ``r = sqrt(-2 ln u)``, ``u0``
    and ``u2`` from words 0 and 2, the angles from words 1 and 3.  (Written as separate
    passes and one stack, which ``torch.compile`` fuses into one loop.)"""
    two_pi = 2 * math.pi
    u0, phi0, u2, phi1 = _uniform(x0), _uniform(x1, two_pi), _uniform(x2), _uniform(x3, two_pi)
    r0 = u0.log_().mul_(-2.0).sqrt_()
    r1 = u2.log_().mul_(-2.0).sqrt_()
    # the list is built left to right, so r0 is read before the second entry scales it
    z = torch.stack([r0 * phi0.cos(), r0.mul_(phi0.sin_()), r1.mul_(phi1.cos_())], dim=-1)
    return z.to(dtype)


def box_muller_block(uniforms: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """:func:`box_muller` from the words' uniforms, float64 ``[4, N]`` (overwritten):
    rows ``u0``, ``u2`` on (0, 1) and angles ``phi0``, ``phi1`` on (0, 2 pi), as the CPU
    kernel makes them.  The same operations on each number, so the same normals to the
    bit, but both radii and both cosines in one pass each, written straight into the
    result's columns, with no stacking copy (under ``torch.compile`` the writes into
    views would split the fused loop)."""
    radii = uniforms[:2].log_().mul_(-2.0).sqrt_()
    z = torch.empty((uniforms.shape[1], 3), dtype=uniforms.dtype, device=uniforms.device)
    columns = z.T
    torch.mul(radii, uniforms[2:].cos(), out=columns[0::2])
    torch.mul(radii[0], uniforms[2].sin_(), out=columns[1])
    return z.to(dtype)


class NormalsWindow(NamedTuple):
    """Keyed normals of every atom for the steps ``base .. base + steps - 1`` of each
    system: atom ``i``'s draw at step ``s`` of its system ``b`` is row
    ``(s - base[b]) * N + i`` of ``values`` ``[steps N, 3]``."""

    values: torch.Tensor
    base: np.ndarray  # [B] int64, each system's step in the first block
    steps: int


class NormalsAhead:
    """:func:`atom_normals` for several coming steps in one draw, on CPU.

    Why: for a few thousand atoms each of Philox's and Box-Muller's ~120 elementwise
    passes costs more in fixed overhead than in arithmetic, so one draw covering the
    next ``K`` steps costs far less than ``K`` draws of one step (figures in
    docs/design/11-keyed-noise-drawn-several-steps-ahead-on.md).  Every value is a
    function of its key alone, so the numbers are exactly :func:`atom_normals`'s and
    nothing about reproducibility changes.  A draw is reused while the batch keeps its
    layout (the same ``system_id``, ``system_idx`` and ``local_index`` tensors) and
    every system's step lies within the steps drawn; anything else -- a refill, a system
    that skipped ahead -- draws afresh.  How far ahead adapts: a draw dropped after
    serving ``s`` of its steps makes the next one cover ``s`` (a batch refilled every
    step draws one step at a time, not eight), a draw used up doubles it again, up to
    ``MAX_AHEAD``.  Checking reads tensor values, free on CPU only: on an accelerator
    every call draws (compile the kernel there: ``Simulator(compile=True)``).  One entry
    per purpose.
    """

    #: values drawn at once at most (steps ahead x atoms): K = 8 up to 32 768 atoms
    MAX_VALUES = 2**18
    MAX_AHEAD = 8

    def __init__(self) -> None:
        self._drawn: dict[int, tuple[list, NormalsWindow]] = {}
        self._served: dict[int, int] = {}  # steps the current draw has served, per purpose
        self._ahead: dict[int, int] = {}  # how far the next draw reaches, per purpose

    def __call__(
        self,
        seed: int,
        system_id: torch.Tensor,
        step: torch.Tensor,
        system_idx: torch.Tensor,
        local_index: torch.Tensor,
        purpose: int,
        dtype: torch.dtype,
    ) -> torch.Tensor:
        n = int(system_idx.shape[0])
        if not host_reads_free(system_idx) or n == 0 or self._limit(n) < 2:
            return atom_normals(seed, system_id, step, system_idx, local_index, purpose, dtype)
        keys = (seed, system_id, step, system_idx, local_index, purpose, dtype)
        window = self.window(*keys)
        offset = step.numpy() - window.base  # (CPU only: checked in NumPy, 3 small calls)
        first, last = int(offset.min()), int(offset.max())
        if first < 0 or last >= window.steps:
            window, first, last = self.window(*keys, fresh=True), 0, 0
        if first == last:  # every system at the same step: a view
            return window.values[first * n : (first + 1) * n]
        rows = torch.arange(n) + n * torch.from_numpy(offset).index_select(0, system_idx)
        return window.values.index_select(0, rows)

    def window(
        self,
        seed: int,
        system_id: torch.Tensor,
        step: torch.Tensor,
        system_idx: torch.Tensor,
        local_index: torch.Tensor,
        purpose: int,
        dtype: torch.dtype,
        fresh: bool = False,
    ) -> NormalsWindow:
        """The draw kept for this layout, *without* checking that every system's step
        lies in it; with ``fresh`` (or a new layout) a new draw from the current steps.

        For a compiled CPU consumer that picks each system's rows itself and checks
        the range on the way (Langevin's half step): the checks and the slicing of
        :meth:`__call__` are several NumPy/torch calls a step, nothing there.  A
        consumer that finds a step outside the window asks again with ``fresh=True``.
        """
        layout = identity_key((seed, dtype, system_id, system_idx, local_index))
        entry = self._drawn.get(purpose)
        if entry is not None and same_key(entry[0], layout):
            if not fresh:
                self._served[purpose] += 1
                return entry[1]
            self._served[purpose] -= 1  # the window handed out last did not serve
        n = int(system_idx.shape[0])
        ahead = min(self._limit(n), self._next_ahead(purpose))
        self._served[purpose] = 1
        base = step.numpy().copy()
        if ahead < 2:  # nothing to keep: the layout changes about every step
            self._drawn.pop(purpose, None)
            values = atom_normals(seed, system_id, step, system_idx, local_index, purpose, dtype)
            return NormalsWindow(values, base, 1)
        # draw the next `ahead` steps of every system: block k holds step + k
        values = atom_normals(
            seed, system_id, step, system_idx, local_index, purpose, dtype, ahead=ahead
        )
        window = NormalsWindow(values, base, ahead)
        self._drawn[purpose] = (layout, window)
        return window

    def _limit(self, n_atoms: int) -> int:
        """Steps one draw may cover for ``n_atoms`` atoms (:data:`MAX_VALUES`)."""
        return min(self.MAX_AHEAD, self.MAX_VALUES // max(n_atoms, 1))

    def _next_ahead(self, purpose: int) -> int:
        """Steps the next draw covers: what the last one served when it was dropped
        early, twice as many when it was used up (``MAX_AHEAD`` at first)."""
        last = self._ahead.get(purpose)
        if last is None:
            ahead = self.MAX_AHEAD
        else:
            served = self._served.get(purpose, 0)
            ahead = 2 * last if served >= last else max(1, served)
        self._ahead[purpose] = min(self.MAX_AHEAD, ahead)
        return self._ahead[purpose]


_compiled_atom_normals: Callable[..., torch.Tensor] | None = None


def compiled_atom_normals() -> Callable[..., torch.Tensor]:
    """:func:`atom_normals` compiled by ``torch.compile`` (one per process, shared by
    every integrator; eager again if the compiler fails).

    Why compile it: Philox's ten rounds and Box-Muller are ~120 elementwise passes over
    the atoms, each a separate kernel in eager mode -- on CPU more than any other part
    of a Langevin step; fused into one loop they read the atoms once (figures in
    docs/design/12-compile-true-compiles-the-noise-kernel-too.md).  The compiled kernel
    draws the same numbers to within an ulp or two of the eager one (the integer part is
    exact; vectorised log/cos round differently), and like it gives each atom the same
    numbers wherever it sits in the batch.
    """
    global _compiled_atom_normals
    if _compiled_atom_normals is None:
        from .compiling import compile_or_eager

        _compiled_atom_normals = compile_or_eager(atom_normals.reference, "the Philox noise kernel")
    return _compiled_atom_normals


def local_atom_index(system_idx: torch.Tensor, ptr: torch.Tensor) -> torch.Tensor:
    """Index of each atom inside its own system (0..n_atoms-1)."""
    return torch.arange(system_idx.shape[0], device=system_idx.device) - ptr.index_select(
        0, system_idx
    )
