"""Per-run statistics of a results store several runs may have appended to: each run's
rows, wall time and throughput, and the campaign totals (``alchemi-lit report``).

A run's rows start at the ``first_row`` its entry of the store's ``runs`` attribute
records; its wall time comes from the ``stats`` the Simulator records (or, for older
stores, the CLI's ``summary``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def fmt_run(r: Mapping[str, Any]) -> str:
    """One line of a run's summary (systems, wall time, throughput, start, stages)."""
    parts = [f"{r['systems']} systems" if r.get("systems") is not None else "? systems"]
    if r.get("wall_time_s") is not None:
        parts.append(f"{r['wall_time_s']:.2f} s")
    else:
        parts.append("wall time not recorded")
    if r.get("atom_steps_per_s") is not None:
        parts.append(f"{r['atom_steps_per_s']:.3g} atom-steps/s")
    if r.get("resumed"):
        parts.append("resumed")
    head = ", ".join(parts)
    tail = [x for x in (r.get("started"), r.get("stages")) if x]
    return head + (" | " + " | ".join(tail) if tail else "")


def summarize_runs(
    runs: Sequence[Mapping[str, Any]], systems: Mapping[str, np.ndarray]
) -> dict[str, Any]:
    """Per-run statistics of a store's ``runs`` and the campaign totals.

    Returns ``{"runs": [...], "wall_time_s", "atom_steps_per_s", "systems_per_s",
    "wall_time_note"}`` (totals only where known).  Each run's rows are
    ``first_row`` up to the next run's; its wall time comes from ``stats`` (recorded by
    the Simulator) or, for older stores, the CLI's ``summary``.  Throughput is summed
    over runs with a wall time and known rows, not resumed ones (whose interrupted part
    has no recorded time).
    """
    n_rows = len(systems.get("energy", ()))
    starts = [r.get("first_row") for r in runs]
    n_atoms = systems.get("n_atoms")
    total_steps = systems.get("total_steps")
    per_run: list[dict[str, Any]] = []
    for i, run in enumerate(runs):
        stats = run.get("stats") or run.get("summary") or {}
        wall = stats.get("wall_time_s")
        lo = 0 if i == 0 else starts[i]  # the first run starts the store
        hi = n_rows if i + 1 == len(runs) else starts[i + 1]
        rows = (int(lo), int(hi)) if lo is not None and hi is not None else None
        rec: dict[str, Any] = {
            "index": i,
            "plan": run.get("plan"),
            "stages": " / ".join(run["stage_names"]) if run.get("stage_names") else None,
            "model": run.get("model"),
            "started": stats.get("started"),
            "ended": stats.get("ended"),
            "wall_time_s": float(wall) if wall else None,
            "resumed": bool(stats.get("resumed", False)),
            "rows": list(rows) if rows else None,
            "systems": rows[1] - rows[0] if rows else stats.get("systems"),
        }
        if rows and n_atoms is not None and total_steps is not None:
            sl = slice(*rows)
            rec["atom_steps"] = int(
                (n_atoms[sl].astype(np.int64) * total_steps[sl].astype(np.int64)).sum()
            )
            if rec["wall_time_s"] and not rec["resumed"]:
                rec["atom_steps_per_s"] = rec["atom_steps"] / rec["wall_time_s"]
        per_run.append(rec)
    out: dict[str, Any] = {"runs": per_run}
    timed = [r for r in per_run if r["wall_time_s"]]
    if timed:
        out["wall_time_s"] = sum(r["wall_time_s"] for r in timed)
        if len(timed) < len(per_run):
            out["wall_time_note"] = f"{len(per_run) - len(timed)} run(s) without a recorded time"
    rated = [r for r in timed if "atom_steps_per_s" in r]
    if rated:
        wall = sum(r["wall_time_s"] for r in rated)
        out["atom_steps_per_s"] = sum(r["atom_steps"] for r in rated) / wall
        out["systems_per_s"] = sum(r["systems"] for r in rated) / wall
    return out
