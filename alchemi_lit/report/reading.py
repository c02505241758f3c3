"""Reading what a summary needs from a results store: per-system columns (never the
per-atom data) and the ``runs`` records, with the stage labels they carry."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import ConfigError

#: Per-system arrays a summary uses (others are ignored).
SUMMARY_COLUMNS = (
    "system_id",
    "energy",
    "n_atoms",
    "converged",
    "exit_code",
    "total_steps",
    "stage_steps",
    "stage_exit",
    "stage_energy",
    "stage_volume",
    "stage_pressure",
)


def stage_names_from_plan(plan: str | None, k: int) -> list[str]:
    """Stage labels (``"0:FIRE"``) from a stored plan repr; ``stage i`` if unknown.

    For stores written before runs recorded ``stage_names``.  A fused plan's labels
    carry its status codes; a pipeline's ranks each number their codes from 0, so its
    labels are history columns (replicas repeat the base plan: its first ``k`` stages).
    """
    found = re.findall(r"(\d+):(\w+)", plan or "")
    if (plan or "").startswith("Pipeline(") and k and found and len(found) % k == 0:
        return [f"{c}:{n}" for c, (_, n) in enumerate(found[:k])]
    if len(found) == k:
        return [f"{c}:{n}" for c, n in found]
    return [f"stage {i}" for i in range(k)]


def stage_names_of_run(run: Mapping[str, Any], k: int) -> list[str]:
    """Labels of the ``k`` history columns of a stored run (its ``stage_names``, else
    parsed from its plan)."""
    names = run.get("stage_names")
    if isinstance(names, list) and len(names) == k:
        return [str(n) for n in names]
    return stage_names_from_plan(run.get("plan"), k)


def read_store_systems(path: str | Path, start: int = 0) -> dict[str, np.ndarray]:
    """Committed per-system rows ``start:`` of a results store (only the summary columns)."""
    import zarr

    p = Path(path)
    if not p.exists():
        raise ConfigError(f"results store {str(p)!r} does not exist; check the path")
    try:
        group = zarr.open_group(str(p), mode="r")
    except Exception as exc:  # not a zarr store at all
        raise ConfigError(
            f"{str(p)!r} is not a zarr results store ({type(exc).__name__}: {exc})"
        ) from exc
    if not str(group.attrs.get("schema", "")).startswith("alchemi_lit.io.results"):
        raise ConfigError(
            f"{str(p)!r} is not an alchemi_lit results store (schema "
            f"{group.attrs.get('schema')!r}); pass the store a ZarrSink wrote"
        )
    n = int(group.attrs.get("n_systems", 0))
    out: dict[str, np.ndarray] = {}
    for name in SUMMARY_COLUMNS:
        key = f"systems/{name}"
        if n > start and key in group:
            out[name] = np.asarray(group[key][start:n])
    return out


def read_store_runs(path: str | Path) -> list[dict[str, Any]]:
    """The ``runs`` attribute of a results store: one entry per run that wrote to it."""
    import zarr

    return list(zarr.open_group(str(path), mode="r").attrs.get("runs", []))
