"""The steps Monte Carlo moves are made of: keyed choices, Metropolis, putting a rejected
proposal back, the statistics a chain keeps.

A move is one step of the stage: ``pre_update`` proposes (changes species, keeps
positions), the step's one batched forward evaluates every system's proposal, and
``post_update`` accepts or rejects it -- a rejected system gets its species, masses,
energy, forces and stress back from the fields saved before the proposal.  Every
choice is a function of ``(seed, system_id, total_steps)`` (:func:`~alchemi_lit.core.
random.system_uniforms`), drawn again in ``post_update`` rather than stored: a system's
chain is the same alone, in any batch and after a resume.  Nothing reads the host.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from ase.data import atomic_numbers, chemical_symbols

from ..core import random as rng
from ..core.errors import ConfigError
from ..core.state import Batch
from ..core.tensor_ops import on_device
from ..core.units import kB
from ..io.store_reader import MC_COLUMNS
from .base import FieldSpec

#: what a stage keeps to put a rejected proposal back (stage-private: dropped at the end)
SAVED: dict[str, FieldSpec] = {
    "mc_energy": FieldSpec("system", fill=float("nan")),
    "mc_stress": FieldSpec("system", (3, 3)),
    "mc_forces": FieldSpec("atom", (3,)),
}


def species_numbers(owner: str, species: Sequence[str | int]) -> tuple[int, ...]:
    """Element symbols or numbers as distinct atomic numbers, at least two."""
    out = []
    for s in species:
        z = atomic_numbers.get(s) if isinstance(s, str) else int(s)
        if z is None or not 0 < z < len(chemical_symbols):
            raise ConfigError(f"{owner}: {s!r} is not an element; give symbols such as 'Cu'")
        out.append(z)
    if len(set(out)) != len(out) or len(out) < 2:
        raise ConfigError(
            f"{owner}: species must name at least two distinct elements, got {list(species)}"
        )
    return tuple(out)


def draws(seed: int, batch: Batch) -> torch.Tensor:
    """This step's four uniforms per system ``[B, 4]``: the same in pre- and post-update."""
    return rng.system_uniforms(seed, batch.system_id, batch.total_steps, rng.PURPOSE_MC)


def table(batch: Batch, numbers: torch.Tensor) -> torch.Tensor:
    """A move's species (atomic numbers, a CPU tensor the integrator keeps) on the
    batch's device, copied once (:func:`~alchemi_lit.core.tensor_ops.on_device`)."""
    return on_device(numbers, batch.device, torch.int64)


def species_index(batch: Batch, numbers: torch.Tensor) -> torch.Tensor:
    """Each atom's position in ``numbers`` ``[N]`` (-1: not one of them)."""
    hit = batch.atomic_numbers.unsqueeze(-1) == table(batch, numbers)
    return torch.where(hit.any(-1), hit.to(torch.int64).argmax(-1), -1)


def one_hot(index: torch.Tensor, width: int) -> torch.Tensor:
    """``[..., width]`` int64 indicators of ``index`` (-1 or beyond: none); not
    ``torch.nn.functional.one_hot``, which reads the largest index on the host."""
    columns = torch.arange(width, device=index.device)
    return (index.unsqueeze(-1) == columns).to(torch.int64)


def count(batch: Batch, atoms: torch.Tensor) -> torch.Tensor:
    """How many atoms of ``atoms`` ``[N]`` (bool, or ``[N, k]`` counts) each system has."""
    x = atoms.to(torch.int64)
    out = x.new_zeros((batch.num_systems, *x.shape[1:]))
    return out.index_add_(0, batch.system_idx, x)


