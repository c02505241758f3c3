"""Progress and report per band (issue #27 part 4): a run of band stages is reported in
bands -- converged, running, waiting, unconverged, quarantined -- not only in systems.

One small run (four EMT bands, few at a time, their endpoints relaxed first; one band
converges too slowly for its budget, one has an image that turns NaN) is stored in a
results store with a progress bar drawing into a string; the tests read both.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from neb_cases import PoisonAt, hop
from rich.console import Console

import alchemi_lit as al
from alchemi_lit.callbacks import ProgressBar
from alchemi_lit.data import SizeAwareSampler
from alchemi_lit.integrators import FIRE, NEB
from alchemi_lit.report import report
from alchemi_lit.sinks import ZarrSink
from alchemi_lit.workflows import label_bands, make_band

CASES = [("Cu", "Au", 0, 4), ("Al", "Cu", 1, 3), ("Cu", "Cu", 1, 3), ("Al", "Au", 1, 3)]
POISONED = 11  # the interior image of band 3
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
BANDS = re.compile(
    r"(?P<converged>\d+)/(?P<total>\S+) bands converged, (?P<running>\d+) running, "
    r"(?P<waiting>\d+) waiting(?:, (?P<unconverged>\d+) unconverged)?, "
    r"(?P<quarantined>\d+) quarantined"
)


@pytest.fixture(scope="module")
def neb_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[al.Results, str, Path]:
    folder = tmp_path_factory.mktemp("neb_report")
    data = label_bands([make_band(*hop(m, a, d), n, "linear") for m, a, d, n in CASES])
    out = io.StringIO()
    bar = ProgressBar(every=1, console=Console(force_terminal=True, file=out, width=300))
    stages = FIRE(fmax=0.05, max_steps=10) + FIRE(fmax=0.2, max_steps=15, band=NEB())
    sim = al.Simulator(model=PoisonAt(POISONED, 15), stages=stages, precision="64",
                       callbacks=[bar], sinks=[ZarrSink(folder / "neb.zarr", mode="w")],
                       sync_every=2)  # fmt: skip
    res = sim.run(SizeAwareSampler(data, max_atoms=40))  # bands refill as room frees
    return res, out.getvalue(), folder


def test_the_progress_bar_counts_bands_by_their_state(neb_run):
    res, text, _ = neb_run
    lines = re.split(r"[\r\n]+", ANSI.sub("", text))
    shown = [m.groupdict() for line in lines if (m := BANDS.search(line))]
    assert shown, "no band counts on the bar"
    assert {f["total"] for f in shown} == {"4"}
    waiting = [f for f in shown if f["waiting"] == "1"]  # images wait for their endpoints
    running = [f for f in shown if f["running"] == "1"]
    assert waiting and running
    assert all(int(f["running"]) + int(f["waiting"]) <= 2 for f in shown)  # 40 atoms at most
    last = shown[-1]
    assert (last["converged"], last["unconverged"], last["quarantined"]) == ("2", "1", "1")
    assert (last["running"], last["waiting"]) == ("0", "0")
    reasons = [b.exit_reason for b in res.bands()]
    assert reasons == ["converged", "converged", "max_steps", "non_finite"]


def test_the_report_of_a_neb_store_has_one_row_per_band_and_plots_each_path(neb_run):
    res, _, folder = neb_run
    out = io.StringIO()
    summary = report(folder / "neb.zarr", plots=folder / "plots",
                     console=Console(file=out, width=160))  # fmt: skip
    expected = res.bands().to_pandas()
    rows = summary["bands"]
    assert [r["path_id"] for r in rows] == expected.path_id.tolist() == [0, 1, 2, 3]
    for r, (_, want) in zip(rows, expected.iterrows()):
        for key in ("n_images", "highest_image", "converged", "exit_reason"):
            assert r[key] == want[key], key
        for key in ("forward_barrier", "backward_barrier", "reaction_energy"):
            assert r[key] == pytest.approx(want[key], abs=1e-12), key
    printed = out.getvalue()
    assert "bands: 4 (2 converged, 1 max_steps, 1 non_finite)" in printed
    assert "quarantined (non_finite)" in printed and "-0.0000" not in printed
    first = next(line for line in printed.splitlines() if re.match(r"\W*0\W+4\W", line))
    assert f"{rows[0]['forward_barrier']:.4f}" in first  # path 0, 4 images
    assert (folder / "plots" / "neb_paths.png").stat().st_size > 0
    assert str(folder / "plots" / "neb_paths.png") in summary["plots"]
