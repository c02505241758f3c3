"""The zarr store of the MD observables (:mod:`alchemi_lit.callbacks.observables`): one
row per finished system, one group per observable.

Layout (zarr v3)::

    <path>/                      attrs: format = "alchemi_lit.observables", version
      <name>/                    one observable (rdf, msd, vacf, averages); attrs: rows
                                 (the commit marker), meta (its settings, the names of
                                 its partial RDFs or quantities ...)
        system_id   [S]          int64
        <key>       [S, ...]     one array per result (g [S, 1 + P, nbins], D [S] ...)

Rows past ``attrs["rows"]`` are uncommitted (a write interrupted mid-way) and ignored;
the next append overwrites them, and a run resumed from a checkpoint cuts the store back
to the rows the checkpoint counted.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "alchemi_lit.observables"
VERSION = 1


def append_rows(
    path: str | os.PathLike[str], name: str, rows: list[dict[str, Any]], meta: dict[str, Any]
) -> int:
    """Append ``rows`` (dicts of numbers and arrays, the same keys and shapes) to group
    ``name`` of the store at ``path`` (created if absent); returns the committed rows."""
    import zarr

    root = zarr.open_group(str(path), mode="a")
    if root.attrs.get("format") not in (None, FORMAT):
        raise ValueError(f"{path} is a zarr store but not an alchemi_lit observables store")
    root.attrs.update(format=FORMAT, version=VERSION)
    group = root.require_group(name)
    start = int(group.attrs.get("rows", 0))
    if not rows:
        return start
    group.attrs["meta"] = meta
    for key in rows[0]:
        data = np.stack([np.asarray(r[key]) for r in rows])
        if data.dtype.kind == "f":
            data = data.astype(np.float64)
        end = start + len(data)
        if key in group:
            arr = group[key]
            if tuple(arr.shape[1:]) != data.shape[1:]:
                raise ValueError(
                    f"{path}/{name}/{key} holds rows of shape {tuple(arr.shape[1:])}, this run "
                    f"writes {data.shape[1:]}; write to a new store (path=...)"
                )
            arr.resize((end, *arr.shape[1:]))
        else:
            arr = group.create_array(key, shape=(end, *data.shape[1:]), dtype=data.dtype,
                                     chunks=(max(256, len(data)), *data.shape[1:]))  # fmt: skip
        arr[start:end] = data
    group.attrs["rows"] = start + len(rows)  # commit marker last
    return start + len(rows)


def truncate(path: str | os.PathLike[str], counts: dict[str, int]) -> None:
    """Cut each group ``name`` back to ``counts[name]`` committed rows (a resume)."""
    import zarr

    if not Path(path).exists():
        return
    root = zarr.open_group(str(path), mode="a")
    for name, n in counts.items():
        if name in root:
            group = root[name]
            group.attrs["rows"] = min(int(group.attrs.get("rows", 0)), int(n))


def read_observables(path: str | os.PathLike[str], name: str) -> dict[str, np.ndarray]:
    """The committed rows of observable ``name`` (``"rdf"``, ``"msd"``, ``"vacf"``,
    ``"averages"``) as NumPy arrays, with ``attrs["meta"]`` under ``"meta"``."""
    import zarr

    root = zarr.open_group(str(path), mode="r")
    if root.attrs.get("format") != FORMAT:
        raise ValueError(f"{path} is not an alchemi_lit observables store")
    if name not in root:
        raise KeyError(f"{path} holds no observable {name!r}; it holds {sorted(root.group_keys())}")
    group = root[name]
    n = int(group.attrs.get("rows", 0))
    out: dict[str, Any] = {key: np.asarray(arr[:n]) for key, arr in group.arrays()}
    out["meta"] = dict(group.attrs.get("meta", {}))
    return out


__all__ = ["FORMAT", "VERSION", "append_rows", "read_observables", "truncate"]
