"""``alchemi-lit report DIR``: the table a property workflow wrote, and its plots.

DIR is a workflow's output folder (``<name>.csv`` or ``.parquet``, ``<name>.settings.json``
and ``<name>/`` with one JSON per material).  Plots, one PNG per material: E(V) points
with ASE's fitted curve (eos), the C_ij matrix (elastic), the band path beside the DOS
(phonons), the frequencies as a stick spectrum (vibrations), V, beta, B and C_p against
T (qha), the energies of the relaxed orderings by rank (order).  Everything is read from
the files, so plotting needs neither the model nor phonopy's symmetry set-up again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import ConfigError

#: the table columns shown per workflow (besides material and formula)
SHOWN = {
    "eos": ("V0", "E0", "B0", "B0_prime"),
    "elastic": ("C11", "C12", "C44", "K_VRH", "G_VRH", "E_VRH", "poisson", "born_stable"),
    "phonons": ("min_frequency_THz", "stable", "free_energy_300K", "n_displacements"),
    "vibrations": ("n_modes", "n_imaginary", "min_frequency_cm1", "max_frequency_cm1", "zpe_eV"),
    "qha": ("V_300K", "alpha_300K", "B_300K", "Cp_300K", "min_frequency_THz"),
    "order": ("rank", "energy_per_atom", "above_best_per_atom", "ewald_energy", "converged"),
}


def workflow_name(folder: str | Path) -> str | None:
    """The workflow whose output ``folder`` is (None: not a workflow's output)."""
    path = Path(folder)
    for name in SHOWN:
        if (path / f"{name}.settings.json").is_file():
            return name
    return None


def report_workflow(folder: str | Path, plots: str | Path | None, console: Any) -> list[Path]:
    """Print the workflow's table; with ``plots``, write one PNG per material there."""
    import pandas as pd
    from rich.markup import escape
    from rich.table import Table

    path = Path(folder)
    name = workflow_name(path)
    if name is None:
        raise ConfigError(f"{str(path)!r} is not a workflow's output folder (no *.settings.json)")
    csv, parquet = path / f"{name}.csv", path / f"{name}.parquet"
    table = pd.read_csv(csv) if csv.exists() else pd.read_parquet(parquet)
    kept = [c for c in ("symmetry",) if c in table]  # a pre-relaxation's verdict
    shown = ["material", "formula", *SHOWN[name], *kept, "error"]
    out = Table(title=f"alchemi-lit report: {name} ({path})")
    for col in shown:
        out.add_column(col, overflow="fold")
    for _, row in table.iterrows():
        out.add_row(*(escape(_cell(row[c])) for c in shown))
    console.print(out)
    if plots is None:
        return []
    written = _plot_all(name, path, table, Path(plots))
    for png in written:
        console.print(f"wrote {png}")
    return written


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return "" if np.isnan(value) else f"{value:.5g}"
    return str(value)


def _plot_all(name: str, folder: Path, table: Any, plots: Path) -> list[Path]:
    from ..report.plots import _pyplot

    plt = _pyplot()
    plots.mkdir(parents=True, exist_ok=True)
    if name == "order":
        return _orderings(plt, table, plots)
    draw = {"eos": _eos, "elastic": _elastic, "phonons": _phonons, "vibrations": _vibrations,
            "qha": _qha}[name]  # fmt: skip
    written = []
    for _, row in table.iterrows():
        if isinstance(row["error"], str):
            continue  # a failed material has nothing to plot (its reason is in the table)
        stem = f"{int(row['material'])}_{row['formula']}"
        record = json.loads((folder / name / f"{stem}.json").read_text())
        fig = draw(plt, record, f"{stem}")
        png = plots / f"{name}_{stem}.png"
        fig.savefig(png, dpi=110, bbox_inches="tight")
        plt.close(fig)
        written.append(png)
    return written


def _orderings(plt: Any, table: Any, plots: Path) -> list[Path]:
    """Per material: each relaxed ordering's energy above the best (meV/atom), by rank."""
    written = []
    for material, rows in table.groupby("material"):
        fig, ax = plt.subplots(figsize=(4.5, 3.2))
        ax.plot(rows["rank"], 1000 * rows["above_best_per_atom"], "o-")
        ax.set_xlabel("ordering (rank)")
        ax.set_ylabel("above the best (meV/atom)")
        stem = f"{int(material)}_{rows['formula'].iloc[0]}"
        ax.set_title(stem)
        png = plots / f"order_{stem}.png"
        fig.savefig(png, dpi=110, bbox_inches="tight")
        plt.close(fig)
        written.append(png)
    return written


def _eos(plt: Any, record: dict[str, Any], title: str) -> Any:
    """The E(V) points and ASE's fitted curve (refitted from the points: same numbers)."""
    from ase.eos import EquationOfState

    form = record.get("form") or "birchmurnaghan"
    fit = EquationOfState(record["volumes"], record["energies"], eos=form)
    fit.fit(warn=False)
    _, _, _, _, x, y, v, e = fit.getplotdata()
    fig, ax = plt.subplots(figsize=(4.5, 3.5))
    ax.plot(v, e, "o", label="computed")
    ax.plot(x, y, "-", label=f"{form}: B0 = {record['B0']:.1f} GPa")
    ax.set_xlabel("volume (Å$^3$)")
    ax.set_ylabel("energy (eV)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    return fig


def _elastic(plt: Any, record: dict[str, Any], title: str) -> Any:
    c = np.asarray(record["C"])
    fig, ax = plt.subplots(figsize=(4.8, 4.0))
    limit = float(np.abs(c).max()) or 1.0
    image = ax.imshow(c, cmap="RdBu_r", vmin=-limit, vmax=limit)
    for i in range(6):
        for j in range(6):
            ax.text(j, i, f"{c[i, j]:.0f}", ha="center", va="center", fontsize=7)
    ticks = [f"{k + 1}" for k in range(6)]
    ax.set_xticks(range(6), ticks)
    ax.set_yticks(range(6), ticks)
    ax.set_title(f"{title}: C$_{{ij}}$ (GPa)")
    fig.colorbar(image, ax=ax, shrink=0.8)
    return fig


def _phonons(plt: Any, record: dict[str, Any], title: str) -> Any:
    band, dos = record.get("band"), record["dos"]
    fig, (ax, ax_dos) = plt.subplots(
        1, 2, figsize=(7, 3.8), sharey=True, gridspec_kw={"width_ratios": [3, 1]}
    )
    if band is not None:
        for d, f in zip(band["distances"], band["frequencies_THz"]):
            ax.plot(d, f, color="C0", lw=1)
        ticks, labels = _band_ticks(band)
        ax.set_xticks(ticks, labels if labels else [""] * len(ticks))
        for t in ticks:
            ax.axvline(t, color="0.8", lw=0.5)
        ax.set_xlim(ticks[0], ticks[-1])
    ax.axhline(0.0, color="0.5", lw=0.5)
    ax.set_ylabel("frequency (THz)")
    ax.set_title(title)
    ax_dos.plot(dos["dos"], dos["frequency_THz"], color="C1", lw=1)
    ax_dos.set_xlabel("DOS")
    return fig


def _vibrations(plt: Any, record: dict[str, Any], title: str) -> Any:
    """One stick per mode at its frequency (cm^-1); imaginary ones negative, in red."""
    f = np.asarray(record["frequencies_cm1"], dtype=np.float64)
    fig, ax = plt.subplots(figsize=(6, 2.8))
    real, imag = f[f >= 0], f[f < 0]
    ax.vlines(real, 0, 1, color="C0", lw=1.5, label="real")
    if imag.size:
        ax.vlines(imag, 0, 1, color="C3", lw=1.5, label="imaginary (as negative)")
    ax.axvline(0.0, color="0.5", lw=0.5)
    ax.set_yticks([])
    ax.set_xlabel("frequency (cm$^{-1}$)")
    ax.set_title(f"{title}: ZPE {record['zpe_eV']:.3f} eV")
    ax.legend(fontsize=8)
    return fig


def _qha(plt: Any, record: dict[str, Any], title: str) -> Any:
    """V(T), beta(T), B(T) and C_p(T) from phonopy's QHA (per input cell)."""
    c = record["curves"]
    t = np.asarray(c["temperature_K"])
    fig, axes = plt.subplots(2, 2, figsize=(7, 5), sharex=True)
    panels = (
        ("volume_A3", "V (Å$^3$)"), ("beta_per_K", "beta (1/K)"),
        ("bulk_modulus_GPa", "B (GPa)"), ("heat_capacity_eV_per_K", "C$_p$ (eV/K)"),
    )  # fmt: skip
    for ax, (key, label) in zip(axes.ravel(), panels):
        ax.plot(t, np.asarray(c[key]), color="C0", lw=1.2)
        ax.set_ylabel(label)
    for ax in axes[1]:
        ax.set_xlabel("T (K)")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def _band_ticks(band: dict[str, Any]) -> tuple[list[float], list[str] | None]:
    """Tick positions at the ends of the path's segments and phonopy's labels for them
    (``U|K`` where the path jumps; None where the labels do not fit the segments)."""
    ends = [float(d[-1]) for d in band["distances"]]
    ticks = [float(band["distances"][0][0]), *ends]
    labels, connections = band.get("labels"), band.get("connections")
    if not labels or connections is None:
        return ticks, None
    out, k = [labels[0]], 1
    try:
        for i, connected in enumerate(connections):
            label = labels[k]
            k += 1
            if not connected and i + 1 < len(connections):
                label, k = f"{label}|{labels[k]}", k + 1
            out.append(label)
    except IndexError:
        return ticks, None
    return ticks, out if k == len(labels) else None
