"""Bands through the whole engine: built by ASE's interpolation, many at once (bit for
bit as alone, refilled whole), results per band, bad bands refused before any model
call, a failing image quarantining its band, kill and resume mid-band bit-identical."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import torch
from ase.io import read
from ase.mep import NEB as AseNEB
from neb_cases import hop, tutorial_band

import alchemi_lit as al
from alchemi_lit.callbacks import Checkpoint, HookStageEnum, LambdaCallback
from alchemi_lit.core.errors import ConfigError, StructureError
from alchemi_lit.core.state import Batch
from alchemi_lit.data import SizeAwareSampler
from alchemi_lit.integrators import BFGS, FIRE, NEB
from alchemi_lit.models import EMT
from alchemi_lit.workflows import band_results, label_bands, make_band

CASES = [  # (metal, adatom, direction, images): eight different bands
    ("Al", "Au", 0, 5), ("Cu", "Cu", 1, 4), ("Al", "Al", 1, 6), ("Cu", "Ag", 0, 3),
    ("Al", "Cu", 0, 4), ("Cu", "Au", 1, 5), ("Al", "Ni", 1, 3), ("Cu", "Pd", 0, 6),
]  # fmt: skip


def eight_bands() -> list:
    bands = [make_band(*hop(m, a, d), n, "linear") for m, a, d, n in CASES]
    return label_bands(bands)


def neb_sim(**kw: Any) -> al.Simulator:
    stage = FIRE(fmax=0.05, max_steps=25, band=NEB(climb=True, climb_after=10))
    return al.Simulator(model=EMT(), stages=stage, precision="64", seed=0, **kw)


_RUNS: dict[tuple, al.Results] = {}


def eight_bands_run(max_atoms: int) -> al.Results:
    """``neb_sim``'s run of the eight bands refilled within ``max_atoms`` (made once: the
    batching and the kill-and-resume tests compare with the same run)."""
    if ("eight", max_atoms) not in _RUNS:
        sampler = SizeAwareSampler(eight_bands(), max_atoms=max_atoms)
        _RUNS["eight", max_atoms] = neb_sim().run(sampler)
    return _RUNS["eight", max_atoms]


def band_alone(start: int, n: int) -> al.Results:
    """``neb_sim``'s run of the band of ``eight_bands()[start : start + n]`` alone."""
    if ("alone", start, n) not in _RUNS:
        _RUNS["alone", start, n] = neb_sim().run(eight_bands()[start : start + n])
    return _RUNS["alone", start, n]


def test_make_band_is_ase_interpolation_tagged_by_path():
    initial, final = hop("Al", "Au", 0)
    for how in ("linear", "idpp"):
        band = make_band(initial, final, 5, interpolation=how, path_id=4)
        ase_images = [initial.copy() for _ in range(4)] + [final.copy()]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            AseNEB(ase_images, method="improvedtangent").interpolate(method=how)
        assert [a.info["path_id"] for a in band] == [4] * 5
        for mine, theirs in zip(band, ase_images):
            np.testing.assert_allclose(mine.positions, theirs.positions, atol=1e-12)
    with pytest.raises(ConfigError, match="at least 3"):
        make_band(initial, final, 2)


@pytest.mark.parametrize("max_atoms", [70, 1000])  # refilled band by band; all at once
def test_a_batch_of_eight_bands_equals_each_band_alone_bit_for_bit(max_atoms):
    together = band_results(eight_bands_run(max_atoms))
    assert len(together) == 8
    start = 0
    for band in together:
        n = len(band.images)
        alone = band_results(band_alone(start, n))[0]
        start += n
        assert band.steps == alone.steps
        for a, b in zip(band.images, alone.images):
            assert np.array_equal(a.positions, b.positions)
            assert a.get_potential_energy() == b.get_potential_energy()


