"""The semi-grand change of :class:`~.sgc_mc.SemiGrandMC`: making one, undoing one, the
one-proposal Metropolis rule, and the change's part of ``proposals=k`` (the generalized
Metropolis-Hastings step is :mod:`.proposals`, with ``π ∝ exp(-(E - μ·N)/kT)``).

Why a change *redraws* the species among all ``m`` (its own included) when
``proposals > 1``: there ``x``, ``z = K(x)`` and ``y_j = K(z)`` are two changes apart,
and two changes each to *another* species keep the parity of a binary composition
(``N_Au`` moves by 0 or 2), so the chain would never leave the parity it started in.
The redraw kernel (a site uniform among the ``n`` changeable ones, a species uniform
among ``m``) is symmetric too -- the changeable atoms are the same in every state -- and
reaches any composition: ``y_j = z``, one change from ``x``, is among the proposals.
"""

from __future__ import annotations

from typing import Any

import torch

from ..core.state import Batch
from ..core.tensor_ops import on_device
from . import mc_ops as mc
from . import ops
from . import proposals as props
from .base import FieldSpec

#: the auxiliary change: its site (local atom index), ``x``'s species there (index among
#: the move's, -1: none changed) and mass (stage-private)
FIELDS: dict[str, FieldSpec] = {
    "mc_aux_a": FieldSpec("system", dtype="int64"),
    "mc_aux_old": FieldSpec("system", dtype="int64", fill=-1),
    "mc_aux_mass": FieldSpec("system"),
}


def change(stage: Any, batch: Batch, mask: torch.Tensor, eligible: torch.Tensor,
           u: torch.Tensor, redraw: bool = False) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """Atom ``a`` of each system of ``mask``, uniform among ``eligible`` (by ``u[:, 0]``),
    takes a species uniform among the other ``m - 1`` (``u[:, 1]``; ``redraw``: among all
    ``m``, its own included) and its standard mass; returns ``a`` ``[B]``, its old
    species index (-1: none changed) and old mass."""
    idx = mc.species_index(batch, stage._numbers)
    a, found = mc.pick(batch, eligible, u[:, 0])
    moved, m = mask & found, len(stage.species)
    old = idx.index_select(0, a)
    width = m if redraw else m - 1
    shift = int(not redraw) + (u[:, 1] * width).floor().to(torch.int64).clamp(max=width - 1)
    new = torch.where(moved, (old + shift) % m, old.clamp(min=0))
    here_z, here_m = batch.atomic_numbers.index_select(0, a), batch.masses.index_select(0, a)
    masses = on_device(stage._masses, batch.device, batch.dtype)
    z = torch.where(moved, mc.table(batch, stage._numbers)[new], here_z)
    mc.set_species(batch, a, z, torch.where(moved, masses[new], here_m))
    return a, torch.where(moved, old, -1), here_m


def undo(stage: Any, batch: Batch, mask: torch.Tensor, a: torch.Tensor, old: torch.Tensor,
         mass: torch.Tensor) -> None:  # fmt: skip
    """Atom ``a`` ``[B]`` of each system of ``mask`` back to species index ``old`` (-1: it
    did not change) and mass ``mass``."""
    back = mask & (old >= 0)
    here_z, here_m = batch.atomic_numbers.index_select(0, a), batch.masses.index_select(0, a)
    z = torch.where(back, mc.table(batch, stage._numbers)[old.clamp(min=0)], here_z)
    mc.set_species(batch, a, z, torch.where(back, mass, here_m))


def metropolis(stage: Any, batch: Batch, mask: torch.Tensor) -> None:
    """One proposal (``proposals=1``): accept with ``min(1, exp(-(ΔE - (μ_new - μ_old))/kT))``,
    else the species, mass, energy, forces and stress back; an accepted change keeps the
    atom's kinetic energy."""
    starts = batch.ptr[:-1]
    a = torch.where(mask, batch.mc_site_a + starts, starts)
    old = batch.mc_old_species.clamp(min=0)
    moved = mask & (batch.mc_old_species >= 0)
    new = mc.species_index(batch, stage._numbers).index_select(0, a).clamp(min=0)
    mu = on_device(stage._mu, batch.device, batch.dtype)
    delta = batch.energy - batch.mc_energy - (mu[new] - mu[old])
    temperature = ops.per_system(batch, stage.temperature)
    accept = moved & mc.metropolis(delta, temperature, mc.draws(stage.seed, batch)[:, 2])
    mc.restore(batch, mask & ~accept)
    old_mass = torch.where(moved, batch.mc_old_mass, batch.masses.index_select(0, a))
    at_a = torch.zeros_like(batch.masses).scatter(0, a, old_mass)  # old masses at the sites
    undo(stage, batch, mask & ~accept, a, batch.mc_old_species, batch.mc_old_mass)
    changed = batch.atom_mask(accept) & (at_a > 0)
    mc.keep_kinetic_energy(batch, torch.where(changed, at_a, batch.masses))
    mc.record(batch, mask, accept, new, "species")
    mc.record_counts(batch, mask, stage._numbers)


def chemical_work(stage: Any, batch: Batch) -> torch.Tensor:
    """``Σ_s μ_s N_s`` ``[B]`` (eV, float64) of each system's current species."""
    idx = mc.species_index(batch, stage._numbers)
    counts = mc.count(batch, mc.one_hot(idx, len(stage.species)))
    return counts.to(torch.float64) @ on_device(stage._mu, batch.device, torch.float64)


def post_update(stage: Any, batch: Batch, mask: torch.Tensor) -> None:
    """Choose among ``{x, y_1 .. y_k}`` by ``exp(-(E - μ·N)/kT)``
    (:func:`.proposals.conclude`); statistics: accepted when the chosen state is not
    ``x``, counted under the auxiliary change's new species."""
    starts = batch.ptr[:-1]
    a = torch.where(mask, batch.mc_aux_a + starts, starts)
    c = torch.where(mask, batch.mc_site_a + starts, starts)
    proposed = {n: getattr(batch, n) for n in props.PROPOSED}
    e_y = proposed["energy"].to(torch.float64) - chemical_work(stage, batch)
    undo(stage, batch, mask, c, batch.mc_old_species, batch.mc_old_mass)  # back to z
    kind = mc.species_index(batch, stage._numbers).index_select(0, a).clamp(min=0)
    undo(stage, batch, mask, a, batch.mc_aux_old, batch.mc_aux_mass)  # back to x
    e_x = batch.mc_energy.to(torch.float64) - chemical_work(stage, batch)
    x = batch.atomic_numbers
    _, moved = props.conclude(stage, batch, mask, proposed, e_x, e_y)
    back = mc.count(batch, batch.atomic_numbers != x) == 0  # the chosen proposal is x
    mc.record(batch, mask, moved & ~back, kind, "species")
    mc.record_counts(batch, mask, stage._numbers)


__all__ = ["FIELDS", "change", "chemical_work", "metropolis", "post_update", "undo"]
