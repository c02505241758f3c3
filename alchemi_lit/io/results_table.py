"""The table of :meth:`~alchemi_lit.io.results.Results.to_pandas`: one row per system,
built from a Batch's tensors (a scatter-max for fmax, the cell and stress arrays for
volume and pressure, the Hill formula once per distinct composition), a chunk at a time
for results read lazily from a store."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..core import symmetry
from ..core.state import EXIT_REASONS, Batch

#: The columns of :meth:`Results.to_pandas` before the per-stage ones, in order.
COLUMNS = (
    "system_id",
    "formula",
    "n_atoms",
    "energy",
    "energy_per_atom",
    "fmax",
    "volume",
    "pressure",
    "steps",
    "converged",
    "exit_reason",
    "source_file",
    "spacegroup_initial",
    "spacegroup_final",
    "symmetry",
)


def table_of(batch: Batch | None, stage_names: Sequence[str] | None) -> dict[str, Any]:
    """The columns of :meth:`Results.to_pandas`, from the batch's tensors."""
    from ase.units import GPa

    if batch is None:
        return {name: [] for name in COLUMNS}
    b = batch.to(device="cpu")
    s = {k: v.numpy() for k, v in b.system.items()}
    energy = s["energy"].astype(np.float64)
    evaluated = np.isfinite(energy)
    n_atoms = s["n_atoms"]
    periodic = s["pbc"].all(axis=1)
    stress = s["stress"].astype(np.float64)
    volume = np.abs(np.linalg.det(s["cell"].astype(np.float64)))
    pressure = -np.trace(stress, axis1=1, axis2=2) / 3.0 / GPa
    table: dict[str, Any] = {
        "system_id": s["system_id"],
        "formula": _formulas(b),
        "n_atoms": n_atoms,
        "energy": energy,
        "energy_per_atom": energy / n_atoms,
        "fmax": np.where(evaluated, _fmax(b), np.nan),
        "volume": np.where(periodic, volume, np.nan),
        "pressure": np.where(periodic & evaluated, pressure, np.nan),
        "steps": s["total_steps"],
        "converged": s["converged"],
        "exit_reason": _reasons(s["exit_code"]),
        "source_file": [b.info.get(int(i), {}).get("source_file") for i in s["system_id"]],
        **_spacegroups(s),
    }
    if "rex_temperature" in s:  # a replica exchange's: where each replica ended
        table["replica_group"] = s["rex_group"]
        table["temperature"] = s["rex_temperature"].astype(np.float64)
        table["round_trips"] = s["rex_round_trips"]
    if "stage_steps" in s:
        k = s["stage_steps"].shape[1]
        names = stage_names if stage_names and len(stage_names) == k else None
        for j in range(k):
            name = names[j] if names else f"stage {j}"
            table[f"steps[{name}]"] = s["stage_steps"][:, j]
            if "stage_exit" in s:
                table[f"exit_reason[{name}]"] = _reasons(s["stage_exit"][:, j])
            if "stage_energy" in s:
                table[f"energy[{name}]"] = s["stage_energy"][:, j].astype(np.float64)
    if "mc_attempts" in s:
        table.update(mc_columns(s))
    if "mc_copy" in s:  # proposals=k (SwapMC, SemiGrandMC): one row per chain, its copy 0
        table["mc_chain"] = s["mc_chain"]
        keep = s["mc_copy"] <= 0
        table = {k: v[keep] if isinstance(v, np.ndarray) else [x for x, m in zip(v, keep) if m]
                 for k, v in table.items()}  # fmt: skip
    return table


