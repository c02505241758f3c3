"""What :func:`~.order.order` returns: the relaxed orderings of each structure, ranked.

A row per relaxed ordering (``to_pandas``), best first within each structure, and the
relaxed ``ase.Atoms`` of each (:meth:`OrderResults.structures`); ``write(dir)`` saves
the table, one CIF per ordering and the settings, which ``alchemi-lit report`` reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import ConfigError
from .base import _plain
from .jobs import JobRun

#: the table's columns, in order
COLUMNS = (
    "material", "formula", "rank", "n_atoms", "energy", "energy_per_atom",
    "above_best_per_atom", "ewald_energy", "converged", "error",
)  # fmt: skip


class OrderResults:
    """Orderings of each input structure, relaxed and ranked by energy per atom.

    ``to_pandas()``: one row per relaxed ordering -- ``material`` (input index),
    ``formula``, ``rank`` (0 = lowest energy per atom of that material), ``n_atoms``,
    ``energy`` (eV), ``energy_per_atom``, ``above_best_per_atom`` (eV/atom above the
    material's best), ``ewald_energy`` (pymatgen's ranking energy, NaN when sampled),
    ``converged``, ``error``.  ``structures(i)``: material ``i``'s relaxed orderings, best
    first; ``best(i)`` the first.  ``counts[i]``: its orderings in the supercell,
    ``distinct[i]`` how many symmetry-distinct ones were found, ``sampled[i]`` whether
    they were sampled rather than enumerated.
    """

    name = "order"

    def __init__(
        self, inputs: list[Any], chosen: list[list[tuple[Any, float]]], jobs: JobRun,
        counts: list[int], distinct: list[int], sampled: list[bool], settings: dict[str, Any],
    ) -> None:  # fmt: skip
        self.inputs, self.jobs, self.settings = inputs, jobs, settings
        self.counts, self.distinct, self.sampled = counts, distinct, sampled
        self.rows: list[dict[str, Any]] = []
        self._atoms: dict[int, list[Any]] = {}
        relaxed = jobs.results.to_atoms()
        for i in range(len(inputs)):
            ks = jobs.of(i)
            per_atom = [jobs.energy[k] / len(relaxed[k]) for k in ks]
            ranked = sorted(range(len(ks)), key=lambda j: (ks[j] in jobs.failures, per_atom[j]))
            ok = [per_atom[j] for j in ranked if ks[j] not in jobs.failures]
            best = min(ok) if ok else np.nan
            self._atoms[i] = []
            for rank, j in enumerate(ranked):
                k = ks[j]
                atoms = relaxed[k]
                self._atoms[i].append(atoms)
                self.rows.append({
                    "material": i, "formula": atoms.get_chemical_formula(), "rank": rank,
                    "n_atoms": len(atoms), "energy": float(jobs.energy[k]),
                    "energy_per_atom": float(per_atom[j]),
                    "above_best_per_atom": float(per_atom[j] - best),
                    "ewald_energy": chosen[i][j][1],
                    "converged": bool(jobs.results.batch.converged[k]),
                    "error": jobs.failures.get(k),
                })  # fmt: skip

    def __len__(self) -> int:
        return len(self.inputs)

    def __repr__(self) -> str:
        return (f"OrderResults(materials={len(self)}, orderings={len(self.rows)}, "
                f"failed={len(self.failed)})")  # fmt: skip

    @property
    def failed(self) -> dict[int, str]:
        """Material index -> why none of its orderings has a usable energy."""
        out = {}
        for i in range(len(self.inputs)):
            errors = [r["error"] for r in self.rows if r["material"] == i]
            if errors and all(e is not None for e in errors):
                out[i] = errors[0]
        return out

    def structures(self, i: int) -> list[Any]:
        """Material ``i``'s relaxed orderings (``ase.Atoms``), best first."""
        if not -len(self) <= int(i) < len(self):
            raise IndexError(f"material {i} out of range: these results hold {len(self)}")
        return list(self._atoms[int(i) % len(self)])

    def best(self, i: int = 0) -> Any:
        """Material ``i``'s lowest-energy ordering (per atom), relaxed."""
        return self.structures(i)[0]

    def to_pandas(self) -> Any:
        """One row per relaxed ordering (see the class docstring)."""
        import pandas as pd

        return pd.DataFrame(self.rows, columns=list(COLUMNS))

    def write(self, directory: str | Path, format: str = "csv") -> list[Path]:
        """The table (``order.csv`` / ``.parquet``), ``order/<i>_<rank>_<formula>.cif``
        per ordering and ``order.settings.json`` (with each material's ordering counts)."""
        if format not in ("csv", "parquet"):
            raise ConfigError(f"order: table format must be 'csv' or 'parquet', got {format!r}")
        out = Path(directory)
        (out / self.name).mkdir(parents=True, exist_ok=True)
        path = out / f"{self.name}.{format}"
        table = self.to_pandas()
        table.to_csv(path, index=False) if format == "csv" else table.to_parquet(path, index=False)
        written = [path]
        for i, atoms_list in self._atoms.items():
            for rank, atoms in enumerate(atoms_list):
                cif = out / self.name / f"{i}_{rank}_{atoms.get_chemical_formula()}.cif"
                atoms.write(cif, format="cif")
                written.append(cif)
        settings = out / f"{self.name}.settings.json"
        counts = {"orderings": self.counts, "distinct": self.distinct, "sampled": self.sampled}
        settings.write_text(json.dumps(_plain({**self.settings, **counts}), indent=2))
        return [*written, settings]
