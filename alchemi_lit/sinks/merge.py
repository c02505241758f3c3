"""Join results stores into one, each system exactly once: shards of a job array, the
per-rank parts of a distributed run.

Both go through :func:`copy_rows`, which streams a store's committed systems into an
open :class:`~alchemi_lit.sinks.ZarrSink` a chunk at a time, so a merge holds one
chunk in memory whatever the stores' sizes.

:func:`merge_stores` (``alchemi-lit merge OUT IN...``) is resumable and exactly-once:

* a ``system_id`` held by several inputs (or already by the output) is stored once when
  its rows are identical -- a shard merged again under another name, a store copied --
  and refused, naming the ids and both stores, when they differ (two shards that computed
  the same system differently: another config or seed; which one is right is not ours to
  guess).  Everything is checked before the first row is written;
* each input merged is recorded in the output's ``merged`` attribute (its path, an
  identity digest of its commit marker and runs, the rows it gave), so a rerun skips it;
* before an input is copied, the output's commit marker is recorded in
  ``merge_pending``; a merge killed half-way through an input is rolled back to it by
  the next merge, which then copies that input again -- nothing is doubled;
* the inputs are only read, never changed or removed.

Each run entry of an input becomes a run entry of the output (with ``merged_from``), so
per-shard statistics and summaries stay with their rows (``read_results(out, run=k)``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from loguru import logger

from ..core.errors import ConfigError
from ..core.state import Batch
from ..io.results_store import stored_system_ids
from ..io.store_reader import SCHEMA, iter_store_batches, open_store, read_rows
from .base import id_list
from .zarr import ZarrSink

#: systems per chunk a merge reads and writes
CHUNK_SYSTEMS = 4096
#: chunks per shard file of a merged store (written in large sequential pieces)
MERGE_SHARDS = 16


def copy_rows(
    src: str | Path,
    sink: ZarrSink,
    rows: tuple[int, int] | None = None,
    skip: np.ndarray | None = None,
    chunk_systems: int = CHUNK_SYSTEMS,
) -> int:
    """Stream the committed systems of store ``src`` (rows ``[first, end)`` when given)
    into the open ``sink``, leaving out the ``system_id``\\ s in ``skip``; returns how
    many were written."""
    n = 0
    for batch in iter_store_batches(src, chunk_systems, rows=rows):
        if skip is not None and len(skip):
            keep = ~np.isin(batch.system_id.numpy(), skip)
            if not keep.all():
                batch = batch.select(torch.from_numpy(np.flatnonzero(keep)))
        if batch.num_systems:
            sink.write(batch)
            sink.flush()
            n += batch.num_systems
    return n


def store_identity(path: str | Path) -> str:
    """A digest of a store's commit marker and run records: the same store (or a copy of
    it) has the same identity, one that gained systems has another."""
    attrs = open_store(path).attrs
    key = {k: attrs.get(k) for k in ("n_systems", "n_atoms", "runs")}
    text = json.dumps(key, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def merge_stores(
    out: str | Path, inputs: Sequence[str | Path], chunk_systems: int = CHUNK_SYSTEMS
) -> dict[str, Any]:
    """Merge the results stores ``inputs`` into ``out`` (created if missing, else
    appended to), each system once; see the module docstring for duplicates, resuming
    and what is recorded.  Returns ``{"systems": rows written, "merged": [...],
    "skipped": [inputs merged before], "duplicates": identical rows left out}``."""
    out = Path(out)
    paths = _check_inputs(out, inputs)
    _roll_back_pending(out)
    done = {m["identity"] for m in _attrs(out).get("merged", [])} if out.exists() else set()
    todo, skipped = [], []
    for p in paths:
        identity = store_identity(p)
        if identity in done:
            skipped.append(str(p))
            logger.info(f"merge: {p} is already merged into {out}; skipped")
        elif identity not in {i for _, i in todo}:
            todo.append((p, identity))
    skips = _plan(out, [p for p, _ in todo])  # refuses conflicting rows before any write
    report: dict[str, Any] = {"systems": 0, "merged": [], "skipped": skipped, "duplicates": 0}
    for (path, identity), skip in zip(todo, skips):
        record = _merge_one(out, path, identity, skip, chunk_systems)
        report["systems"] += record["systems"]
        report["duplicates"] += record["duplicates"]
        report["merged"].append(record)
    return report


def _check_inputs(out: Path, inputs: Sequence[str | Path]) -> list[Path]:
    """The inputs as paths (each once): existing results stores, the output not among
    them."""
    if not inputs:
        raise ConfigError("merge: no input stores given; name the stores to merge")
    named = {Path(p).resolve(): Path(p) for p in reversed(inputs)}  # each once, first name
    paths = [named[k] for k in dict.fromkeys(Path(p).resolve() for p in inputs)]
    for p in paths:
        group = open_store(p)  # (a missing one is named)
        if group.attrs.get("schema") != SCHEMA:
            raise ConfigError(
                f"merge: {str(p)!r} is not an alchemi_lit results store (schema "
                f"{group.attrs.get('schema')!r}); merge stores a ZarrSink wrote"
            )
        if out.exists() and p.resolve() == out.resolve():
            raise ConfigError(f"merge: the output {str(out)!r} is also an input; drop it")
    if out.exists() and open_store(out).attrs.get("schema") != SCHEMA:
        raise ConfigError(
            f"merge: the output {str(out)!r} exists and is not a results store; choose "
            f"another output path"
        )
    return paths


def _attrs(path: Path) -> dict[str, Any]:
    return dict(open_store(path).attrs)


def _roll_back_pending(out: Path) -> None:
    """Undo the rows of a merge that was interrupted while copying an input."""
    if not out.exists():
        return
    import zarr

    group = zarr.open_group(str(out), mode="r+")
    pending = group.attrs.get("merge_pending")
    if not pending:
        return
    runs = list(group.attrs.get("runs", []))[: int(pending["runs"])]
    group.attrs.update(
        n_systems=int(pending["n_systems"]),
        n_atoms=int(pending["n_atoms"]),
        runs=runs,
        merge_pending=None,
    )
    logger.warning(
        f"merge: the merge of {pending['path']} into {out} was interrupted; its partial "
        f"rows were rolled back and it is merged again"
    )


def _plan(out: Path, paths: list[Path]) -> list[np.ndarray]:
    """Per input, the ids to leave out (held identically by the output or an earlier
    input); raises for ids held differently, or twice within one store."""
    sources = ([out] if out.exists() else []) + paths
    ids = [stored_system_ids(p) for p in sources]
    for p, i in zip(sources, ids):
        if len(np.unique(i)) != len(i):
            raise ConfigError(
                f"merge: {str(p)!r} holds some system_id(s) more than once (runs that "
                f"appended to it numbered their systems alike); merge a store whose ids "
                f"are unique"
            )
    first = 1 if out.exists() else 0
    skips = []
    seen = ids[0] if first else np.zeros(0, dtype=np.int64)
    owner = np.zeros(len(seen), dtype=np.int64)
    for k in range(first, len(sources)):
        common = np.intersect1d(ids[k], seen)
        if len(common):
            _refuse_conflicts(sources, ids, owner, seen, k, common)
        skips.append(common)
        fresh = np.setdiff1d(ids[k], seen)
        seen = np.concatenate([seen, fresh])
        owner = np.concatenate([owner, np.full(len(fresh), k)])
    return skips


def _refuse_conflicts(
    sources: list[Path],
    ids: list[np.ndarray],
    owner: np.ndarray,
    seen: np.ndarray,
    k: int,
    common: np.ndarray,
) -> None:
    """Raise when a system of ``sources[k]`` that an earlier source holds differs there."""
    order = np.argsort(seen)
    where = owner[order][np.searchsorted(seen[order], common)]
    for j in np.unique(where):
        both = common[where == j]
        a = _rows_of(sources[j], ids[j], both)
        b = _rows_of(sources[k], ids[k], both)
        differ = [int(s) for s in both if not _same_system(a, b, int(s))]
        if differ:
            raise ConfigError(
                f"merge: system_id(s) {id_list(differ)} ({len(differ)} systems) are in both "
                f"{str(sources[j])!r} and {str(sources[k])!r} with different results (runs "
                f"of other configs or seeds?); merge only one of them, or give the runs "
                f"distinct system_ids; nothing was merged (every input is checked first)"
            )


def _rows_of(path: Path, ids: np.ndarray, wanted: np.ndarray) -> dict[int, Batch]:
    """The systems ``wanted`` of a store, one Batch each, by id."""
    group = open_store(path)
    rows = np.flatnonzero(np.isin(ids, wanted))
    # a row at a time: duplicates are few, and memory stays small when they are not
    return {int(ids[r]): read_rows(group, int(r), int(r) + 1) for r in rows}


def _same_system(a: dict[int, Batch], b: dict[int, Batch], sid: int) -> bool:
    """Whether two stored rows of system ``sid`` hold the same results, field by field
    (bitwise; NaN equal to NaN: a system never evaluated) and the same info."""
    x, y = a[sid], b[sid]
    for name in sorted(set(x.atom) | set(x.system) | set(y.atom) | set(y.system)):
        u = x.atom.get(name, x.system.get(name))
        v = y.atom.get(name, y.system.get(name))
        if u is None or v is None or u.shape != v.shape:
            return False
        if not np.array_equal(u.numpy(), v.numpy(), equal_nan=u.dtype.is_floating_point):
            return False
    return x.info.get(sid) == y.info.get(sid)


def _merge_one(
    out: Path, path: Path, identity: str, skip: np.ndarray, chunk_systems: int
) -> dict[str, Any]:
    """Copy one input run by run, between a pending record and the merged record."""
    import zarr

    if not out.exists():  # an empty store first: the pending record needs a home
        group = zarr.open_group(str(out), mode="w")
        group.attrs.update(schema=SCHEMA, n_systems=0, n_atoms=0, runs=[])
    before = _attrs(out)
    pending = {
        "path": str(path), "identity": identity, "n_systems": int(before.get("n_systems", 0)),
        "n_atoms": int(before.get("n_atoms", 0)), "runs": len(before.get("runs", [])),
    }  # fmt: skip
    zarr.open_group(str(out), mode="r+").attrs["merge_pending"] = pending
    written = 0
    for run, rows in _runs_of(path):
        sink = ZarrSink(out, mode="a", flush_every=1, shards=MERGE_SHARDS)
        sink.open({**run, "merged_from": str(path)})
        try:
            written += copy_rows(path, sink, rows, skip, chunk_systems)
        finally:
            sink.close()
    group = zarr.open_group(str(out), mode="r+")
    record = {
        "path": str(path), "identity": identity, "systems": written,
        "duplicates": len(skip), "first_row": pending["n_systems"],
    }  # fmt: skip
    merged = [*group.attrs.get("merged", []), record]
    group.attrs.update(merged=merged, merge_pending=None)  # one write: the commit
    logger.info(
        f"merge: {written} systems of {path} into {out}"
        + (f" ({len(skip)} already there, identical: left out)" if len(skip) else "")
    )
    return record


def _runs_of(path: Path) -> Iterable[tuple[dict[str, Any], tuple[int, int] | None]]:
    """(run entry without its row bookkeeping, its rows) for each run of a store; the
    whole store as one run when its runs do not record where they start."""
    attrs = _attrs(path)
    runs = list(attrs.get("runs", [])) or [{}]
    n = int(attrs.get("n_systems", 0))
    starts = [r.get("first_row") for r in runs]
    if any(s is None for s in starts):
        yield {"runs": runs}, None
        return
    ends = [*starts[1:], n]
    for run, lo, hi in zip(runs, starts, ends):
        entry = {k: v for k, v in run.items() if k != "first_row"}
        yield entry, (int(lo), int(hi))
