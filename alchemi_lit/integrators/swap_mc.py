"""Canonical swap Monte Carlo: exchange the species of two unlike atoms, Metropolis.

One attempt a step (:mod:`.mc_ops`): ``pre_update`` picks atom ``a`` uniformly among the
swappable atoms (one of ``species``, not fixed), ``b`` among those of another species,
and exchanges their atomic numbers and masses (positions stay, so neighbour lists stay
valid); the step's forward evaluates every proposal; ``post_update`` accepts with
``min(1, exp(-ΔE / kT))`` or puts species, masses, energy, forces and stress back.  The
proposal is symmetric (a swap keeps the composition, so the pair has probability
``(1/n)(1/(n - n_A) + 1/(n - n_B))`` both ways; design record 57).  An accepted swap keeps
each atom's kinetic energy (LAMMPS ``ke yes``).  ``proposals=k``: :mod:`.swap_proposals`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch
from ase.data import chemical_symbols

from ..core.errors import ConfigError, row_names
from ..core.state import Batch
from . import mc_ops as mc
from . import ops
from . import proposal_copies as copies
from . import proposals as props
from . import swap_proposals as swaps
from .base import FieldSpec, Integrator
from .mc_ops import exchange, permutation
from .md import describe
from .params import Param, check_count, check_temperature

NO_ZERO = "the Metropolis rule exp(-ΔE / kT) needs kT > 0 (at 0 K it is a quench)"


class SwapMC(Integrator):
    """Canonical Monte Carlo swaps of unlike atoms, one attempt per system per step.

    Args:
        species: the elements whose atoms may swap (LAMMPS ``types``), at least two;
            atoms of other elements and fixed atoms (``FixAtoms``) never move.
        temperature: K, > 0 (a number, or one per system indexed by system_id).
        steps: attempts per system.
        proposals: swaps evaluated per chain per step (>= 1), as many batch rows per
            structure (the run makes the copies; :mod:`.proposals`).
    """

    budget_name = "steps"
    fields: ClassVar[dict[str, FieldSpec]] = {
        **mc.SAVED,
        "mc_site_a": FieldSpec("system", dtype="int64"),
        "mc_site_b": FieldSpec("system", dtype="int64"),
    }

    def __init__(self, species: Sequence[str | int], temperature: Param = 300.0,
                 steps: int = 1000, proposals: int = 1) -> None:  # fmt: skip
        super().__init__(steps)
        owner = type(self).__name__
        numbers = mc.species_numbers(owner, species)
        self.species = tuple(chemical_symbols[z] for z in numbers)
        self._numbers = torch.tensor(numbers)  # (kept: copied to the device once)
        self.temperature = check_temperature(owner, temperature, NO_ZERO)
        self.pairs = [(x, y) for x in range(len(numbers)) for y in range(x + 1, len(numbers))]
        self.proposals = check_count(owner, "proposals", proposals, 1, "swaps per chain per step")
        if self.proposals > 1:
            copies.check_single_temperature(self)
            self.fields = {**self.fields, **swaps.FIELDS}

    @property
    def steps(self) -> int:
        return self.max_steps

    def __repr__(self) -> str:
        t, k = describe(self.temperature), f", proposals={self.proposals}" * (self.proposals > 1)
        return f"SwapMC(species={self.species}, T={t}, steps={self.steps}{k})"

    def setup(self, batch: Batch, seed: int, prefix: str) -> None:
        self.refuse(batch, torch.ones_like(batch.pbc[:, 0]))  # before any model call
        if self.proposals > 1:
            copies.enter(batch, self.proposals, f"SwapMC(proposals={self.proposals})")
        super().setup(batch, seed, prefix)
        mc.declare_statistics(batch, type(self).__name__, self._numbers, "pair")

    def refuse(self, batch: Batch, mask: torch.Tensor) -> None:
        """A system of ``mask`` with fewer than two of ``species`` among its free atoms has
        no swap to make: a ConfigError naming it (reads the host)."""
        idx = mc.species_index(batch, self._numbers)
        free = (idx >= 0) & ~batch.fixed
        hot = mc.one_hot(torch.where(free, idx, -1), len(self.species))
        kinds = (mc.count(batch, hot) > 0).sum(-1)
        rows = (mask & (kinds < 2)).nonzero().flatten().tolist()
        if rows:
            names = row_names(batch, rows)
            symbols = list(self.species)
            raise ConfigError(
                f"SwapMC(species={symbols}): {names} {'has' if len(rows) == 1 else 'have'} "
                f"free atoms of fewer than two of these species, so no swap to make; give "
                f"species present in every system, or run those systems without SwapMC"
            )

    def init_systems(self, batch: Batch, mask: torch.Tensor) -> None:
        super().init_systems(batch, mask)
        mc.reset_statistics(batch, mask, self._numbers)

    def swap(self, batch: Batch, mask: torch.Tensor, eligible: torch.Tensor, u: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """Atom ``a`` uniform among ``eligible`` (by ``u[:, 0]``), ``b`` among those of
        another species (``u[:, 1]``), exchanged; returns ``(a, b)`` (``a == b``: none)."""
        a, _ = mc.pick(batch, eligible, u[:, 0])
        za = batch.atomic_numbers.index_select(0, a).index_select(0, batch.system_idx)
        b, found = mc.pick(batch, eligible & (batch.atomic_numbers != za), u[:, 1])
        b = torch.where(mask & found, b, a)  # no partner: a swap of a with itself
        exchange(batch, a, b)
        return a, b

    def pre_update(self, batch: Batch, mask: torch.Tensor) -> None:
        mc.save(batch, mask)
        idx = mc.species_index(batch, self._numbers)
        eligible = batch.atom_mask(mask) & ~batch.fixed & (idx >= 0)
        starts = batch.ptr[:-1]
        if self.proposals > 1:  # the group's auxiliary swap z, then this copy's swap of z
            x, y = self.swap(batch, mask, eligible, props.aux_draws(self.seed, batch))
            batch.mc_aux_a = torch.where(mask, x - starts, batch.mc_aux_a)
            batch.mc_aux_b = torch.where(mask, y - starts, batch.mc_aux_b)
        u = props.copy_draws if self.proposals > 1 else mc.draws
        a, b = self.swap(batch, mask, eligible, u(self.seed, batch))
        batch.mc_site_a = torch.where(mask, a - starts, batch.mc_site_a)
        batch.mc_site_b = torch.where(mask, b - starts, batch.mc_site_b)

    def post_update(self, batch: Batch, mask: torch.Tensor) -> None:
        if self.proposals > 1:
            return swaps.post_update(self, batch, mask)
        starts = batch.ptr[:-1]
        a = torch.where(mask, batch.mc_site_a + starts, starts)
        b = torch.where(mask, batch.mc_site_b + starts, starts)
        moved = mask & (a != b)
        delta = batch.energy - batch.mc_energy
        temperature = ops.per_system(batch, self.temperature)
        accept = moved & mc.metropolis(delta, temperature, mc.draws(self.seed, batch)[:, 2])
        reject = mask & ~accept
        old = batch.masses.index_select(0, permutation(batch, a, b))
        mc.restore(batch, reject)
        exchange(batch, torch.where(reject, a, starts), torch.where(reject, b, starts))
        mc.keep_kinetic_energy(batch, torch.where(batch.atom_mask(accept), old, batch.masses))
        idx = mc.species_index(batch, self._numbers)
        kind = mc.pair_kind(idx.index_select(0, a), idx.index_select(0, b), len(self.species))
        mc.record(batch, mask, accept, kind, "pair")


__all__ = ["SwapMC", "exchange", "permutation"]
