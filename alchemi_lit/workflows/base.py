"""What every property workflow returns: one row per material, plus the full objects.

A materials scientist reads a campaign as a table (``to_pandas()``: one row per input
structure, NaN and a reason where a material failed) and continues with the field's own
objects for one material (ASE's ``EquationOfState``, phonopy's ``Phonopy``).  Both views
come from the same per-material records, so they cannot disagree.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..core.errors import ConfigError
from .jobs import JobRun
from .prerelax import COLUMNS as PRERELAX_COLUMNS

#: the columns every workflow table starts with
LEAD_COLUMNS = ("material", "formula", "n_atoms")


class MaterialResults:
    """Results of one workflow over many materials (subclasses name the columns).

    ``to_pandas()``: one row per material, in input order: ``material`` (input index),
    ``formula``, ``n_atoms``, the workflow's columns, ``error`` (missing -- None or
    NaN, as pandas stores it -- or why the material has no values: a failed job or fit;
    the others still finished) and ``source_file``.  ``jobs``: the run's raw per-job results
    (:class:`~alchemi_lit.io.results.Results` in ``jobs.results``); with a
    pre-relaxation (``prerelax=``) the table also has :data:`~.prerelax.COLUMNS`.
    ``write(dir)`` saves the table and per-material files.
    """

    #: the workflow's own columns, after :data:`LEAD_COLUMNS`
    columns: ClassVar[tuple[str, ...]] = ()
    #: the workflow's name in file names and messages
    name: ClassVar[str] = "workflow"

    def __init__(
        self,
        structures: Sequence[Any],
        values: list[dict[str, Any]],
        errors: list[str | None],
        jobs: JobRun,
        settings: dict[str, Any],
        symmetry: list[dict[str, Any]] | None = None,
    ) -> None:
        self.structures = list(structures)
        self.values = values
        self.errors = errors
        self.jobs = jobs
        #: the workflow's parameters (strains, supercells, tolerances ...), as given
        self.settings = settings
        #: per material, the pre-relaxation's space groups and convergence (None: none ran)
        self.symmetry = symmetry

    def __len__(self) -> int:
        return len(self.structures)

    def __repr__(self) -> str:
        failed = sum(e is not None for e in self.errors)
        calls = self.jobs.results.stats.get("forward_calls")
        return (
            f"{type(self).__name__}(materials={len(self)}, failed={failed}, "
            f"jobs={len(self.jobs.jobs)}, forward_calls={calls})"
        )

    @property
    def failed(self) -> dict[int, str]:
        """Material index -> why it has no values."""
        return {i: e for i, e in enumerate(self.errors) if e is not None}

    def _check(self, i: int) -> int:
        if not -len(self) <= int(i) < len(self):
            raise IndexError(f"material {i} out of range: these results hold {len(self)}")
        i = int(i) % len(self)
        if self.errors[i] is not None:
            raise ValueError(f"material {i} has no {self.name} results: {self.errors[i]}")
        return i

    def to_pandas(self) -> Any:
        """One row per material (see the class docstring)."""
        import pandas as pd

        rows = []
        for i, atoms in enumerate(self.structures):
            row: dict[str, Any] = {
                "material": i,
                "formula": atoms.get_chemical_formula(),
                "n_atoms": len(atoms),
            }
            row.update({c: self.values[i].get(c, np.nan) for c in self.columns})
            if self.symmetry is not None:
                row.update(self.symmetry[i])
            row["error"] = self.errors[i]
            row["source_file"] = atoms.info.get("source_file")
            rows.append(row)
        extra = PRERELAX_COLUMNS if self.symmetry is not None else ()
        columns = [*LEAD_COLUMNS, *self.columns, *extra, "error", "source_file"]
        return pd.DataFrame(rows, columns=columns)

    def write(self, directory: str | Path, format: str = "csv") -> list[Path]:
        """Write the table (``<name>.csv`` or ``.parquet``, through pandas) and one file
        per material (``<name>/<i>_<formula>.*``); returns the paths written."""
        if format not in ("csv", "parquet"):
            raise ConfigError(
                f"{self.name}: table format must be 'csv' or 'parquet', got {format!r}"
            )
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        table = self.to_pandas()
        path = out / f"{self.name}.{format}"
        if format == "csv":
            table.to_csv(path, index=False)
        else:
            try:
                table.to_parquet(path, index=False)
            except ImportError as exc:  # pandas needs pyarrow (or fastparquet) for parquet
                raise ConfigError(
                    f"{self.name}: parquet tables need pyarrow, which is not installed: "
                    f"pip install pyarrow, or write format='csv'"
                ) from exc
        written = [path]
        folder = out / self.name
        folder.mkdir(exist_ok=True)
        for i, atoms in enumerate(self.structures):
            if self.errors[i] is None:
                stem = folder / f"{i}_{atoms.get_chemical_formula()}"
                written.extend(self.write_material(i, stem))
        settings = out / f"{self.name}.settings.json"
        settings.write_text(json.dumps(_plain(self.settings), indent=2))
        written.append(settings)
        return written

    def write_material(self, i: int, stem: Path) -> list[Path]:
        """Write material ``i``'s own files next to ``stem`` (a path without suffix)."""
        path = stem.with_suffix(".json")
        path.write_text(json.dumps(_plain(self.record(i)), indent=2))
        return [path]

    def record(self, i: int) -> dict[str, Any]:
        """Material ``i``'s values and data, as plain numbers and lists (its JSON file)."""
        return dict(self.values[i])


def _plain(value: Any) -> Any:
    """``value`` with numpy arrays and scalars as lists and numbers (for JSON)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value
