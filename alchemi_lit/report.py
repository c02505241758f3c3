"""Summaries and plots of finished runs: ``alchemi-lit report`` and the table after ``run``.

Everything here works from *per-system* arrays (``systems/*`` of a results store, or
the ``system`` fields of an in-memory batch): energies, atom counts, exit codes and
the per-stage history ``stage_steps`` / ``stage_exit`` (``[S, k]``, one column per
stage of the plan).  Per-atom data is never read, so a report of a store with
millions of atoms stays cheap.

Plots need matplotlib (optional dependency ``alchemi_lit[plots]``); it is imported
only when plots are asked for, with the Agg backend (no display needed):

* ``steps_per_stage.png``   histogram of the steps each system spent in each stage
  (for optimizer stages: steps to converge),
* ``energy_per_atom.png``   distribution of the final energy per atom,
* ``trajectory.png``        temperature and potential energy per atom against the
  step, for a few systems of a :class:`~alchemi_lit.callbacks.TrajectoryWriter` store
  (``--trajectory``).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ConfigError
from .state import EXIT_QUARANTINED, EXIT_REASONS

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
)


# ---------------------------------------------------------------------- reading
def stage_names_from_plan(plan: str | None, k: int) -> list[str]:
    """Stage labels (``"0:FIRE"``) from a stored plan repr; ``stage i`` if unknown."""
    found = re.findall(r"(\d+):(\w+)", plan or "")
    if len(found) == k:
        return [f"{c}:{n}" for c, n in found]
    return [f"stage {i}" for i in range(k)]


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
    if not str(group.attrs.get("schema", "")).startswith("alchemi_lit.results"):
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


# ---------------------------------------------------------------------- summary
def summarize(
    systems: Mapping[str, Any],
    stage_names: Sequence[str] | None = None,
    stats: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A JSON-ready summary of per-system results (see module docstring).

    ``stats`` (a run's ``Results.stats``: ``wall_time_s``, ``steps``, ``forward_calls``)
    adds wall time and throughput.
    """
    arr = {k: np.asarray(v.cpu() if hasattr(v, "cpu") else v) for k, v in systems.items()}
    n = len(arr["energy"]) if "energy" in arr else 0
    out: dict[str, Any] = {"systems": n}
    if n == 0:
        out.update(converged=0, quarantined=0, exit_reasons={}, stages=[])
    else:
        n_atoms = arr["n_atoms"].astype(np.int64)
        exit_code = arr["exit_code"].astype(np.int64)
        epa = arr["energy"].astype(np.float64) / np.maximum(n_atoms, 1)
        finite = np.isfinite(epa)
        reasons = Counter(EXIT_REASONS.get(int(c), f"code {int(c)}") for c in exit_code)
        out.update(
            converged=int(np.asarray(arr["converged"], dtype=bool).sum()),
            quarantined=int((exit_code == EXIT_QUARANTINED).sum()),
            exit_reasons=dict(sorted(reasons.items())),
            atoms=int(n_atoms.sum()),
            energy_per_atom={
                "mean": float(epa[finite].mean()) if finite.any() else None,
                "min": float(epa[finite].min()) if finite.any() else None,
                "max": float(epa[finite].max()) if finite.any() else None,
            },
        )
        stages = []
        steps2d = arr.get("stage_steps")
        exits2d = arr.get("stage_exit")
        if steps2d is not None and steps2d.ndim == 2:
            k = steps2d.shape[1]
            names = (
                list(stage_names)
                if stage_names and len(stage_names) == k
                else [f"stage {i}" for i in range(k)]
            )
            for j in range(k):
                col = steps2d[:, j].astype(np.int64)
                ex = exits2d[:, j] if exits2d is not None else np.zeros(n, dtype=np.int64)
                counts = Counter(EXIT_REASONS.get(int(c), f"code {int(c)}") for c in ex)
                stages.append(
                    {
                        "name": names[j],
                        "steps_mean": float(col.mean()),
                        "steps_max": int(col.max()),
                        "steps_total": int(col.sum()),
                        "exits": dict(sorted(counts.items())),
                    }
                )
        out["stages"] = stages
        if "total_steps" in arr:
            out["atom_steps"] = int((n_atoms * arr["total_steps"].astype(np.int64)).sum())
    if stats:
        wall = stats.get("wall_time_s")
        if wall:
            out["wall_time_s"] = float(wall)
            if out.get("atom_steps"):
                out["atom_steps_per_s"] = out["atom_steps"] / float(wall)
        for key in ("steps", "forward_calls"):
            if stats.get(key) is not None:
                out[f"loop_{key}"] = int(stats[key])
    return out


