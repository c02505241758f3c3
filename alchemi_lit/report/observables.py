"""PNG plots of the MD observables of a store the observable callbacks wrote
(:mod:`alchemi_lit.io.observables_store`), a few systems per figure:

* ``rdf.png``       the total g(r) of each system (partials dashed),
* ``msd.png``       MSD against the lag, with the fitted line of slope ``6 D``,
* ``vacf.png``      the normalised VACF and the VDOS,
* ``averages.png``  each block-averaged quantity per system with its error bar.

Only the observables the store holds are drawn; matplotlib is the optional ``plots``
extra, as for :mod:`.plots`.  :func:`report_observables` is ``alchemi-lit report OBS.zarr``:
one table row per system (D with its error, the first g(r) peak, the VDOS peak, each
block average with its error) before the plots, so a missing matplotlib fails only them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..io.observables_store import FORMAT, read_observables
from .plots import _axis_style, _pyplot, _save


def _held(path: str | Path) -> list[str]:
    import zarr

    return sorted(zarr.open_group(str(path), mode="r").group_keys())


def plot_observables(path: str | Path, out_dir: str | Path, max_systems: int = 6) -> list[Path]:
    """Draw the figures of the module docstring for the first ``max_systems`` systems of
    each observable in the store at ``path``; returns the files written to ``out_dir``."""
    plt = _pyplot()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in _held(path):
        data = read_observables(path, name)
        if not len(data.get("system_id", [])):
            continue
        draw = {"rdf": _rdf, "msd": _msd, "vacf": _vacf, "averages": _averages}.get(name)
        if draw is not None:
            fig = draw(plt, data, min(int(max_systems), len(data["system_id"])))
            written.append(_save(fig, out / f"{name}.png", plt))
    return written


def is_observables_store(path: str | Path) -> bool:
    """Whether ``path`` is a store the observable callbacks wrote."""
    if not (Path(path) / "zarr.json").is_file():
        return False
    import zarr

    return zarr.open_group(str(path), mode="r").attrs.get("format") == FORMAT


def report_observables(path: str | Path, plots: str | Path | None, console: Any) -> list[Path]:
    """Print one row per system of what the store at ``path`` holds; with ``plots``, the
    figures of :func:`plot_observables` there."""
    from rich.table import Table

    columns: dict[str, dict[int, str]] = {}
    for name in _held(path):
        data = read_observables(path, name)
        for key, values in _summary_columns(name, data).items():
            columns[key] = dict(zip((int(s) for s in data["system_id"]), values))
    ids = sorted({s for col in columns.values() for s in col})
    table = Table(title=f"alchemi-lit report: observables ({path})", title_justify="left")
    for col in ("system_id", *columns):
        table.add_column(col)
    for sid in ids:
        table.add_row(str(sid), *(col.get(sid, "") for col in columns.values()))
    console.print(table)
    if plots is None:
        return []
    written = plot_observables(path, plots)
    for png in written:
        console.print(f"wrote {png}")
    return written


def _summary_columns(name: str, data: dict[str, Any]) -> dict[str, list[str]]:
    """The table's columns for one observable, a formatted value per stored system."""
    if name == "msd":
        return {"D (Å²/fs)": [_pm(d, e) for d, e in zip(data["D"], data["D_error"])]}
    if name == "vacf":
        peak = [f[np.argmax(v)] for f, v in zip(data["frequency"], data["vdos"])]
        return {"D Green-Kubo (Å²/fs)": [_pm(d, e) for d, e in zip(
                    data["D_green_kubo"], data["D_green_kubo_error"])],
                "VDOS peak (THz)": [f"{p:.3g}" for p in peak]}  # fmt: skip
    if name == "rdf":
        first = [int(np.argmax(g[0])) for g in data["g"]]
        return {"g(r) peak": [f"{g[0, k]:.3g} at {r[k]:.3g} Å"
                              for g, r, k in zip(data["g"], data["r"], first)]}  # fmt: skip
    if name == "averages":
        units = data["meta"].get("units", {})
        quantities = data["meta"].get("quantities", [])
        return {f"{q} ({units.get(q, '')})": list(map(_pm, data[q], data[f"{q}_error"]))
                for q in quantities}  # fmt: skip
    return {}


def _pm(value: float, error: float) -> str:
    return f"{value:.5g} ± {error:.2g}"


def _label(data: dict[str, Any], k: int) -> str:
    return f"system {int(data['system_id'][k])}"


def _rdf(plt: Any, data: dict[str, Any], n: int) -> Any:
    fig, ax = plt.subplots(figsize=(6, 4))
    for k in range(n):
        (line,) = ax.plot(data["r"][k], data["g"][k, 0], label=_label(data, k))
        for p in range(1, data["g"].shape[1]):
            ax.plot(data["r"][k], data["g"][k, p], ls="--", color=line.get_color(), lw=0.8)
    ax.axhline(1.0, color="0.6", lw=0.6)
    ax.set_xlabel("r (Å)")
    ax.set_ylabel("g(r)")
    ax.legend(fontsize=7)
    _axis_style(ax.xaxis)
    return fig


def _msd(plt: Any, data: dict[str, Any], n: int) -> Any:
    fig, ax = plt.subplots(figsize=(6, 4))
    for k in range(n):
        t, msd, d = data["t"][k], data["msd"][k], data["D"][k]
        (line,) = ax.plot(t, msd, label=f"{_label(data, k)}: D = {d:.3g} Å²/fs")
        ax.plot(t, msd[-1] + 6 * d * (t - t[-1]), ls=":", color=line.get_color())
    ax.set_xlabel("lag (fs)")
    ax.set_ylabel("MSD (Å²)")
    ax.legend(fontsize=7)
    return fig


def _vacf(plt: Any, data: dict[str, Any], n: int) -> Any:
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(6, 6))
    for k in range(n):
        c = data["vacf"][k]
        top.plot(data["t"][k], c / c[0] if c[0] else c, label=_label(data, k))
        bottom.plot(data["frequency"][k], data["vdos"][k])
    top.set_xlabel("lag (fs)")
    top.set_ylabel("VACF / VACF(0)")
    top.legend(fontsize=7)
    bottom.set_xlabel("frequency (THz)")
    bottom.set_ylabel("VDOS (1/THz)")
    fig.tight_layout()
    return fig


def _averages(plt: Any, data: dict[str, Any], n: int) -> Any:
    quantities = list(data["meta"].get("quantities", []))
    units = data["meta"].get("units", {})
    fig, axes = plt.subplots(len(quantities), 1, figsize=(6, 2.2 * len(quantities)),
                             squeeze=False)  # fmt: skip
    ids = np.arange(n)
    for ax, q in zip(axes[:, 0], quantities):
        ax.errorbar(ids, data[q][:n], yerr=data[f"{q}_error"][:n], fmt="o", capsize=3)
        ax.set_ylabel(f"{q} ({units.get(q, '')})")
        ax.set_xticks(ids, [str(int(s)) for s in data["system_id"][:n]])
        _axis_style(ax.yaxis)
    axes[-1, 0].set_xlabel("system_id")
    fig.tight_layout()
    return fig


__all__ = ["is_observables_store", "plot_observables", "report_observables"]
