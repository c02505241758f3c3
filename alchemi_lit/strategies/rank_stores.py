"""What the ranks of a distributed run write and hand back, and how it is gathered.

Several sink ranks each write their own part of a results store (one writer per
store); rank 0 merges the parts into the store the user named, each system once.
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
            z = ZarrSink(part, mode="w")
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
            sim, s.final_path, s.final_mode, parts, remove=True, continuing=s.final_continuing
        )


def merge_parts(
    sim: Simulator,
    final_path: Path,
    mode: str,
    parts: list[str],
    remove: bool,
    continuing: bool = False,
) -> int:
    """Write the committed systems of the per-rank ``parts`` into one store at
    ``final_path`` (``system_id`` order; ``continuing``: append to the run the store
    holds, see ZarrSink.continue_run); returns how many systems were merged."""
    batches = [
        b for p in parts if Path(p).exists() for b in [ZarrSink(p).read_batch()] if b is not None
    ]
    final = ZarrSink(final_path, mode=mode)
    if continuing:
        final.continue_run()
    final.open(sim.run_info())
    n = 0
    if batches:
        merged = Batch.concatenate(batches)
        final.write(merged.select(torch.argsort(merged.system_id, stable=True)))
        n = merged.num_systems
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
