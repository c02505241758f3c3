"""Several proposals per chain per forward: the generalized Metropolis-Hastings step that
``SwapMC(..., proposals=k)`` and ``SemiGrandMC(..., proposals=k)`` share.

A chain is a group of ``k`` identical rows (copies made before the run,
:mod:`.proposal_copies`), and a step is the generalized Metropolis-Hastings move of
Tjelmeland (2004) and Calderhead (PNAS 111, 17408 (2014)), which needs the proposals'
energies only -- one forward a step: from the chain's state ``x`` an auxiliary move
``z = K(x)``, the same on every row (keyed by the chain), never evaluated; on copy ``j``
its own move ``y_j = K(z)``; the forward gives every ``E(y_j)`` (``E(x)`` is saved); the
next state is one of ``{x, y_1 .. y_k}`` with probability ``∝ π``, and every row of the
chain takes it (a gather).  Exact for any symmetric kernel ``K`` (a swap, a semi-grand
change: design record 57): the set's probability ``K(x, z) Π K(z, y_j) = Π_s K(z, s)``
is the same whichever member started, so the joint law of (start, chosen) is symmetric
under ``π`` and the chosen state has law ``π``.  What is move-specific (making ``z`` and
``y_j``, undoing them, ``π``'s chemical-potential term, the statistics) stays with the
move: :mod:`.swap_proposals`, :mod:`.sgc_moves`.
"""

from __future__ import annotations

from typing import Any

import torch

from ..core import random as rng
from ..core.state import Batch
from ..core.units import kB
from . import mc_ops as mc
from . import ops

#: the chain (group) of a row, kept with the results (-1: not a chain's copy)
CHAIN = "mc_chain"
#: the copy index of a row within its chain (0: the primary row, reported)
COPY = "mc_copy"
#: what a row's proposal carries, taken by every row of a chain that chooses it
PROPOSED = ("atomic_numbers", "masses", "energy", "forces", "stress")


def uniforms(seed: int, batch: Batch, index: torch.Tensor) -> torch.Tensor:
    """``[B]`` uniforms keyed by ``(seed, chain, total_steps, index)``: a chain's draws do
    not depend on the batch or its rows' system ids (index 0, 1: the auxiliary move; 2:
    the choice; ``3 + 2 j``, ``4 + 2 j``: copy ``j``'s move)."""
    chain = getattr(batch, CHAIN).clamp(min=0)
    return rng.keyed_uniforms(seed, chain, batch.total_steps, index, rng.PURPOSE_MC)


def aux_draws(seed: int, batch: Batch) -> torch.Tensor:
    """``[B, 2]``: the auxiliary move's two uniforms, the same on every row of a chain."""
    zero = torch.zeros_like(batch.total_steps)
    return torch.stack([uniforms(seed, batch, zero), uniforms(seed, batch, zero + 1)], -1)


def copy_draws(seed: int, batch: Batch) -> torch.Tensor:
    """``[B, 2]``: the two uniforms of each copy's own move of ``z``."""
    index = 3 + 2 * getattr(batch, COPY).clamp(min=0)
    return torch.stack([uniforms(seed, batch, index), uniforms(seed, batch, index + 1)], -1)


def members(batch: Batch, mask: torch.Tensor, k: int) -> torch.Tensor:
    """``[B, k]``: the row of copy ``j`` of each row's chain (sort + searchsorted on the
    keys ``chain * k + copy``; a row whose copy is missing gets itself)."""
    b = batch.num_systems
    rows = torch.arange(b, device=batch.device)
    chain, copy = getattr(batch, CHAIN), getattr(batch, COPY)
    key = torch.where(mask & (chain >= 0), chain * k + copy, -1 - rows)
    order = torch.argsort(key)
    ordered = key.index_select(0, order)
    want = (chain * k).unsqueeze(-1) + torch.arange(k, device=batch.device)
    pos = torch.searchsorted(ordered, want.contiguous()).clamp(max=b - 1)
    found = ordered.index_select(0, pos.flatten()).view(b, k) == want
    return torch.where(found, order.index_select(0, pos.flatten()).view(b, k), rows.unsqueeze(-1))


