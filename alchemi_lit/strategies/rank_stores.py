"""What the ranks of a distributed run write and hand back, and how it is gathered.

Several sink ranks each write their own part of a results store (one writer per
store); rank 0 merges the parts into the store the user named, each system once,
streaming them a chunk at a time (:func:`~alchemi_lit.sinks.merge.copy_rows`, as
``alchemi-lit merge`` does for the stores of a job array).
In-memory results travel back to rank 0 as NumPy arrays.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..core.state import Batch
from ..io.results import Results
from ..sinks import HostMemory, ZarrSink
from ..sinks.merge import copy_rows

if TYPE_CHECKING:
    from ..simulator import Simulator


def part_path(path: Path, rank: int) -> Path:
    """The store rank ``rank`` writes when several ranks write ``path``."""
    return path.with_name(f"{path.stem}.rank{rank}{path.suffix}")


def rank_sinks(
    sinks: list[Any] | None, rank: int, several_writers: bool, keep: bool = False
) -> list[Any] | None:
    """Per-rank copies of the sinks: one zarr store per writing rank when several write."""
    if sinks is None:
        return None
    out = []
    for s in sinks:
        if isinstance(s, ZarrSink) and several_writers:
            part = part_path(s.path, rank)
            if part.exists() and not keep:  # on resume the part holds committed results
                shutil.rmtree(part)
            z = ZarrSink(
                part, mode="w", flush_every=s.flush_every, flush_seconds=s.flush_seconds,
                shards=s.shards,
            )  # fmt: skip
            z.final_path, z.final_mode = s.path, s.mode
            z.final_continuing = s.continuing
            out.append(z)
        elif isinstance(s, HostMemory):
            out.append(HostMemory(s.capacity))
        else:
            out.append(s)
    return out


def merge_stores(sim: Simulator, gathered: list[Any], several_writers: bool) -> None:
    if not several_writers or not sim.sinks:
        return
    for s in sim.sinks:
        if not isinstance(s, ZarrSink) or not hasattr(s, "final_path"):
            continue
        parts = sorted(
            {
                p
                for g in gathered
                for p in g["stores"]
                if Path(p).name.startswith(s.final_path.stem + ".rank")
            }
        )
        merge_parts(
            sim, s.final_path, s.final_mode, parts, remove=True, continuing=s.final_continuing,
            like=s,
        )  # fmt: skip


def merge_parts(
    sim: Simulator,
    final_path: Path,
    mode: str,
    parts: list[str],
    remove: bool,
    continuing: bool = False,
    like: ZarrSink | None = None,
) -> int:
    """Stream the committed systems of the per-rank ``parts`` into one store at
    ``final_path``, as one run (``continuing``: append to the run the store holds, see
    ZarrSink.continue_run); returns how many systems were merged.  ``like``: the sink
    the user configured (its flush and shard settings).  The copy is
    :func:`~alchemi_lit.sinks.merge.copy_rows`, the one ``alchemi-lit merge`` uses:
    a chunk at a time, so the merge's memory does not grow with the run."""
    final = ZarrSink(final_path, mode=mode, shards=None if like is None else like.shards)
    if continuing:
        final.continue_run()
    final.open(sim.run_info())
    n = 0
    try:
        for p in parts:
            if Path(p).exists():
                n += copy_rows(p, final)
    finally:
        final.close()
    if remove:
        for p in parts:
            shutil.rmtree(p, ignore_errors=True)
    return n


def to_numpy(batch: Batch) -> dict[str, Any]:
    return {
        "atom": {k: v.detach().cpu().numpy() for k, v in batch.atom.items()},
        "system": {k: v.detach().cpu().numpy() for k, v in batch.system.items()},
        "info": batch.info,
    }


def from_numpy(data: dict[str, Any]) -> Batch:
    return Batch(
        {k: torch.from_numpy(v) for k, v in data["atom"].items()},
        {k: torch.from_numpy(v) for k, v in data["system"].items()},
        data.get("info"),
    )


def results_from(gathered: list[Any] | None, sim: Simulator) -> Results:
    if not gathered:
        return Results(None)
    parts = [from_numpy(g["systems"]) for g in gathered if g and g["systems"] is not None]
    batch = Batch.concatenate(parts) if len(parts) > 1 else (parts[0] if parts else None)
    stats = {"ranks": [g["stats"] for g in gathered]}
    stats["systems"] = sum(g["stats"]["systems_out"] for g in gathered if g["stats"]["is_sink"])
    stats["wall_time_s"] = max(float(g["stats"]["wall_s"]) for g in gathered if g)
    return Results(batch, stats, sim.sinks or [])
