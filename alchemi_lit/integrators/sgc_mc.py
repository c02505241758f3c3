"""Semi-grand canonical Monte Carlo: change one atom's species at given chemical potentials.

The number of atoms is fixed, the composition is not: the chain samples
``exp(-(E - Σ_s μ_s N_s) / kT)``.  One attempt a step (:mod:`.mc_ops`): ``pre_update``
picks an atom uniformly among the system's changeable ones (one of the species given,
not fixed) and a new species uniformly among the *other* ``m - 1``; the batched forward
evaluates it; ``post_update`` accepts with ``min(1, exp(-(ΔE - (μ_new - μ_old)) / kT))``.
The proposal is symmetric (the same atom, and the old species among the new one's
``m - 1`` others), so this is detailed balance for that distribution.

Sign convention (LAMMPS ``fix atom/swap ... semi-grand yes``, whose ``delta_mu`` are
``μ_s - μ_first``): a larger ``μ_s`` favours species ``s``; only differences matter.
The new atom takes the species' standard mass (``ase.data.atomic_masses``), keeping its
kinetic energy (``v *= sqrt(m_old / m_new)``).  ``proposals=k``: :mod:`.proposals`, the
change's part (and why it then redraws among all ``m``) in :mod:`.sgc_moves`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch
from ase.data import atomic_masses, chemical_symbols

from ..core.errors import ConfigError, row_names
from ..core.state import Batch
from . import mc_ops as mc
from . import proposal_copies as copies
from . import proposals as props
from . import sgc_moves as moves
from .base import FieldSpec, Integrator
from .md import describe
from .params import Param, check_count, check_temperature
from .swap_mc import NO_ZERO


class SemiGrandMC(Integrator):
    """Semi-grand canonical Monte Carlo at fixed chemical potentials, one attempt per
    system per step.

    Args:
        chemical_potentials: eV per element, e.g. ``{"Cu": 0.0, "Au": -0.2}`` (at least
            two; only differences matter, a larger one favours its element).  Atoms of
            other elements and fixed atoms never change.
        temperature: K, > 0 (a number, or one per system indexed by system_id).
        steps: attempts per system.
        proposals: changes evaluated per chain per step (>= 1), as many batch rows per
            structure (the run makes the copies): the generalized Metropolis-Hastings rule
            of :mod:`.proposals`, the next state one of ``x`` and the ``k`` proposals with
            weights ``exp(-(E - Σ μ N)/kT)``; one temperature (not per system_id).
    """

    budget_name = "steps"
    fields: ClassVar[dict[str, FieldSpec]] = {
        **mc.SAVED,
        "mc_site_a": FieldSpec("system", dtype="int64"),
        "mc_old_species": FieldSpec("system", dtype="int64", fill=-1),
        "mc_old_mass": FieldSpec("system"),
    }

    def __init__(self, chemical_potentials: Mapping[str, float], temperature: Param = 300.0,
                 steps: int = 1000, proposals: int = 1) -> None:  # fmt: skip
        super().__init__(steps)
        owner = type(self).__name__
        given = isinstance(chemical_potentials, Mapping)
        mu = [float(v) for v in chemical_potentials.values()] if given else []
        if not given or not all(abs(v) < 1e300 for v in mu):
            raise ConfigError(
                f"{owner}: chemical_potentials must map elements to finite energies in eV, "
                f"e.g. {{'Cu': 0.0, 'Au': -0.2}}; got {chemical_potentials!r}"
            )
        numbers = mc.species_numbers(owner, list(chemical_potentials))
        self.species = tuple(chemical_symbols[z] for z in numbers)
        self._numbers = torch.tensor(numbers)  # (kept: copied to the device once)
        self._masses = torch.tensor(atomic_masses[list(numbers)], dtype=torch.float64)
        self.chemical_potentials = dict(zip(self.species, mu))
        self._mu = torch.tensor(mu, dtype=torch.float64)
        self.temperature = check_temperature(owner, temperature, NO_ZERO)
        self.proposals = check_count(owner, "proposals", proposals, 1, "changes per chain per step")
        if self.proposals > 1:
            copies.check_single_temperature(self)
            self.fields = {**self.fields, **moves.FIELDS}

    @property
    def steps(self) -> int:
        return self.max_steps

    def __repr__(self) -> str:
        t, k = describe(self.temperature), f", proposals={self.proposals}" * (self.proposals > 1)
        return f"SemiGrandMC(mu={self.chemical_potentials}, T={t}, steps={self.steps}{k})"

    def setup(self, batch: Batch, seed: int, prefix: str) -> None:
        self.refuse(batch, torch.ones_like(batch.pbc[:, 0]))
        if self.proposals > 1:
            copies.enter(batch, self.proposals, repr(self))
        super().setup(batch, seed, prefix)
        mc.declare_statistics(batch, type(self).__name__, self._numbers, "species")

    def refuse(self, batch: Batch, mask: torch.Tensor) -> None:
        """A system of ``mask`` without a free atom of the given species has nothing to
        change: a ConfigError naming it (reads the host)."""
        free = (mc.species_index(batch, self._numbers) >= 0) & ~batch.fixed
        rows = (mask & (mc.count(batch, free) == 0)).nonzero().flatten().tolist()
        if rows:
            names = row_names(batch, rows)
            raise ConfigError(
                f"SemiGrandMC: {names} {'has' if len(rows) == 1 else 'have'} no free atom of "
                f"{sorted(self.chemical_potentials)} (the chemical potentials name only "
                f"species absent from it); give the potential of an element it holds"
            )

    def init_systems(self, batch: Batch, mask: torch.Tensor) -> None:
        super().init_systems(batch, mask)
        mc.reset_statistics(batch, mask, self._numbers)

    def pre_update(self, batch: Batch, mask: torch.Tensor) -> None:
        mc.save(batch, mask)
        idx = mc.species_index(batch, self._numbers)
        eligible = batch.atom_mask(mask) & ~batch.fixed & (idx >= 0)
        starts = batch.ptr[:-1]
        many = self.proposals > 1  # (then a change redraws among all m: sgc_moves)
        if many:  # the chain's auxiliary change z, then this copy's change of z
            aux = props.aux_draws(self.seed, batch)
            a, old, mass = moves.change(self, batch, mask, eligible, aux, redraw=True)
            batch.mc_aux_a = torch.where(mask, a - starts, batch.mc_aux_a)
            batch.mc_aux_old = torch.where(mask, old, batch.mc_aux_old)
            batch.mc_aux_mass = torch.where(mask, mass, batch.mc_aux_mass)
        u = (props.copy_draws if many else mc.draws)(self.seed, batch)
        a, old, mass = moves.change(self, batch, mask, eligible, u, redraw=many)
        batch.mc_old_species = torch.where(mask, old, batch.mc_old_species)
        batch.mc_old_mass = torch.where(mask, mass, batch.mc_old_mass)
        batch.mc_site_a = torch.where(mask, a - starts, batch.mc_site_a)

    def post_update(self, batch: Batch, mask: torch.Tensor) -> None:
        (moves.post_update if self.proposals > 1 else moves.metropolis)(self, batch, mask)


__all__ = ["SemiGrandMC"]
