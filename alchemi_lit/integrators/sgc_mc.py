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
kinetic energy (``v *= sqrt(m_old / m_new)``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch
from ase.data import atomic_masses, chemical_symbols

from ..core.errors import ConfigError, system_name
from ..core.state import Batch
from ..core.tensor_ops import on_device
from . import mc_ops as mc
from . import ops
from .base import FieldSpec, Integrator
from .md import describe
from .params import Param, check_temperature
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
    """

    budget_name = "steps"
    fields: ClassVar[dict[str, FieldSpec]] = {
        **mc.SAVED,
        "mc_site_a": FieldSpec("system", dtype="int64"),
        "mc_old_species": FieldSpec("system", dtype="int64", fill=-1),
        "mc_old_mass": FieldSpec("system"),
    }

    def __init__(
        self,
        chemical_potentials: Mapping[str, float],
        temperature: Param = 300.0,
        steps: int = 1000,
    ) -> None:
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

    @property
    def steps(self) -> int:
        return self.max_steps

    def __repr__(self) -> str:
        t = describe(self.temperature)
        return f"SemiGrandMC(mu={self.chemical_potentials}, T={t}, steps={self.steps})"

    def setup(self, batch: Batch, seed: int, prefix: str) -> None:
        self.refuse(batch, torch.ones_like(batch.pbc[:, 0]))
        super().setup(batch, seed, prefix)
        mc.declare_statistics(batch, type(self).__name__, self._numbers, "species")

    def refuse(self, batch: Batch, mask: torch.Tensor) -> None:
        """A system of ``mask`` without a free atom of the given species has nothing to
        change: a ConfigError naming it (reads the host)."""
        free = (mc.species_index(batch, self._numbers) >= 0) & ~batch.fixed
        rows = (mask & (mc.count(batch, free) == 0)).nonzero().flatten().tolist()
        if rows:
            names = ", ".join(system_name(r, int(batch.system_id[r])) for r in rows[:5])
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
        u = mc.draws(self.seed, batch)
        idx = mc.species_index(batch, self._numbers)
        a, found = mc.pick(batch, batch.atom_mask(mask) & ~batch.fixed & (idx >= 0), u[:, 0])
        moved, m = mask & found, len(self.species)
        old = idx.index_select(0, a)
        shift = 1 + (u[:, 1] * (m - 1)).floor().to(torch.int64).clamp(max=m - 2)
        new = torch.where(moved, (old + shift) % m, old.clamp(min=0))
        here_z, here_m = batch.atomic_numbers.index_select(0, a), batch.masses.index_select(0, a)
        batch.mc_old_species = torch.where(mask, torch.where(moved, old, -1), batch.mc_old_species)
        batch.mc_old_mass = torch.where(mask, here_m, batch.mc_old_mass)
        batch.mc_site_a = torch.where(mask, a - batch.ptr[:-1], batch.mc_site_a)
        masses = on_device(self._masses, batch.device, batch.dtype)
        z = torch.where(moved, mc.table(batch, self._numbers)[new], here_z)
        mc.set_species(batch, a, z, torch.where(moved, masses[new], here_m))

    def post_update(self, batch: Batch, mask: torch.Tensor) -> None:
        starts = batch.ptr[:-1]
        a = torch.where(mask, batch.mc_site_a + starts, starts)
        old = batch.mc_old_species.clamp(min=0)
        moved = mask & (batch.mc_old_species >= 0)
        new = mc.species_index(batch, self._numbers).index_select(0, a).clamp(min=0)
        mu = on_device(self._mu, batch.device, batch.dtype)
        delta = batch.energy - batch.mc_energy - (mu[new] - mu[old])
        temperature = ops.per_system(batch, self.temperature)
        accept = moved & mc.metropolis(delta, temperature, mc.draws(self.seed, batch)[:, 2])
        reject = moved & ~accept
        mc.restore(batch, mask & ~accept)
        here_z, here_m = batch.atomic_numbers.index_select(0, a), batch.masses.index_select(0, a)
        old_mass = torch.where(moved, batch.mc_old_mass, here_m)
        at_a = torch.zeros_like(batch.masses).scatter(0, a, old_mass)  # old masses at the sites
        old_z = torch.where(reject, mc.table(batch, self._numbers)[old], here_z)
        mc.set_species(batch, a, old_z, torch.where(reject, old_mass, here_m))
        changed = batch.atom_mask(accept) & (at_a > 0)
        mc.keep_kinetic_energy(batch, torch.where(changed, at_a, batch.masses))
        mc.record(batch, mask, accept, new, "species")
        mc.record_counts(batch, mask, self._numbers)


__all__ = ["SemiGrandMC"]
