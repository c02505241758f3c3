"""The batched replica-exchange move: neighbour pairs found, accepted, swapped.

Replicas of one group (same ``rex_group``) hold the rungs ``0 .. n-1`` of a temperature
ladder (``rex_rung``; ``rex_temperature`` the rung's temperature).  An attempt pairs
rungs ``(k, k+1)`` with ``k`` of the attempt's parity (even, odd, even ... : every pair
is tried every other attempt, and a replica takes part in at most one pair), accepts
with Metropolis' rule for the exchange of two temperatures (Sugita & Okamoto, Chem.
Phys. Lett. 314, 141 (1999))::

    P = min(1, exp[(1/kT_k - 1/kT_k+1) (E_k - E_k+1)])

and, when accepted, swaps the *temperatures* (not the coordinates: nothing per atom
moves between rows) and rescales the velocities by ``sqrt(T_new / T_old)``, so each
replica's kinetic energy is in equilibrium at its new temperature at once.  The
uniform of pair ``k`` is keyed by ``(seed, rex_group, total_steps, k)``
(:func:`~alchemi_lit.core.random.keyed_uniforms`): a group's exchanges do not depend on
which other groups share its batch.  Everything is tensor work on the device; partners
are found by sorting the keys ``group * n + rung``, not by a host-side table.
"""

from __future__ import annotations

import torch

from ..core import random as rng
from ..core.state import Batch
from ..core.tensor_ops import may_be_set
from ..core.units import kB

#: the field of a replica's group (kept with the results, not stage-private)
GROUP = "rex_group"
#: the field of a replica's rung on the ladder (0: the lowest temperature)
RUNG = "rex_rung"
#: the field of a replica's temperature (K), which its stage reads (:class:`~.params.Rows`)
TEMPERATURE = "rex_temperature"
#: the field of a replica's round trips (lowest -> highest -> lowest rung)
TRIPS = "rex_round_trips"
#: the field of the last end of the ladder a replica visited (0 lowest, 1 highest, -1 none)
END = "rex_end"
#: the field of attempts per neighbour pair ``k`` (columns), on the lower replica
ATTEMPTS = "rex_attempts"
#: the field of accepted exchanges per neighbour pair ``k``, on the lower replica
ACCEPTS = "rex_accepts"


def declare(batch: Batch, n: int) -> None:
    """The replica fields of a ladder of ``n`` rungs (kept with the results)."""
    for name in (GROUP, RUNG, END):
        batch.ensure_field(name, "system", (), torch.int64, -1)
    batch.ensure_field(TRIPS, "system", (), torch.int64, 0)
    batch.ensure_field(TEMPERATURE, "system", (), None, float("nan"))
    for name in (ATTEMPTS, ACCEPTS):
        if batch.has_field(name) and getattr(batch, name).shape[1:] != (n - 1,):
            batch.drop_field(name)  # (another ladder's)
        batch.ensure_field(name, "system", (n - 1,), torch.int64, 0)


def enter(batch: Batch, mask: torch.Tensor, ladder: torch.Tensor) -> None:
    """Replicas of ``mask`` entering: their rung's temperature, counts at zero."""
    rung = getattr(batch, RUNG)
    t = ladder.index_select(0, rung.clamp(0, ladder.shape[0] - 1))
    setattr(batch, TEMPERATURE, torch.where(mask, t, getattr(batch, TEMPERATURE)))
    setattr(batch, END, torch.where(mask, torch.where(rung == 0, 0, -1), getattr(batch, END)))
    setattr(batch, TRIPS, getattr(batch, TRIPS).masked_fill(mask, 0))
    for name in (ATTEMPTS, ACCEPTS):
        setattr(batch, name, getattr(batch, name).masked_fill(mask.unsqueeze(-1), 0))