def test_band_results_one_row_per_band_and_one_file_per_band(tmp_path):
    res = neb_sim().run(eight_bands())
    bands = band_results(res)
    table = bands.to_pandas()
    assert len(table) == 8 and table.path_id.tolist() == list(range(8))
    band = bands.band(5)
    e = band.energies
    assert len(e) == CASES[5][3] and band.highest_image == 1 + int(np.argmax(e[1:-1]))
    assert band.forward_barrier == pytest.approx(e.max() - e[0])
    assert band.backward_barrier == pytest.approx(e.max() - e[-1])
    assert band.reaction_energy == pytest.approx(e[-1] - e[0])
    assert band.fitted_barrier >= band.forward_barrier - 1e-9  # the fit reaches the top
    paths = bands.write(tmp_path)
    back = read(paths[5], index=":")
    assert len(back) == len(band.images)
    assert back[2].get_potential_energy() == pytest.approx(band.energies[2])


def untagged(atoms):
    plain = atoms.copy()
    plain.info.pop("path_id")
    return plain


@pytest.mark.parametrize(
    "spoil,match",
    [
        (lambda d: d.__setitem__(2, d[2][:-1]), "image 2 has 12 atoms"),
        (lambda d: d[1].numbers.__setitem__(slice(-2, None), [79, 13]), "another species order"),
        (lambda d: d[3].set_cell(d[3].cell * 1.01, scale_atoms=True), "another periodic cell"),
        (lambda d: d[3].set_pbc(False), "pbc"),
        (lambda d: [d.pop(1), d.pop(1), d.pop(1)], "has 2 image"),
        (lambda d: d.insert(2, untagged(d[0])), "not contiguous"),
    ],
)
def test_a_bad_band_is_refused_naming_it_before_anything_runs(spoil, match):
    data = label_bands([tutorial_band()])
    for img in data:
        img.info.pop("n_images")
    spoil(data)
    with pytest.raises(StructureError, match=rf"band path_id 0.*{match}"):
        neb_sim().run(SizeAwareSampler(data, max_atoms=100))


def test_a_band_larger_than_the_budget_is_refused():
    with pytest.raises(StructureError, match=r"band path_id 0 .* raise max_atoms to at least 65"):
        SizeAwareSampler(label_bands([tutorial_band()]), max_atoms=40)
    with pytest.raises(StructureError, match="raise max_systems to at least 5"):
        SizeAwareSampler(label_bands([tutorial_band()]), max_atoms=100, max_systems=4)


