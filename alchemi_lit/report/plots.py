"""PNG plots of ``alchemi-lit report --plots`` (matplotlib, the optional ``plots`` extra).

matplotlib is imported only when plots are asked for, with the Agg backend (no display
needed).  The plots:

* ``steps_per_stage.png``   histogram of the steps each system spent in each stage
  (for optimizer stages: steps to converge),
* ``energy_per_atom.png``   distribution of the final energy per atom,
* ``cell_per_stage.png``    volume per atom (Å^3) and pressure (GPa) of each system when
  it left each stage (periodic systems; the pressure where the stress was computed),
* ``neb_paths.png``         energy along each nudged elastic band (relative to its
  initial image) against the image's place on the path, the highest image marked
  (runs of band stages: :mod:`alchemi_lit.report.bands`),
* ``trajectory.png``        temperature and potential energy per atom against the
  step, for a few systems of a :class:`~alchemi_lit.callbacks.TrajectoryWriter` store
  (``--trajectory``).  A panel whose quantity the trajectory does not hold says so in
  the panel and in a warning naming the ``fields`` to add, instead of staying empty.

Tick labels must stay readable whatever the data: steps reach 10^5 and energies per
atom differ in the fifth decimal.  So axes get few ticks (integers for steps), plain
numbers without matplotlib's offset text (``1e-6 - 8.012e-2`` printed over the axis
label), and :func:`_tidy_ticks` thins out, then tilts, the labels of any axis whose
labels still collide once drawn.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import ConfigError

_MAX_TICKS = 6


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


# ---------------------------------------------------------------------- tick labels
def _axis_style(axis: Any, integer: bool = False) -> None:
    """Few ticks, integers where the data are counts, and no offset text."""
    from matplotlib.ticker import MaxNLocator, ScalarFormatter

    axis.set_major_locator(MaxNLocator(nbins=_MAX_TICKS, integer=integer, min_n_ticks=1))
    formatter = ScalarFormatter(useOffset=False)
    formatter.set_powerlimits((-4, 6))
    axis.set_major_formatter(formatter)


def _drawn_labels(axis: Any, renderer: Any) -> list[Any]:
    """Window extents of the tick labels drawn on ``axis`` (those inside its view)."""
    lo, hi = sorted(axis.get_view_interval())
    eps = 1e-9 * max(abs(lo), abs(hi), 1.0)
    return [
        tick.label1.get_window_extent(renderer)
        for tick, loc in zip(axis.get_major_ticks(), axis.get_majorticklocs())
        if lo - eps <= loc <= hi + eps and tick.label1.get_visible() and tick.label1.get_text()
    ]


def _collide(boxes: list[Any], pad: float = 1.0) -> bool:
    boxes = [b.padded(pad) for b in boxes]
    return any(boxes[i].overlaps(boxes[j]) for i in range(len(boxes)) for j in range(i))


def _tidy_ticks(fig: Any) -> None:
    """Fewer ticks, then tilted labels, on every axis whose drawn tick labels collide."""
    from matplotlib.ticker import MaxNLocator

    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            locator = axis.get_major_locator()
            nbins = _MAX_TICKS
            while isinstance(locator, MaxNLocator) and nbins > 2:
                if not _collide(_drawn_labels(axis, renderer)):
                    break
                nbins -= 1
                locator.set_params(nbins=nbins)
                fig.canvas.draw()
            if _collide(_drawn_labels(axis, renderer)):
                for label in axis.get_ticklabels():
                    label.set_rotation(30)
                    label.set_horizontalalignment("right")
    fig.tight_layout()


def _save(fig: Any, png: Path, plt: Any) -> Path:
    _tidy_ticks(fig)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


# ---------------------------------------------------------------------- results plots
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
                _axis_style(ax.xaxis, integer=True)
                _axis_style(ax.yaxis, integer=True)
            written.append(_save(fig, out / "steps_per_stage.png", plt))
        epa = systems["energy"] / np.maximum(systems["n_atoms"], 1)
        epa = epa[np.isfinite(epa)]
        fig, ax = plt.subplots(figsize=(5.0, 3.2))
        ax.hist(epa, bins=min(50, max(5, len(epa) // 2)), color="C1")
        ax.set_xlabel("final energy per atom (eV)")
        ax.set_ylabel("systems")
        _axis_style(ax.xaxis)
        _axis_style(ax.yaxis, integer=True)
        written.append(_save(fig, out / "energy_per_atom.png", plt))
        cell = _plot_cell_per_stage(systems, stage_names, out / "cell_per_stage.png", plt)
        written += [cell] if cell is not None else []
    if trajectory is not None:
        written.append(plot_trajectory(trajectory, out / "trajectory.png", max_traces, plt))
    return written


def _plot_cell_per_stage(
    systems: Mapping[str, np.ndarray], stage_names: Sequence[str] | None, png: Path, plt: Any
) -> Path | None:
    """Histograms of volume per atom and pressure at each stage's exit (None: no periodic
    system left a stage)."""
    from ase.units import GPa

    volume, pressure = systems.get("stage_volume"), systems.get("stage_pressure")
    if volume is None or volume.ndim != 2 or not np.isfinite(volume).any():
        return None
    k = volume.shape[1]
    names = list(stage_names) if stage_names and len(stage_names) == k else None
    per_atom = volume / np.maximum(systems["n_atoms"], 1)[:, None]
    gpa = pressure / GPa if pressure is not None else np.full_like(volume, np.nan)
    fig, axes = plt.subplots(2, k, figsize=(4.0 * k, 5.6), squeeze=False)
    for j in range(k):
        for ax, values, label in (
            (axes[0][j], per_atom[:, j], "volume per atom at exit (Å^3)"),
            (axes[1][j], gpa[:, j], "pressure at exit (GPa)"),
        ):
            v = values[np.isfinite(values)]
            if len(v):
                ax.hist(v, bins=min(40, max(5, len(v) // 2)), color="C2")
            else:
                ax.text(0.5, 0.5, "not recorded", transform=ax.transAxes, ha="center",
                        va="center", fontsize=8, color="0.35")  # fmt: skip
            ax.set_xlabel(label)
            ax.set_ylabel("systems")
            _axis_style(ax.xaxis)
            _axis_style(ax.yaxis, integer=True)
        axes[0][j].set_title(names[j] if names else f"stage {j}")
    return _save(fig, png, plt)


# ---------------------------------------------------------------------- trajectories
def trajectory_series(path: str | Path, max_systems: int = 8) -> dict[int, dict[str, np.ndarray]]:
    """Per-system ``step``, ``T`` (K, NaN if not derivable) and ``epa`` (eV/atom, NaN if not
    written) from a TrajectoryWriter store, for the first ``max_systems`` systems."""
    from ..callbacks.trajectory import read_trajectory, trajectory_system_ids

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
            elif "momenta" in a.arrays:
                temp.append(float(a.get_temperature()))
            else:
                temp.append(np.nan)
            try:
                epa.append(float(a.get_potential_energy()) / len(a))
            except Exception:  # no energy written
                epa.append(np.nan)
        series[int(sid)] = {"step": step, "T": np.asarray(temp), "epa": np.asarray(epa)}
    return series


def _recorded_fields(path: str | Path) -> list[str]:
    import zarr

    return list(zarr.open_group(str(path), mode="r").attrs.get("fields", []))


def missing_panels(path: str | Path, series: Mapping[int, Mapping[str, np.ndarray]]) -> dict:
    """``{panel: why it has no data}`` for the trajectory plot's panels (``"T"``, ``"epa"``)
    that the store at ``path`` cannot fill."""
    if not series:
        return {"T": "the trajectory holds no frames", "epa": "the trajectory holds no frames"}
    fields = _recorded_fields(path)
    need = {
        "T": ("temperature", "'temperature' or 'velocities'"),
        "epa": ("potential energy", "'energy'"),
    }
    out = {}
    for panel, (what, add) in need.items():
        if not any(np.isfinite(s[panel]).any() for s in series.values()):
            out[panel] = (
                f"no {what} in {path}: its TrajectoryWriter fields are {fields}; "
                f"add {add} to fields"
            )
    return out


def plot_trajectory(
    path: str | Path, png: str | Path, max_systems: int = 8, plt: Any = None
) -> Path:
    """Temperature and energy per atom against step for a few systems of a trajectory;
    a panel the trajectory has no data for says why (and a warning does too)."""
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
    _axis_style(ax_e.xaxis, integer=True)
    _axis_style(ax_t.yaxis)
    _axis_style(ax_e.yaxis)
    panels = {"T": ax_t, "epa": ax_e}
    missing = missing_panels(path, series)
    for panel, why in missing.items():
        warnings.warn(f"trajectory plot: {why}", UserWarning, stacklevel=2)
        panels[panel].text(
            0.5, 0.5, f"not recorded\n{why.split(': ', 1)[1]}", transform=panels[panel].transAxes,
            ha="center", va="center", wrap=True, fontsize=8, color="0.35",
        )  # fmt: skip
    if series and len(series) <= 10 and "T" not in missing:
        ax_t.legend(fontsize=7)
    return _save(fig, Path(png), plt)


# ---------------------------------------------------------------------- bands
def plot_band_paths(
    bands: Sequence[Mapping[str, Any]], png: str | Path, max_legend: int = 10, plt: Any = None
) -> Path:
    """Energy along each band (eV, relative to its first image) against the image's place
    on the path (image / (images - 1), so bands of any length share the axis); the
    highest image marked.  Many bands: thinner lines, no legend."""
    plt = plt or _pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    many = len(bands) > max_legend
    for k, band in enumerate(bands):
        e = np.asarray(band["energies"], dtype=np.float64)
        x = np.linspace(0.0, 1.0, len(e))
        color = f"C{k % 10}"
        ax.plot(x, e - e[0], lw=0.8 if many else 1.4, alpha=0.6 if many else 1.0, color=color,
                marker="o", ms=2.5 if many else 4, label=f"path {band['path_id']}")  # fmt: skip
        top = int(band["highest_image"])
        ax.plot(x[top], e[top] - e[0], marker="^", ms=5 if many else 8, color=color, ls="none")
    ax.axhline(0.0, color="0.6", lw=0.6)
    ax.set_xlabel("place on the path (image / (images - 1))")
    ax.set_ylabel("E - E(initial image) (eV)")
    ax.set_title(f"energy along each path ({len(bands)} bands; triangles: highest images)")
    _axis_style(ax.xaxis)
    _axis_style(ax.yaxis)
    if bands and not many:
        ax.legend(fontsize=7)
    return _save(fig, Path(png), plt)
