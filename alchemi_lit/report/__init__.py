"""Summaries and plots of finished runs: ``alchemi-lit report`` and the table after ``run``.

Everything here works from *per-system* arrays (``systems/*`` of a results store, or
the ``system`` fields of an in-memory batch): energies, atom counts, exit codes and
the per-stage history ``stage_steps`` / ``stage_exit`` / ``stage_energy`` /
``stage_volume`` / ``stage_pressure`` (``[S, k]``, one column per stage of the plan:
steps spent, why it was left, energy, cell volume and pressure when it was left).
Per-atom data is never read, so a report of a store with millions of atoms stays cheap.

Per stage the summary gives the steps and exit reasons, and at stage exit the energy
per atom, the volume per atom (Å^3) and the pressure (GPa) -- mean, standard deviation,
min, max -- over the systems that left the stage (quarantined systems never leave
theirs; volume and pressure over the periodic ones, the pressure where the run computed
the stress).  Stage labels come from the ``stage_names``
each run records in the store (``"code:Name"`` for fused plans, ``"column:Name"``
across a pipeline's ranks; a column the runs of a store named differently lists their
names, ``"0:FIRE|0:Langevin"``); older stores fall back to parsing the stored plan.

Wall time and throughput come from the ``stats`` the Simulator records in each run's
entry of the store's ``runs`` attribute (API and CLI runs alike).  A store several runs
appended to reports each run and the totals (:mod:`alchemi_lit.report.runs`).

A run of nudged elastic bands also gets one row per band -- barriers, reaction energy,
highest image, status (:mod:`alchemi_lit.report.bands`) -- and a plot of the energy
along each path.

Plots (``--plots``) are drawn by :mod:`alchemi_lit.report.plots`, with matplotlib (the
optional ``plots`` extra), imported only when plots are asked for.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..core.environment import describe as describe_environment
from ..core.fields import FAILED_EXITS
from ..core.state import (
    EXIT_COMPLETED,
    EXIT_CONVERGED,
    EXIT_MAX_STEPS,
    EXIT_REASONS,
    EXIT_RUNNING,
)
from ..core.units import GPa
from ..io.results_store import merged_stage_names
from .bands import band_rows, bands_table, store_paths
from .plots import make_plots, plot_band_paths
from .plots import plot_trajectory as plot_trajectory  # public here too
from .plots import trajectory_series as trajectory_series
from .reading import SUMMARY_COLUMNS as SUMMARY_COLUMNS  # (public here too, as before)
from .reading import read_store_runs as read_store_runs
from .reading import read_store_systems as read_store_systems
from .reading import stage_names_from_plan as stage_names_from_plan
from .reading import stage_names_of_run as stage_names_of_run
from .runs import fmt_run, summarize_runs


# ---------------------------------------------------------------------- summary
def _spread(values: np.ndarray) -> dict[str, Any]:
    """Count, mean, standard deviation, min and max of finite ``values`` (None if none)."""
    v = values[np.isfinite(values)]
    if not len(v):
        return {"n": 0, "mean": None, "std": None, "min": None, "max": None}
    return {
        "n": len(v),
        "mean": float(v.mean()),
        "std": float(v.std()),
        "min": float(v.min()),
        "max": float(v.max()),
    }


def optimizer_stages(systems: Mapping[str, Any]) -> list[bool] | None:
    """Which history columns are optimizer stages, read from how systems left them: an
    optimizer's exits are ``converged`` / ``max_steps``, an MD stage's ``completed``
    (None without a stage history; a stage nobody left counts as MD)."""
    exits = systems.get("stage_exit")
    if exits is None or np.ndim(exits) != 2:
        return None
    left_optimizer = np.isin(np.asarray(exits), (EXIT_CONVERGED, EXIT_MAX_STEPS))
    return left_optimizer.any(axis=0).tolist()


def summarize(
    systems: Mapping[str, Any],
    stage_names: Sequence[str] | None = None,
    stats: Mapping[str, Any] | None = None,
    optimizers: Sequence[bool] | None = None,
) -> dict[str, Any]:
    """A JSON-ready summary of per-system results (see module docstring).

    ``stats`` (a run's ``Results.stats``: ``wall_time_s``, ``steps``, ``forward_calls``)
    adds wall time and throughput, and ``skipped``, the structures SizeAwareSampler's
    ``skip_invalid`` left out (each with its ``system_id`` and why).  ``optimizers`` flags
    the optimizer stages (default: read from the stage exits); a plan without one reports
    ``completed`` systems, since ``converged`` (every optimizer met its criterion) means
    nothing for MD alone.
    """
    arr = {k: np.asarray(v.cpu() if hasattr(v, "cpu") else v) for k, v in systems.items()}
    n = len(arr["energy"]) if "energy" in arr else 0
    if optimizers is None:
        optimizers = optimizer_stages(arr)
    out: dict[str, Any] = {
        "systems": n,
        "has_optimizer": True if optimizers is None else any(optimizers),
    }
    if n == 0:
        out.update(converged=0, completed=0, quarantined=0, exit_reasons={}, stages=[])
    else:
        n_atoms = arr["n_atoms"].astype(np.int64)
        exit_code = arr["exit_code"].astype(np.int64)
        epa = arr["energy"].astype(np.float64) / np.maximum(n_atoms, 1)
        finite = np.isfinite(epa)
        reasons = Counter(EXIT_REASONS.get(int(c), f"code {int(c)}") for c in exit_code)
        out.update(
            converged=int(np.asarray(arr["converged"], dtype=bool).sum()),
            completed=int((exit_code == EXIT_COMPLETED).sum()),
            quarantined=int(np.isin(exit_code, FAILED_EXITS).sum()),
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
                stage = {
                    "name": names[j],
                    "steps_mean": float(col.mean()),
                    "steps_max": int(col.max()),
                    "steps_total": int(col.sum()),
                    "exits": dict(sorted(counts.items())),
                }
                # only systems that left the stage have values at its exit
                left = ex != EXIT_RUNNING if exits2d is not None else np.ones(n, bool)
                for key, column, scale in (
                    ("energy_per_atom", "stage_energy", 1.0 / np.maximum(n_atoms, 1)),
                    ("volume_per_atom", "stage_volume", 1.0 / np.maximum(n_atoms, 1)),
                    ("pressure_gpa", "stage_pressure", 1.0 / GPa),
                ):
                    history = arr.get(column)
                    if history is not None and history.shape == steps2d.shape:
                        stage[key] = _spread((history[:, j].astype(np.float64) * scale)[left])
                stages.append(stage)
        out["stages"] = stages
        symmetry = _symmetry(arr) if out["has_optimizer"] else None
        if symmetry:
            out["symmetry"] = symmetry
        if "total_steps" in arr:
            out["atom_steps"] = int((n_atoms * arr["total_steps"].astype(np.int64)).sum())
    if stats:
        wall = stats.get("wall_time_s")
        if wall:
            out["wall_time_s"] = float(wall)
            if out.get("atom_steps"):
                out["atom_steps_per_s"] = out["atom_steps"] / float(wall)
            if n:
                out["systems_per_s"] = n / float(wall)
        for key in ("steps", "forward_calls"):
            if stats.get(key) is not None:
                out[f"loop_{key}"] = int(stats[key])
        if stats.get("skipped"):  # left out by SizeAwareSampler(skip_invalid=True)
            out["skipped"] = list(stats["skipped"])
    return out


def _symmetry(arr: Mapping[str, np.ndarray]) -> dict[str, Any] | None:
    """Space groups kept, broken, raised or changed by the relaxation (the results
    table's ``symmetry``), with the ``system_id`` of the first broken ones."""
    from ..core.symmetry import verdict

    if "spacegroup_initial" not in arr or "spacegroup_final" not in arr:
        return None
    pairs = zip(arr["spacegroup_initial"].tolist(), arr["spacegroup_final"].tolist())
    verdicts = [verdict(a, b) for a, b in pairs]
    counts = Counter(v for v in verdicts if v)
    if not counts:
        return None
    ids = arr["system_id"].tolist() if "system_id" in arr else list(range(len(verdicts)))
    broken = [int(i) for i, v in zip(ids, verdicts) if v in ("broken", "changed")][:5]
    return {**dict(sorted(counts.items())), "broken_ids": broken}


def _fmt_spread(x: Mapping[str, Any], unit: str, digits: int) -> str:
    d = digits
    return (
        f"mean {x['mean']:.{d}f} {unit}, std {x['std']:.{d}f} (min {x['min']:.{d}f}, "
        f"max {x['max']:.{d}f}; {x['n']} systems)"
    )


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
    if summary.get("has_optimizer", True):
        table.add_row("converged", f"{summary['converged']} / {n}")
    else:  # MD only: nothing to converge
        table.add_row("completed", f"{summary.get('completed', 0)} / {n}")
    table.add_row("quarantined", str(summary["quarantined"]))
    skipped = summary.get("skipped") or []
    if skipped:
        why = "; ".join(f"system_id {s['system_id']}: {s['reason']}" for s in skipped[:5])
        more = f"; ... {len(skipped) - 5} more" if len(skipped) > 5 else ""
        table.add_row("skipped", escape(f"{len(skipped)} (skip_invalid: {why}{more})"))
    table.add_row("exit reasons", _fmt_reasons(summary["exit_reasons"]))
    symmetry = summary.get("symmetry")
    if symmetry:
        counts = {k: v for k, v in symmetry.items() if k != "broken_ids"}
        ids = symmetry["broken_ids"]
        where = f" (system_id {', '.join(map(str, ids))}{' ...' if len(ids) == 5 else ''})"
        table.add_row("space group", _fmt_reasons(counts) + (where if ids else ""))
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
        e = st.get("energy_per_atom")
        if e is not None:
            table.add_row(
                escape(f"E/atom at exit {st['name']}"),
                "no system left this stage" if not e["n"] else _fmt_spread(e, "eV", 6),
            )
        v, p = st.get("volume_per_atom"), st.get("pressure_gpa")
        if v is not None and v["n"]:  # (none for molecules, nor where no system left)
            table.add_row(escape(f"V/atom at exit {st['name']}"), _fmt_spread(v, "Å^3", 4))
            table.add_row(
                escape(f"P at exit {st['name']}"),
                _fmt_spread(p, "GPa", 4)
                if p is not None and p["n"]
                else "stress not computed (Simulator(stress=True) records it)",
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
    runs = summary.get("runs")
    if isinstance(runs, list) and len(runs) > 1:
        for r in runs:
            table.add_row(f"run {r['index']}", escape(fmt_run(r)))
    if summary.get("wall_time_s") is not None:
        total = " in total" if isinstance(runs, list) and len(runs) > 1 else ""
        note = summary.get("wall_time_note")
        table.add_row(
            "wall time", f"{summary['wall_time_s']:.2f} s{total}" + (f" ({note})" if note else "")
        )
    if summary.get("atom_steps_per_s") is not None:
        rate = f"{summary['atom_steps_per_s']:.3g} atom-steps/s"
        if summary.get("systems_per_s") is not None:
            rate += f", {summary['systems_per_s']:.3g} systems/s"
        table.add_row("throughput", rate)
    if summary.get("model_note"):  # e.g. ASECalculatorModel's slow path
        table.add_row("model", escape(summary["model_note"]))
    if summary.get("environment"):  # the libraries and code paths that did the arithmetic
        table.add_row("numerics", escape(describe_environment(summary["environment"])))
    for line in where:
        table.add_row("output", escape(line))
    return table


# ---------------------------------------------------------------------- command
def store_summary(
    store: str | Path,
    systems: Mapping[str, np.ndarray] | None = None,
    runs: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The summary of every system a store holds and of each run that wrote it (the
    ``summary.json`` of a merged campaign; ``report`` prints it).  ``systems``, ``runs``:
    what :func:`read_store_systems` / :func:`read_store_runs` give, if already read."""
    systems = read_store_systems(store) if systems is None else systems
    runs = read_store_runs(store) if runs is None else runs
    summary = summarize(systems, _labels(systems, runs)[1])
    summary.update(summarize_runs(runs, systems))
    return summary


def _labels(systems: Mapping[str, np.ndarray], runs: Sequence[Any]) -> tuple[int, list[str]]:
    """(history columns, their labels): every run's stages, as all the runs name them."""
    k = systems["stage_steps"].shape[1] if "stage_steps" in systems else 0
    return k, merged_stage_names(stage_names_of_run(r, k) for r in runs) or []


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
    k, names = _labels(systems, runs)
    summary = store_summary(store, systems, runs)
    plan = " / ".join(stage_names_of_run(last, k)) if k else last.get("plan", "?")
    where = [f"{store} ({len(runs)} run(s); last: stages {plan}, model {last.get('model', '?')})"]
    if plots is not None:
        where.append(f"plots: {plots}")
    elif trajectory is not None:
        where.append(f"trajectory {trajectory}: pass --plots DIR to plot it")
    paths = store_paths(store, len(systems.get("energy", ())))
    bands = band_rows(systems, paths) if (paths >= 0).any() else []
    if bands:  # a run of nudged elastic bands: one row per band too
        summary["bands"] = bands
    # the tables first: a missing matplotlib fails only the plots
    console.print(summary_table(summary, title=f"alchemi-lit report: {store}", where=where))
    if bands:
        console.print(bands_table(bands))
    if plots is not None:
        written = make_plots(systems, plots, names, trajectory)
        if bands:
            written.append(plot_band_paths(bands, Path(plots) / "neb_paths.png"))
        summary["plots"] = [str(p) for p in written]
        for png in written:
            console.print(f"wrote {png}")
    return summary