class PoisonedEMT(EMT):
    """EMT whose energy of system ``sid`` turns NaN at evaluation ``at``."""

    def __init__(self, sid: int, at: int) -> None:
        super().__init__()
        self.sid, self.at, self.calls = sid, at, 0

    def forward(self, batch: Batch, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        out = super().forward(batch, *args, **kwargs)
        self.calls += 1
        if self.calls == self.at and bool((batch.system_id == self.sid).any()):
            out["energy"] = out["energy"].clone()
            out["energy"][int((batch.system_id == self.sid).nonzero())] = float("nan")
        return out


def test_a_band_whose_image_blows_up_is_quarantined_whole_and_the_others_finish():
    data = eight_bands()
    sid = CASES[0][3] + 2  # an interior image of band 1
    stage = FIRE(fmax=0.05, max_steps=25, band=NEB())
    sim = al.Simulator(model=PoisonedEMT(sid, 6), stages=stage, precision="64", seed=0)
    res = sim.run(data)
    bands = res.bands()  # the Results method and the function are one
    assert [b.path_id for b in bands] == [b.path_id for b in band_results(res)]
    broken = bands.band(1)
    assert broken.exit_reason == "non_finite" and not broken.converged
    assert all(img.info["exit_reason"] == "non_finite" for img in broken.images[1:-1])
    others = [b for b in bands if b.path_id != 1]
    assert all(b.exit_reason in ("converged", "max_steps") for b in others)
    assert all(b.steps == 25 or b.converged for b in others)


class Crash(Exception):
    pass


@pytest.mark.parametrize("crash_step", [7, 16])
def test_killed_mid_band_and_resumed_is_bit_identical(tmp_path, crash_step):
    def sim(extra=()):
        return neb_sim(callbacks=[Checkpoint(tmp_path / "ckpt", every=5), *extra])

    def boom(ctx):
        if ctx.step == crash_step:
            raise Crash

    data = eight_bands()
    reference = eight_bands_run(70)
    with pytest.raises(Crash):
        sim([LambdaCallback(HookStageEnum.AFTER_STEP, boom)]).run(
            SizeAwareSampler(data, max_atoms=70)
        )
    resumed = sim().run(SizeAwareSampler(data, max_atoms=70), resume=str(tmp_path / "ckpt"))
    a, b = reference.batch, resumed.batch
    assert a.system_id.tolist() == b.system_id.tolist() == list(range(len(data)))
    for key in ("positions", "forces", "energy", "total_steps", "exit_code", "converged"):
        assert torch.equal(getattr(a, key), getattr(b, key)), key


def test_bfgs_bands_in_one_batch_equal_bands_alone():
    data = eight_bands()[:18]  # bands 0-3 (5 + 4 + 6 + 3 images)
    stage = BFGS(fmax=0.05, max_steps=15, band=NEB(), max_atoms=60)
    sim = al.Simulator(model=EMT(), stages=stage, precision="64", seed=0)
    together = band_results(sim.run(data))
    alone = band_results(sim.run(data[9:15]))[0]
    assert alone.path_id == 2
    for a, b in zip(together.band(2).images, alone.images):
        assert np.array_equal(a.positions, b.positions)


def test_a_fused_relax_then_band_relaxes_the_endpoints_first_then_the_band():
    """``FIRE() + FIRE(band=NEB())``: the endpoints relax in the first stage while the
    images wait (no step, no move); the band then runs exactly as a band made of the
    relaxed endpoints and the same images would."""
    data = label_bands([make_band(*hop("Cu", "Au", 0), 5, "linear"),
                        make_band(*hop("Al", "Cu", 1), 4, "linear")])  # fmt: skip
    relax, neb = FIRE(fmax=0.02, max_steps=200), FIRE(fmax=0.05, max_steps=40, band=NEB())
    sim = al.Simulator(model=EMT(), stages=relax + neb, precision="64", seed=0)
    res = sim.run(SizeAwareSampler(data, max_atoms=100))
    ends, inner = [0, 4, 5, 8], [1, 2, 3, 6, 7]
    assert (res.batch.stage_steps[ends, 0] > 0).all() and (
        res.batch.stage_steps[inner, 0] == 0
    ).all()
    # the reference: endpoints relaxed alone, then the band from them
    alone = al.Simulator(model=EMT(), stages=FIRE(fmax=0.02, max_steps=200), precision="64")
    relaxed = alone.run([data[k].copy() for k in ends]).to_atoms()
    for k, r in zip(ends, relaxed):
        assert np.array_equal(r.positions, res[k].positions)
    rebuilt = [data[k].copy() for k in range(len(data))]
    for k, r in zip(ends, relaxed):
        rebuilt[k].positions = r.positions
    ref = al.Simulator(model=EMT(), stages=neb, precision="64", seed=0).run(rebuilt)
    for k in inner:
        assert np.array_equal(ref[k].positions, res[k].positions)
        assert ref.batch.stage_steps[k, 0] == res.batch.stage_steps[k, 1]


def test_replicas_shard_whole_bands():
    from alchemi_lit.strategies.distributed import shard

    data = eight_bands()
    sampler = SizeAwareSampler(data, max_atoms=200)
    parts = [shard(sampler, 3, i) for i in range(3)]
    assert sorted(s for p in parts for s in p.system_ids.tolist()) == list(range(len(data)))
    for part in parts:
        assert all(stop - start == CASES[path][3] for path, start, stop in part.bands)