def acceptance(t_low: torch.Tensor, t_high: torch.Tensor, e_low: torch.Tensor,
               e_high: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """Metropolis probability of exchanging temperatures ``t_low`` < ``t_high`` (K)
    between replicas with potential energies ``e_low``, ``e_high`` (eV)."""
    delta = (1.0 / (kB * t_low) - 1.0 / (kB * t_high)) * (e_low - e_high)
    return torch.exp(delta.clamp(max=0.0))


def partners(batch: Batch, member: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For every row, the row of the same group one rung up (``[B]``, meaningful where
    the second tensor is True: that replica is a ``member`` too)."""
    b = batch.num_systems
    rows = torch.arange(b, device=batch.device)
    group, rung = getattr(batch, GROUP), getattr(batch, RUNG)
    key = torch.where(member, group * n + rung, -1 - rows)  # non-members never match
    order = torch.argsort(key)
    ordered = key.index_select(0, order)
    want = group * n + rung + 1
    pos = torch.searchsorted(ordered, want).clamp(max=b - 1)
    return order.index_select(0, pos), member & (ordered.index_select(0, pos) == want)


def attempt(batch: Batch, mask: torch.Tensor, ladder: torch.Tensor, every: int,
            seed: int) -> None:  # fmt: skip
    """Try the exchanges of this step for ``mask``'s replicas whose stage step just
    completed a multiple of ``every`` (see the module docstring); updates temperatures,
    rungs, velocities, the pair counts and the round trips in place of the fields."""
    n = ladder.shape[0]
    done = batch.step + 1  # (the counters move after post_update)
    group, rung = getattr(batch, GROUP), getattr(batch, RUNG)
    due = mask & (group >= 0) & (done % every == 0)
    if not may_be_set(due):  # (CPU: no attempt this step, the fields stay the same tensors,
        return  # so the kernels' kept constants hold; an accelerator always runs it)
    partner, found = partners(batch, due, n)
    parity = (done // every) % 2
    same_step = (batch.step.index_select(0, partner) == batch.step) & (
        batch.total_steps.index_select(0, partner) == batch.total_steps)  # (a pipeline's too)
    pair = found & same_step & (rung % 2 == parity) & (rung < n - 1)
    temperature = getattr(batch, TEMPERATURE)
    p = acceptance(temperature, temperature.index_select(0, partner), batch.energy,
                   batch.energy.index_select(0, partner))  # fmt: skip
    u = rng.keyed_uniforms(seed, group.clamp(min=0), batch.total_steps, rung.clamp(min=0),
                           rng.PURPOSE_EXCHANGE)  # fmt: skip
    swap = pair & (u < p.to(torch.float64))
    rows = torch.arange(batch.num_systems, device=batch.device)
    none = torch.full_like(rows, -1)
    lower_of = none.scatter_reduce(0, partner, torch.where(swap, rows, none), "amax")
    source = torch.where(swap, partner, torch.where(lower_of >= 0, lower_of, rows))
    t_new, rung_new = temperature.index_select(0, source), rung.index_select(0, source)
    moved = source != rows
    ratio = torch.where(moved, t_new / torch.where(moved, temperature, 1.0), 1.0)
    (scale,) = batch.segments.to_xyz(torch.sqrt(ratio))
    batch.velocities = batch.velocities * scale
    setattr(batch, TEMPERATURE, t_new)
    setattr(batch, RUNG, rung_new)
    pairs = torch.arange(n - 1, device=batch.device)  # (not one_hot: it reads its maximum)
    column = (rung.clamp(0, n - 2).unsqueeze(-1) == pairs).to(torch.int64)
    setattr(batch, ATTEMPTS, getattr(batch, ATTEMPTS) + column * pair.unsqueeze(-1))
    setattr(batch, ACCEPTS, getattr(batch, ACCEPTS) + column * swap.unsqueeze(-1))
    count_round_trips(batch, due, rung_new, n)


def count_round_trips(batch: Batch, rows: torch.Tensor, rung: torch.Tensor, n: int) -> None:
    """A round trip is counted when a replica that went from the lowest rung to the
    highest comes back to the lowest (``rex_end``: the last end visited, -1 none yet)."""
    end, trips = getattr(batch, END), getattr(batch, TRIPS)
    bottom, top = rows & (rung == 0), rows & (rung == n - 1)
    setattr(batch, TRIPS, trips + (bottom & (end == 1)).to(trips.dtype))
    end = torch.where(bottom, torch.zeros_like(end), end)
    setattr(batch, END, torch.where(top & (end == 0), torch.ones_like(end), end))


__all__ = [
    "ACCEPTS", "ATTEMPTS", "END", "GROUP", "RUNG", "TEMPERATURE", "TRIPS", "acceptance",
    "attempt", "count_round_trips", "declare", "enter", "partners",
]  # fmt: skip
