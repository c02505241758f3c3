"""report.plot_observables draws each observable a store holds, and only those;
`alchemi-lit report OBS.zarr` prints a row per system of what the store holds."""

from __future__ import annotations

from pathlib import Path

import pytest
from ase.build import bulk

from alchemi_lit import Simulator
from alchemi_lit.callbacks import MSD, RDF, VACF, BlockAverages
from alchemi_lit.cli import main
from alchemi_lit.integrators import Langevin
from alchemi_lit.io.observables_store import read_observables
from alchemi_lit.models import LennardJones
from alchemi_lit.report.observables import is_observables_store, plot_observables


def run(callbacks, n: int = 1) -> None:
    atoms = bulk("Ar", "fcc", a=5.3, cubic=True).repeat(2)
    stage = Langevin(dt=4.0, temperature=60.0, steps=12)
    sim = Simulator(model=LennardJones(0.0104, 3.40, 6.0), callbacks=callbacks,
                    precision="64", stages=stage)  # fmt: skip
    sim.run([atoms.copy() for _ in range(n)])


def test_a_store_with_one_observable_gets_its_figure_only(tmp_path: Path) -> None:
    store = tmp_path / "rdf.zarr"
    run([RDF(rmax=5.0, nbins=20, every=4, path=store)])
    files = plot_observables(store, tmp_path / "plots")
    assert [f.name for f in files] == ["rdf.png"] and files[0].stat().st_size > 1000


@pytest.mark.slow
def test_each_observable_of_the_store_gets_its_figure(tmp_path: Path) -> None:
    store = tmp_path / "obs.zarr"
    run([RDF(rmax=5.0, nbins=20, pairs=[("Ar", "Ar")], every=2, path=store),
         MSD(window=3, every=2, path=store), VACF(window=3, every=2, path=store),
         BlockAverages(("energy", "temperature"), every=2, path=store)], n=2)  # fmt: skip
    files = plot_observables(store, tmp_path / "plots")
    assert sorted(f.name for f in files) == ["averages.png", "msd.png", "rdf.png", "vacf.png"]
    assert all(f.stat().st_size > 1000 for f in files)


def test_the_report_command_tables_an_observables_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "obs.zarr"
    run([MSD(window=3, every=2, path=store), BlockAverages(("temperature",), every=2, path=store)],
        n=2)  # fmt: skip
    assert is_observables_store(store) and not is_observables_store(tmp_path)
    capsys.readouterr()
    assert main(["report", str(store)]) == 0
    out = capsys.readouterr().out
    msd, averages = read_observables(store, "msd"), read_observables(store, "averages")
    assert "D (Å²/fs)" in out and "temperature (K)" in out
    for k in range(2):  # each system's row shows its stored values
        assert f"{msd['D'][k]:.5g} ± {msd['D_error'][k]:.2g}" in out
        assert f"{averages['temperature'][k]:.5g}" in out
