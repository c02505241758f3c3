"""The report of a store of nudged elastic bands, against ASE on the stored energies.

A hand-written store (rows in write order, not ``system_id`` order; one structure
outside any band) gives known energies per image; barriers are ``NEBTools.get_barrier
(fit=False)``'s, the highest image ASE's climbing image ``NEB.imax``, the status that of
the interior images.  The printed table is parsed back.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ase.mep import NEB, NEBTools
from neb_cases import h2_band
from rich.console import Console
from test_report_numbers import write_store

from alchemi_lit.core.info_codec import info_to_json
from alchemi_lit.report import report
from alchemi_lit.report.bands import bands_table

#: path 0 only climbs (highest energy: the last endpoint; highest interior image 2);
#: path 1 has a barrier and a tie for its top (ASE climbs the later image, 2)
ENERGIES = {0: [0.0, 0.2, 0.5, 0.3, 0.9], 1: [0.4, 1.0, 1.0, 0.5, 0.1]}
#: exit codes per image: path 0's endpoints ran out of steps in their relaxation (the
#: band is judged on its interior images), path 1's image 2 turned non-finite
EXITS = {0: [2, 1, 1, 1, 2], 1: [1, 1, 4, 1, 1]}
ORDER = [7, 0, 10, 3, 9, 1, 5, 4, 8, 2, 6]  # the store's rows: system ids as written


def band_store(tmp_path: Path) -> Path:
    ids = np.array(ORDER)
    path = np.where(ids < 10, ids // 5, -1)
    energy = np.array([ENERGIES[p][i % 5] if p >= 0 else -7.0 for i, p in zip(ids, path)])
    code = np.array([EXITS[p][i % 5] if p >= 0 else 1 for i, p in zip(ids, path)])
    systems = {"system_id": ids, "energy": energy, "n_atoms": np.full(11, 2), "exit_code": code,
               "converged": code == 1, "total_steps": np.full(11, 9)}  # fmt: skip
    info = [info_to_json({"path_id": int(p)}) if p >= 0 else "" for p in path]
    return write_store(tmp_path / "neb.zarr", systems, [{"first_row": 0}], info=info)


def table_rows(text: str) -> dict[str, list[str]]:
    """The bands table's rows by path_id (cells stripped)."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in re.split(r"[│┃]", line)[1:-1]]
        if len(cells) == 7 and re.fullmatch(r"\d+|\.\.\.", cells[0]):
            rows[cells[0]] = cells
    return rows


def test_band_rows_are_ase_barriers_of_each_path_in_id_order(tmp_path: Path) -> None:
    """Per path: forward and reaction energy as ``NEBTools.get_barrier(fit=False)``,
    backward = forward - reaction, the highest image and its energy as ASE's ``NEB.imax``,
    the images in system_id order whatever the rows; the structure outside the bands is
    left out; a band converged when its interior images did."""
    out = io.StringIO()
    summary = report(band_store(tmp_path), console=Console(file=out, width=200))
    rows = summary["bands"]
    assert [r["path_id"] for r in rows] == [0, 1]
    for row, energies in zip(rows, ENERGIES.values()):
        band = h2_band(energies)
        forward, reaction = NEBTools(band).get_barrier(fit=False)
        neb = NEB(band, climb=True, method="improvedtangent")
        neb.get_forces()
        assert row["energies"] == energies and row["n_images"] == 5
        assert row["forward_barrier"] == pytest.approx(forward, abs=1e-12)
        assert row["reaction_energy"] == pytest.approx(reaction, abs=1e-12)
        assert row["backward_barrier"] == pytest.approx(forward - reaction, abs=1e-12)
        assert row["highest_image"] == neb.imax == 2
        assert row["highest_energy"] == energies[neb.imax]
    assert (rows[0]["converged"], rows[0]["exit_reason"]) == (True, "converged")
    assert (rows[1]["converged"], rows[1]["exit_reason"]) == (False, "non_finite")
    printed = table_rows(out.getvalue())
    assert printed["0"] == ["0", "5", "0.9000", "0.0000", "0.9000", "2", "converged"]
    assert printed["1"] == ["1", "5", "0.6000", "0.9000", "-0.3000", "2",
                            "quarantined (non_finite)"]  # fmt: skip
    assert "bands: 2 (1 converged, 1 non_finite)" in out.getvalue()


def band_row(path_id: int, reaction: float = 0.1) -> dict[str, Any]:
    return {"path_id": path_id, "n_images": 5, "forward_barrier": 0.5,
            "backward_barrier": 0.5 - reaction, "reaction_energy": reaction,
            "highest_image": 2, "converged": True, "exit_reason": "converged"}  # fmt: skip


@pytest.mark.parametrize("n", [30, 31])
def test_the_table_shows_thirty_bands_then_counts_the_rest(n: int) -> None:
    """Thirty bands fit the table; of 31, the last row says '1 more bands'."""
    out = io.StringIO()
    Console(file=out, width=200).print(bands_table([band_row(p) for p in range(n)]))
    rows = table_rows(out.getvalue())
    assert sorted(int(k) for k in rows if k != "...") == list(range(30))
    assert ("..." in rows) == (n == 31)
    if n == 31:
        assert rows["..."][-1] == "1 more bands"


def test_a_tiny_negative_energy_prints_without_a_minus_sign() -> None:
    """-3e-5 eV rounds to 0.0000 at four decimals: printed so, not as '-0.0000'."""
    out = io.StringIO()
    Console(file=out, width=200).print(bands_table([band_row(0, reaction=-3e-5)]))
    assert table_rows(out.getvalue())["0"][4] == "0.0000"
