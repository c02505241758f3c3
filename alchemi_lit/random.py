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

import torch

_MASK32 = 0xFFFFFFFF
_M0, _M1 = 0xD2511F53, 0xCD9E8D57
_W0, _W1 = 0x9E3779B9, 0xBB67AE85

#: Purposes keep independent streams apart (salt of the counter).
PURPOSE_NOISE = 1
PURPOSE_VELOCITY_INIT = 2
PURPOSE_THERMOSTAT = 3


def _mulhilo(a: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32 bits of ``a * m`` for ``a, m < 2**32``.

    The product is below ``2**64``; int64 multiplication wraps modulo ``2**64`` on
    every torch backend, so its bit pattern *is* the unsigned product, and an
    arithmetic shift plus a mask recovers the high word.  (Checked against the
    Random123 known-answer vectors in ``tests/test_random.py``.)
    """
    p = a * m
    return (p >> 32) & _MASK32, p & _MASK32


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

    ``k0``/``k1`` may also be ``[..., rounds]`` key schedules (see :func:`key_schedule`),
    which saves the per-round key bumps when many counters share a key.
    """
    if k0.dim() == c0.dim() + 1:
        ks0, ks1 = k0, k1
    else:
        ks0, ks1 = key_schedule(k0, k1, rounds)
    for r in range(rounds):
        hi0, lo0 = _mulhilo(c0, _M0)
        hi1, lo1 = _mulhilo(c2, _M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ ks0[..., r], lo1, hi0 ^ c3 ^ ks1[..., r], lo0
    return c0, c1, c2, c3


def key_schedule(
    k0: torch.Tensor, k1: torch.Tensor, rounds: int = 10
) -> tuple[torch.Tensor, torch.Tensor]:
    """The round keys ``[..., rounds]`` of Philox (Weyl sequence of the key)."""
    r = torch.arange(rounds, dtype=torch.int64, device=k0.device)
    return (k0.unsqueeze(-1) + r * _W0) & _MASK32, (k1.unsqueeze(-1) + r * _W1) & _MASK32


def _uniform(x: torch.Tensor) -> torch.Tensor:
    """uint32 -> float64 in the open interval (0, 1)."""
    return (x.to(torch.float64) + 0.5) * (1.0 / 4294967296.0)


def atom_normals(
    seed: int,
    system_id: torch.Tensor,
    step: torch.Tensor,
    system_idx: torch.Tensor,
    local_index: torch.Tensor,
    purpose: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Standard normal ``[N, 3]``: one independent triple per atom.

    ``system_id``/``step`` are per system ``[B]``; ``system_idx``/``local_index`` per
    atom (index of the atom inside its own system).
    """
    # keys and their round schedule per system, then one gather per atom
    k0 = (system_id ^ (seed & _MASK32)) & _MASK32
    k1 = ((system_id >> 32) ^ ((seed >> 32) & _MASK32) ^ 0x5BD1E995) & _MASK32
    ks0, ks1 = key_schedule(k0, k1)
    st = step.index_select(0, system_idx)  # index_select: 2-3x faster than step[idx] on CPU
    c0 = local_index & _MASK32
    c1 = st & _MASK32
    c2 = (st >> 32) & _MASK32
    c3 = torch.full_like(c0, purpose & _MASK32)
    ks0, ks1 = ks0.index_select(0, system_idx), ks1.index_select(0, system_idx)
    x0, x1, x2, x3 = philox4x32(c0, c1, c2, c3, ks0, ks1)
    u0, u1, u2, u3 = _uniform(x0), _uniform(x1), _uniform(x2), _uniform(x3)
    r0 = torch.sqrt(-2.0 * torch.log(u0))
    r1 = torch.sqrt(-2.0 * torch.log(u2))
    z = torch.stack(
        [
            r0 * torch.cos(2 * math.pi * u1),
            r0 * torch.sin(2 * math.pi * u1),
            r1 * torch.cos(2 * math.pi * u3),
        ],
        dim=-1,
    )
    return z.to(dtype)


def local_atom_index(system_idx: torch.Tensor, ptr: torch.Tensor) -> torch.Tensor:
    """Index of each atom inside its own system (0..n_atoms-1)."""
    return torch.arange(system_idx.shape[0], device=system_idx.device) - ptr.index_select(
        0, system_idx
    )
