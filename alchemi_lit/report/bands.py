"""The report of a run of nudged elastic bands: one row per band.

A results store holds one row per image; the images of a band share
``info["path_id"]`` and follow each other in ``system_id`` order.  Per band the report
gives the forward and backward barrier, the reaction energy, the highest image and the
band's status, from the images' energies and exit codes alone -- per-system arrays, as
the rest of the report, so it stays cheap -- with the definitions of
:class:`~alchemi_lit.io.bands.Band` (ASE's), so it agrees with ``results.bands()``.
The fitted barrier (ASE's ``NEBTools`` fit) needs the forces, per-atom data: it is in
``results.bands().to_pandas()``, not here.  ``neb_paths.png`` draws the energy along
each path (:func:`~alchemi_lit.report.plots.plot_band_paths`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..core.info_codec import info_from_json
from ..core.state import EXIT_REASONS
from ..data.bands import PATH_KEY
from ..io.bands import band_status, barriers, highest_image

#: bands shown in the printed table (all of them are in the summary)
TABLE_ROWS = 30
FAILED = ("non_finite", "model_error")


def store_paths(store: str | Path, rows: int) -> np.ndarray:
    """``info["path_id"]`` of the first ``rows`` systems of a results store (-1 outside a
    band); only the texts that mention a path are decoded."""
    import zarr

    group = zarr.open_group(str(store), mode="r")
    out = np.full(rows, -1, dtype=np.int64)
    if "systems/info" not in group or not rows:
        return out
    for k, text in enumerate(np.asarray(group["systems/info"][:rows]).tolist()):
        if text and PATH_KEY in text:
            p = info_from_json(str(text)).get(PATH_KEY)
            out[k] = -1 if p is None else int(p)
    return out


def band_rows(systems: Mapping[str, np.ndarray], paths: np.ndarray) -> list[dict[str, Any]]:
    """One summary per band (in ``path_id`` order): images, barriers, reaction energy,
    highest image and energy, converged, exit reason, the energies along the path."""
    ids = np.asarray(systems["system_id"])
    out = []
    for p in sorted(set(paths[paths >= 0].tolist())):
        rows = np.flatnonzero(paths == p)
        rows = rows[np.argsort(ids[rows], kind="stable")]
        e = np.asarray(systems["energy"], dtype=np.float64)[rows]
        inner = rows[1:-1]
        reasons = [EXIT_REASONS.get(int(c), f"code {int(c)}") for c in systems["exit_code"][inner]]
        converged, reason = band_status(np.asarray(systems["converged"])[inner], reasons)
        top = highest_image(e) if len(e) > 2 else 0
        forward, backward = barriers(e)
        out.append({
            "path_id": int(p), "n_images": len(rows), "forward_barrier": forward,
            "backward_barrier": backward, "reaction_energy": float(e[-1] - e[0]),
            "highest_image": int(top), "highest_energy": float(e[top]),
            "converged": converged, "exit_reason": reason, "energies": e.tolist(),
        })  # fmt: skip
    return out


def band_counts(rows: Sequence[Mapping[str, Any]]) -> str:
    """``"8 (5 converged, 2 max_steps, 1 non_finite)"``."""
    reasons = Counter("converged" if r["converged"] else r["exit_reason"] for r in rows)
    return f"{len(rows)} (" + ", ".join(f"{n} {k}" for k, n in sorted(reasons.items())) + ")"


def bands_table(rows: Sequence[Mapping[str, Any]], limit: int = TABLE_ROWS) -> Any:
    """A rich table, one row per band (the first ``limit``; a last row says how many more)."""
    from rich.table import Table

    table = Table(title=f"bands: {band_counts(rows)}", title_justify="left")
    for name in ("path_id", "images", "forward barrier (eV)", "backward barrier (eV)",
                 "reaction energy (eV)", "highest image", "status"):  # fmt: skip
        table.add_column(name, justify="left" if name == "status" else "right")
    for r in rows[:limit]:
        status = "converged" if r["converged"] else r["exit_reason"]
        if r["exit_reason"] in FAILED:
            status = f"quarantined ({r['exit_reason']})"
        table.add_row(
            str(r["path_id"]), str(r["n_images"]), _ev(r["forward_barrier"]),
            _ev(r["backward_barrier"]), _ev(r["reaction_energy"]), f"{r['highest_image']}", status,
        )  # fmt: skip
    if len(rows) > limit:
        table.add_row("...", "", "", "", "", "", f"{len(rows) - limit} more bands")
    return table


def _ev(value: float) -> str:
    """Four decimals, without a ``-0.0000`` for a tiny negative."""
    text = f"{value:.4f}"
    return text[1:] if text == "-0.0000" else text