def pick(
    batch: Batch, eligible: torch.Tensor, u: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One atom per system, uniformly among its ``eligible`` ones (``[N]`` bool), chosen by
    ``u`` ``[B]`` on (0, 1): its batch index ``[B]`` (the system's first atom where it has
    none) and whether it had any ``[B]``."""
    e = eligible.to(torch.int64)
    before = torch.cumsum(e, 0) - e  # eligible atoms before each atom, batch-wide
    starts = batch.ptr[:-1]
    rank = before - before.index_select(0, starts).index_select(0, batch.system_idx)
    n = count(batch, eligible)
    target = (u * n).floor().to(torch.int64).clamp(max=(n - 1).clamp(min=0))
    hit = eligible & (rank == target.index_select(0, batch.system_idx))
    rows = torch.arange(batch.num_atoms, device=batch.device)
    index = torch.zeros_like(n).index_add_(0, batch.system_idx, torch.where(hit, rows, 0))
    return torch.where(n > 0, index, starts), n > 0


def metropolis(
    delta: torch.Tensor, temperature: float | torch.Tensor, u: torch.Tensor
) -> torch.Tensor:
    """Accept ``[B]`` with probability ``min(1, exp(-delta / kT))`` (``delta`` in eV, the
    temperature in K, a number or ``[B]``): ``ln u < -delta / kT``.  A NaN energy rejects."""
    return torch.log(u) < -delta / (kB * temperature)


def save(batch: Batch, mask: torch.Tensor) -> None:
    """Keep the current (accepted) energy, forces and stress of ``mask``'s systems."""
    atoms = batch.atom_mask(mask).unsqueeze(-1)
    batch.mc_energy = torch.where(mask, batch.energy, batch.mc_energy)
    batch.mc_stress = torch.where(mask.view(-1, 1, 1), batch.stress, batch.mc_stress)
    batch.mc_forces = torch.where(atoms, batch.forces, batch.mc_forces)


def restore(batch: Batch, reject: torch.Tensor) -> None:
    """Energy, forces and stress of ``reject``'s systems back to the saved ones."""
    atoms = batch.atom_mask(reject).unsqueeze(-1)
    batch.energy = torch.where(reject, batch.mc_energy, batch.energy)
    batch.stress = torch.where(reject.view(-1, 1, 1), batch.mc_stress, batch.stress)
    batch.forces = torch.where(atoms, batch.mc_forces, batch.forces)


def set_species(batch: Batch, a: torch.Tensor, z: torch.Tensor, mass: torch.Tensor) -> None:
    """Species ``z[k]`` and mass ``mass[k]`` for atom ``a[k]`` ``[B]`` of each system."""
    batch.atomic_numbers = batch.atomic_numbers.scatter(0, a, z)
    batch.masses = batch.masses.scatter(0, a, mass)


def keep_kinetic_energy(batch: Batch, old_masses: torch.Tensor) -> None:
    """Atoms whose mass changed keep their kinetic energy: ``v *= sqrt(m_old / m_new)``
    (LAMMPS ``fix atom/swap ... ke yes``, ``fix sgcmc``)."""
    factor = (old_masses / batch.masses).sqrt().unsqueeze(-1)
    batch.velocities = batch.velocities * factor


def permutation(batch: Batch, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The atom order ``[N]`` with atoms ``a[k]`` and ``b[k]`` exchanged (``a == b``: none)."""
    perm = torch.arange(batch.num_atoms, device=batch.device)
    return perm.scatter(0, a, b).scatter(0, b, a)


def exchange(batch: Batch, a: torch.Tensor, b: torch.Tensor) -> None:
    """Exchange the species and masses of atoms ``a[k]`` and ``b[k]`` of each system."""
    perm = permutation(batch, a, b)
    batch.atomic_numbers = batch.atomic_numbers.index_select(0, perm)
    batch.masses = batch.masses.index_select(0, perm)


def pair_kind(ia: torch.Tensor, ib: torch.Tensor, m: int) -> torch.Tensor:
    """The index of the species pair ``(ia, ib)`` (positions in a move's ``m`` species)
    in the order (0, 1), (0, 2) ... (1, 2) ...: a swap's ``mc_pair_*`` column."""
    lo, hi = torch.minimum(ia, ib), torch.maximum(ia, ib)
    return lo * m - lo * (lo + 1) // 2 + (hi - lo - 1)


def declare_statistics(batch: Batch, owner: str, numbers: torch.Tensor, kinds: str) -> None:
    """The statistics kept in the results (not stage-private): attempts, acceptances, the
    sums of the chain's energy and its square, ``mc_species`` (the move's atomic numbers)
    and, per kind of move, ``mc_{kinds}_attempts`` / ``_accepted`` ``[B, k]`` (``kinds``:
    ``"pair"``, a swap's species pairs in order (0, 1), (0, 2) ... (1, 2) ...;
    ``"species"``, a change's new species, with ``mc_count_sum`` ``[B, m]``, the species'
    counts summed over the attempts)."""
    m = len(numbers)
    if batch.has_field("mc_species") and tuple(batch.mc_species.shape[1:]) != (m,):
        raise ConfigError(
            f"{owner}: two Monte Carlo stages with different numbers of species share the "
            f"batch's statistics; give them the same species"
        )
    for name in ("mc_attempts", "mc_accepted"):
        batch.ensure_field(name, "system", (), torch.int64, 0)
    for name in ("mc_energy_sum", "mc_energy_sq_sum"):
        batch.ensure_field(name, "system", (), torch.float64, 0.0)
    batch.ensure_field("mc_species", "system", (m,), torch.int64, 0)
    width = m * (m - 1) // 2 if kinds == "pair" else m
    for name in (f"mc_{kinds}_attempts", f"mc_{kinds}_accepted"):
        batch.ensure_field(name, "system", (width,), torch.int64, 0)
    if kinds == "species":
        batch.ensure_field("mc_count_sum", "system", (m,), torch.float64, 0.0)


#: the statistics of :func:`declare_statistics` (those a batch has), the store's columns
STATISTICS = MC_COLUMNS


def reset_statistics(batch: Batch, mask: torch.Tensor, numbers: torch.Tensor) -> None:
    """Fresh statistics for systems entering a Monte Carlo stage."""
    for name in (n for n in STATISTICS if batch.has_field(n)):
        t = getattr(batch, name)
        setattr(batch, name, t.masked_fill(mask.view(-1, *[1] * (t.dim() - 1)), 0))
    batch.mc_species = torch.where(mask.unsqueeze(-1), table(batch, numbers), batch.mc_species)


def record(
    batch: Batch, mask: torch.Tensor, accept: torch.Tensor, kind: torch.Tensor, kinds: str
) -> None:
    """One attempt of ``mask``'s systems, of kind ``kind`` ``[B]`` (accepted: ``accept``)."""
    one, won = mask.to(torch.int64), (mask & accept).to(torch.int64)
    batch.mc_attempts = batch.mc_attempts + one
    batch.mc_accepted = batch.mc_accepted + won
    e = torch.where(mask, batch.energy.to(torch.float64), 0.0)
    batch.mc_energy_sum = batch.mc_energy_sum + e
    batch.mc_energy_sq_sum = batch.mc_energy_sq_sum + e * e
    tried, took = f"mc_{kinds}_attempts", f"mc_{kinds}_accepted"
    hot = one_hot(kind, getattr(batch, tried).shape[1])
    setattr(batch, tried, getattr(batch, tried) + hot * one.unsqueeze(-1))
    setattr(batch, took, getattr(batch, took) + hot * won.unsqueeze(-1))


def record_counts(batch: Batch, mask: torch.Tensor, numbers: torch.Tensor) -> None:
    """Add the species' counts of ``mask``'s systems to ``mc_count_sum`` (their mean
    composition is ``mc_count_sum / mc_attempts``)."""
    counts = count(batch, one_hot(species_index(batch, numbers), len(numbers)))
    counts = torch.where(mask.unsqueeze(-1), counts.to(torch.float64), 0.0)
    batch.mc_count_sum = batch.mc_count_sum + counts


__all__ = [
    "SAVED", "STATISTICS", "count", "declare_statistics", "draws", "exchange",
    "keep_kinetic_energy", "metropolis", "one_hot", "pair_kind", "permutation", "pick",
    "record", "record_counts", "reset_statistics", "restore", "save", "set_species",
    "species_index", "species_numbers", "table",
]  # fmt: skip