def mc_columns(s: dict[str, np.ndarray]) -> dict[str, Any]:
    """A Monte Carlo stage's chain statistics (:mod:`~alchemi_lit.integrators.mc_ops`):
    attempts, acceptances, the chain's mean energy and its spread (eV), per species pair
    of a swap (``mc_accepted[Cu-Au]``) or per new species of a semi-grand change
    (``mc_accepted[->Au]``) and the mean fraction of each species (``mc_fraction[Au]``)."""
    from ase.data import chemical_symbols

    n = s["mc_attempts"]
    per = np.where(n > 0, 1.0 / np.maximum(n, 1), np.nan)
    mean = s["mc_energy_sum"] * per
    out: dict[str, Any] = {
        "mc_attempts": n,
        "mc_accepted": s["mc_accepted"],
        "mc_acceptance": s["mc_accepted"] * per,
        "mc_energy_mean": mean,
        "mc_energy_std": np.sqrt(np.maximum(s["mc_energy_sq_sum"] * per - mean**2, 0.0)),
    }
    symbols = [chemical_symbols[z] for z in s["mc_species"][0]] if len(n) else []
    if "mc_pair_attempts" in s:
        pairs = [(a, b) for i, a in enumerate(symbols) for b in symbols[i + 1 :]]
        for k, (a, b) in enumerate(pairs):
            out[f"mc_attempts[{a}-{b}]"] = s["mc_pair_attempts"][:, k]
            out[f"mc_accepted[{a}-{b}]"] = s["mc_pair_accepted"][:, k]
    if "mc_species_attempts" in s:
        for k, a in enumerate(symbols):
            out[f"mc_attempts[->{a}]"] = s["mc_species_attempts"][:, k]
            out[f"mc_accepted[->{a}]"] = s["mc_species_accepted"][:, k]
            out[f"mc_fraction[{a}]"] = s["mc_count_sum"][:, k] * per / s["n_atoms"]
    return out


def pick(table: dict[str, Any], columns: list[str] | None) -> dict[str, Any]:
    """The ``columns`` of ``table`` in that order (all when None); an unknown name is
    refused, listing the known ones."""
    if columns is None:
        return table
    unknown = [c for c in columns if c not in table]
    if unknown:
        raise ValueError(f"unknown Results column(s) {unknown}; the columns are {list(table)}")
    return {c: table[c] for c in columns}


def join(pieces: list[Any]) -> Any:
    """One column from its chunks (arrays concatenated, lists chained)."""
    if isinstance(pieces[0], np.ndarray):
        return np.concatenate(pieces)
    return [v for piece in pieces for v in piece]


def _spacegroups(s: dict[str, np.ndarray]) -> dict[str, Any]:
    """Space-group numbers as the systems entered the run and as they left its
    relaxation (spglib at :data:`~alchemi_lit.core.symmetry.SPACEGROUP_SYMPREC`, found on
    the host when each system finished; 0 where not periodic or not relaxed) and whether
    the symmetry was kept (:func:`~alchemi_lit.core.symmetry.verdict`)."""
    zeros = np.zeros(len(s["n_atoms"]), dtype=np.int64)
    initial, final = s.get(symmetry.INITIAL, zeros), s.get(symmetry.FINAL, zeros)
    verdicts = [symmetry.verdict(a, b) for a, b in zip(initial.tolist(), final.tolist())]
    return {"spacegroup_initial": initial, "spacegroup_final": final, "symmetry": verdicts}


def _reasons(codes: np.ndarray) -> list[str]:
    return [EXIT_REASONS.get(int(c), "unknown") for c in codes.tolist()]


def _fmax(batch: Batch) -> np.ndarray:
    """Largest force norm on a free atom, per system (0 with every atom fixed)."""
    norm = torch.linalg.vector_norm(batch.forces.to(torch.float64), dim=-1)
    norm = norm.masked_fill(batch.fixed, 0.0)
    out = torch.zeros(batch.num_systems, dtype=torch.float64)
    return out.scatter_reduce(0, batch.system_idx, norm, "amax").numpy()


def _formulas(batch: Batch) -> list[str]:
    """ASE's Hill formula of each system (``Atoms.get_chemical_formula()``), made once
    per distinct composition."""
    from ase.data import chemical_symbols
    from ase.formula import Formula

    z = batch.atomic_numbers.numpy()
    row = batch.system_idx.numpy()
    pairs, counts = np.unique(row * 256 + z, return_counts=True)  # (system, element) counts
    ends = np.searchsorted(pairs // 256, np.arange(batch.num_systems), side="right")
    made: dict[tuple[int, ...], str] = {}
    out, start = [], 0
    for end in ends.tolist():
        key = (*(pairs[start:end] % 256).tolist(), *counts[start:end].tolist())
        if key not in made:
            composition = {
                chemical_symbols[int(e)]: int(n)
                for e, n in zip(pairs[start:end] % 256, counts[start:end])
            }
            made[key] = Formula.from_dict(composition).format("hill")
        out.append(made[key])
        start = end
    return out