def choose(mask: torch.Tensor, e_x: torch.Tensor, e_y: torch.Tensor, rows: torch.Tensor,
           temperature: torch.Tensor | float, u: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """The chosen member ``[B]`` (0: ``x``, ``j + 1``: copy ``j``'s proposal), with
    probability ``∝ exp(-e / kT)`` (``e_x`` ``[B]``: each row's ``x``; ``e_y`` ``[B]``:
    each row's proposal, gathered by ``rows``); a NaN energy has weight 0.  Every row of a
    group computes the same numbers in the same order, so the same choice."""
    e = torch.cat([e_x.unsqueeze(-1), e_y.index_select(0, rows.flatten()).view(rows.shape)],
                  dim=-1).to(torch.float64)  # fmt: skip
    kt = kB * temperature  # (a number, or [B]: no tensor from Python values in a capture)
    logw = -e / (kt.to(torch.float64).unsqueeze(-1) if isinstance(kt, torch.Tensor) else kt)
    logw = torch.where(torch.isnan(logw), -torch.inf, logw)
    p = torch.softmax(logw, dim=-1)
    cdf = torch.cumsum(p, dim=-1)
    chosen = (cdf < u.unsqueeze(-1)).sum(-1).clamp(max=rows.shape[1])
    return torch.where(mask, chosen, 0)


def take(batch: Batch, source: torch.Tensor, moved: torch.Tensor, fields: dict) -> None:
    """Rows ``moved`` take species, masses, energy, forces and stress of row
    ``source`` (``fields``: those values of the proposals, before they were undone)."""
    starts = batch.ptr[:-1]
    local = torch.arange(batch.num_atoms, device=batch.device) - starts.index_select(
        0, batch.system_idx
    )
    src_atom = local + starts.index_select(0, source).index_select(0, batch.system_idx)
    atoms = batch.atom_mask(moved)
    for name in ("atomic_numbers", "masses"):
        mine = getattr(batch, name)
        setattr(batch, name, torch.where(atoms, fields[name].index_select(0, src_atom), mine))
    f = fields["forces"].index_select(0, src_atom)
    batch.forces = torch.where(atoms.unsqueeze(-1), f, batch.forces)
    batch.energy = torch.where(moved, fields["energy"].index_select(0, source), batch.energy)
    s = fields["stress"].index_select(0, source)
    batch.stress = torch.where(moved.view(-1, 1, 1), s, batch.stress)


def conclude(stage: Any, batch: Batch, mask: torch.Tensor, proposed: dict, e_x: torch.Tensor,
             e_y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The step's end, the batch back at ``x`` (the move undone; ``proposed``: the
    :data:`PROPOSED` values before): choose among ``{x, y_1 .. y_k}`` (``e_x``, ``e_y``:
    ``-kT ln π`` up to a constant), every row of a chain takes the chosen state, changed
    atoms keep their kinetic energy; returns each row's source row and whether it moved."""
    rows = members(batch, mask, stage.proposals)
    temperature = ops.per_system(batch, stage.temperature)
    u = uniforms(stage.seed, batch, torch.full_like(batch.ptr[:-1], 2))
    chosen = choose(mask, e_x, e_y, rows, temperature, u)
    x_masses = batch.masses
    mc.restore(batch, mask)
    source = rows.gather(1, (chosen - 1).clamp(min=0).unsqueeze(-1)).squeeze(-1)
    moved = mask & (chosen > 0)
    take(batch, source, moved, proposed)
    mc.keep_kinetic_energy(batch, torch.where(batch.atom_mask(moved), x_masses, batch.masses))
    return source, moved


__all__ = ["CHAIN", "COPY", "PROPOSED", "aux_draws", "choose", "conclude", "copy_draws",
           "members", "take", "uniforms"]  # fmt: skip
