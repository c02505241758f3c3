"""``alchemi-lit report DIR`` of a property workflow's output, from hand-written files.

An E(V) table with one fitted material and one whose fit failed: the printed table
parsed back against the CSV, one plot for the fitted material only, its curve ASE's
Birch-Murnaghan form with the table's parameters; the phonon band path's tick labels
for a path phonopy splits in two (``test_workflow_cli.py`` runs the workflows).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from ase.eos import birchmurnaghan
from ase.units import GPa

from alchemi_lit.cli import main
from alchemi_lit.cli.workflow_report import _band_ticks

#: E(V) of one material: Birch-Murnaghan with these parameters (B0 in GPa), +-15 % in V
V0, E0, B0, BP = 12.0, -3.7, 140.123456, 4.8


def eos_folder(folder: Path) -> Path:
    volumes = np.linspace(0.85, 1.15, 9) * V0
    energies = birchmurnaghan(volumes, E0, B0 * GPa, BP, V0)
    (folder / "eos").mkdir(parents=True)
    (folder / "eos.settings.json").write_text("{}")
    pd.DataFrame({
        "material": [0, 1], "formula": ["Cu", "Au"], "V0": [V0, np.nan], "E0": [E0, np.nan],
        "B0": [B0, np.nan], "B0_prime": [BP, np.nan], "error": [np.nan, "fit failed: no minimum"],
    }).to_csv(folder / "eos.csv", index=False)  # fmt: skip
    record = {"volumes": volumes.tolist(), "energies": energies.tolist(), "B0": B0,
              "form": "birchmurnaghan"}  # fmt: skip
    (folder / "eos" / "0_Cu.json").write_text(json.dumps(record))  # the failed one has none
    return folder


def test_the_eos_report_prints_the_table_and_plots_ase_fit_of_each_fitted_material(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The table reads back as the CSV to five significant digits, the failed material
    with its reason; one plot, of the fitted material, whose curve is the
    Birch-Murnaghan E(V) of the table's V0, E0, B0, B0' (the points are exact, so the
    refit recovers them to rounding: 1e-9 eV; ASE's default form, 'sj', is off by 7e-5)."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    drawn = []
    save = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda f, *a, **k: (drawn.append(f), save(f, *a, **k)))
    folder = eos_folder(tmp_path / "out")
    assert main(["report", str(folder), "--plots", str(tmp_path / "plots")]) == 0
    out = capsys.readouterr().out
    rows = [[c.strip() for c in re.split(r"[│┃]", line)[1:-1]] for line in out.splitlines()]
    cu = next(r for r in rows if len(r) == 7 and r[1] == "Cu")
    assert cu[:2] == ["0", "Cu"] and cu[6] == ""
    for cell, value in zip(cu[2:6], (V0, E0, B0, BP)):
        assert float(cell) == pytest.approx(value, rel=5e-5) and cell == f"{value:.5g}"
    assert "fit failed" in out
    assert [p.name for p in (tmp_path / "plots").glob("*.png")] == ["eos_0_Cu.png"]
    (fig,) = drawn
    points, curve = fig.axes[0].get_lines()
    np.testing.assert_allclose(points.get_xdata(), np.linspace(0.85, 1.15, 9) * V0)
    x = curve.get_xdata()
    np.testing.assert_allclose(curve.get_ydata(), birchmurnaghan(x, E0, B0 * GPa, BP, V0),
                               rtol=0, atol=1e-9)  # fmt: skip
    assert "B0 = 140.1 GPa" in curve.get_label()


def test_band_ticks_join_the_labels_where_phonopy_breaks_the_path() -> None:
    """G-X-U | K-G-L: phonopy connects X-U to nothing (a jump to K), so the ticks at the
    five segment ends read G, X, U|K, G, L."""
    from phonopy.phonon.band_structure import get_band_qpoints_and_path_connections

    path = [[[0, 0, 0], [0.5, 0, 0.5], [0.625, 0.25, 0.625]],
            [[0.375, 0.375, 0.75], [0, 0, 0], [0.5, 0.5, 0.5]]]  # fmt: skip
    _, connections = get_band_qpoints_and_path_connections(path, npoints=3)
    assert list(connections) == [True, False, True, False]
    band = {"distances": [[0.0, 0.5, 1.0], [1.0, 1.2, 1.4], [1.4, 2.0, 2.5], [2.5, 3.0, 3.4]],
            "labels": ["G", "X", "U", "K", "G", "L"], "connections": list(connections)}  # fmt: skip
    ticks, labels = _band_ticks(band)
    assert ticks == [0.0, 1.0, 1.4, 2.5, 3.4]
    assert labels == ["G", "X", "U|K", "G", "L"]