def _fmt_reasons(reasons: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in reasons.items()) or "none"


def summary_table(
    summary: Mapping[str, Any], title: str = "results", where: Sequence[str] = ()
) -> Any:
    """A two-column rich table of :func:`summarize` output (plus where results went)."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape(title), show_header=False, title_justify="left")
    table.add_column("what", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold")
    n = summary["systems"]
    table.add_row(
        "systems", f"{n}" + (f" ({summary['atoms']} atoms)" if summary.get("atoms") else "")
    )
    table.add_row("converged", f"{summary['converged']} / {n}")
    table.add_row("quarantined", str(summary["quarantined"]))
    table.add_row("exit reasons", _fmt_reasons(summary["exit_reasons"]))
    epa = summary.get("energy_per_atom")
    if epa and epa.get("mean") is not None:
        table.add_row(
            "energy / atom",
            f"mean {epa['mean']:.6f} eV (min {epa['min']:.6f}, max {epa['max']:.6f})",
        )
    for st in summary.get("stages", []):
        table.add_row(
            escape(f"steps {st['name']}"),
            f"mean {st['steps_mean']:.1f}, max {st['steps_max']} | {_fmt_reasons(st['exits'])}",
        )
    if summary.get("loop_steps") is not None:
        calls = summary.get("loop_forward_calls")
        table.add_row(
            "loop steps",
            f"{summary['loop_steps']}" + (f" ({calls} forward calls)" if calls else ""),
        )
    if summary.get("temperature_K") is not None:
        table.add_row(
            "temperature", f"{summary['temperature_K']:.1f} K (ThermoMonitor, last records)"
        )
    if summary.get("wall_time_s") is not None:
        table.add_row("wall time", f"{summary['wall_time_s']:.2f} s")
    if summary.get("atom_steps_per_s") is not None:
        table.add_row("throughput", f"{summary['atom_steps_per_s']:.3g} atom-steps/s")
    for line in where:
        table.add_row("output", escape(line))
    return table


# ---------------------------------------------------------------------- plots
def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise ConfigError(
            "plots need matplotlib, which is not installed: pip install 'alchemi_lit[plots]' "
            "(or matplotlib), or leave out --plots"
        ) from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def make_plots(
    systems: Mapping[str, np.ndarray],
    out_dir: str | Path,
    stage_names: Sequence[str] | None = None,
    trajectory: str | Path | None = None,
    max_traces: int = 8,
) -> list[Path]:
    """Write the PNG plots of the module docstring into ``out_dir``; returns their paths."""
    plt = _pyplot()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    if len(systems.get("energy", ())):
        steps2d = systems.get("stage_steps")
        if steps2d is not None and steps2d.ndim == 2:
            k = steps2d.shape[1]
            names = (
                list(stage_names)
                if stage_names and len(stage_names) == k
                else [f"stage {i}" for i in range(k)]
            )
            fig, axes = plt.subplots(1, k, figsize=(4.0 * k, 3.2), squeeze=False)
            for j, ax in enumerate(axes[0]):
                col = steps2d[:, j]
                lo, hi = int(col.min()), int(col.max())
                bins = np.arange(lo, hi + 2) - 0.5 if hi - lo < 40 else 40  # integer steps
                ax.hist(col, bins=bins, color="C0")
                ax.set_title(names[j])
                ax.set_xlabel("steps in stage")
                ax.set_ylabel("systems")
            fig.tight_layout()
            written.append(out / "steps_per_stage.png")
            fig.savefig(written[-1], dpi=110)
            plt.close(fig)
        epa = systems["energy"] / np.maximum(systems["n_atoms"], 1)
        epa = epa[np.isfinite(epa)]
        fig, ax = plt.subplots(figsize=(5.0, 3.2))
        ax.hist(epa, bins=min(50, max(5, len(epa) // 2)), color="C1")
        ax.set_xlabel("final energy per atom (eV)")
        ax.set_ylabel("systems")
        fig.tight_layout()
        written.append(out / "energy_per_atom.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    if trajectory is not None:
        written.append(plot_trajectory(trajectory, out / "trajectory.png", max_traces, plt))
    return written


def trajectory_series(path: str | Path, max_systems: int = 8) -> dict[int, dict[str, np.ndarray]]:
    """Per-system ``step``, ``T`` (K, NaN if not derivable) and ``epa`` (eV/atom, NaN if not
    written) from a TrajectoryWriter store, for the first ``max_systems`` systems."""
    from .callbacks.trajectory import read_trajectory, trajectory_system_ids

    p = Path(path)
    if not p.exists():
        raise ConfigError(f"trajectory store {str(p)!r} does not exist; check the path")
    series = {}
    for sid in trajectory_system_ids(p)[:max_systems].tolist():
        frames = read_trajectory(p, int(sid))
        step = np.asarray([a.info["step"] for a in frames], dtype=np.int64)
        temp, epa = [], []
        for a in frames:
            if "temperature" in a.info:
                temp.append(float(a.info["temperature"]))
            elif a.get_momenta().any():
                temp.append(float(a.get_temperature()))
            else:
                temp.append(np.nan)
            try:
                epa.append(float(a.get_potential_energy()) / len(a))
            except Exception:  # no energy written
                epa.append(np.nan)
        series[int(sid)] = {"step": step, "T": np.asarray(temp), "epa": np.asarray(epa)}
    return series


def plot_trajectory(
    path: str | Path, png: str | Path, max_systems: int = 8, plt: Any = None
) -> Path:
    """Temperature and energy per atom against step for a few systems of a trajectory."""
    plt = plt or _pyplot()
    series = trajectory_series(path, max_systems)
    fig, (ax_t, ax_e) = plt.subplots(2, 1, figsize=(6.0, 5.0), sharex=True)
    for sid, s in series.items():
        order = np.argsort(s["step"], kind="stable")
        ax_t.plot(s["step"][order], s["T"][order], lw=1, label=f"system {sid}")
        ax_e.plot(s["step"][order], s["epa"][order], lw=1)
    ax_t.set_ylabel("temperature (K)")
    ax_e.set_ylabel("E_pot / atom (eV)")
    ax_e.set_xlabel("step (of each system)")
    if series and len(series) <= 10:
        ax_t.legend(fontsize=7)
    fig.tight_layout()
    png = Path(png)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


# ---------------------------------------------------------------------- command
def report(
    store: str | Path,
    plots: str | Path | None = None,
    trajectory: str | Path | None = None,
    console: Any = None,
) -> dict[str, Any]:
    """``alchemi-lit report``: print the summary of a results store (and write plots)."""
    from rich.console import Console

    console = console or Console()
    systems = read_store_systems(store)
    runs = read_store_runs(store)
    last = runs[-1] if runs else {}
    k = systems["stage_steps"].shape[1] if "stage_steps" in systems else 0
    names = stage_names_from_plan(last.get("plan"), k)
    stats = last.get("summary") or {}
    summary = summarize(
        systems, names, {"wall_time_s": stats.get("wall_time_s")} if len(runs) == 1 else None
    )
    if len(runs) > 1:
        summary["runs"] = len(runs)
    where = [
        f"{store} ({len(runs)} run(s); last: plan {last.get('plan', '?')}, "
        f"model {last.get('model', '?')})"
    ]
    if plots is not None:
        for png in make_plots(systems, plots, names, trajectory):
            where.append(str(png))
    elif trajectory is not None:
        where.append(f"trajectory {trajectory}: pass --plots DIR to plot it")
    console.print(summary_table(summary, title=f"alchemi-lit report: {store}", where=where))
    return summary
