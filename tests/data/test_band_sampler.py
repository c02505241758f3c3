"""The sampler never splits a nudged elastic band: fuzzed datasets of bands and single
structures, fuzzed budgets and graduations (hypothesis)."""

from __future__ import annotations

import numpy as np
import pytest
from ase import Atoms
from hypothesis import given, settings
from hypothesis import strategies as st

from alchemi_lit.core.errors import StructureError
from alchemi_lit.data import SizeAwareSampler


def dataset(units: list[tuple[int, int]]) -> tuple[list[Atoms], list[list[int]]]:
    """Structures of ``(images, atoms)`` units: images > 1 is a band (path_id = unit)."""
    out, groups = [], []
    for u, (images, atoms) in enumerate(units):
        groups.append(list(range(len(out), len(out) + images)))
        for _ in range(images):
            a = Atoms(f"H{atoms}", positions=np.arange(3 * atoms).reshape(-1, 3) * 1.5)
            if images > 1:
                a.info["path_id"] = 100 + u
            out.append(a)
    return out, groups


UNIT = st.tuples(st.sampled_from([1, 3, 4, 7]), st.integers(1, 9))  # (images, atoms)


@settings(max_examples=60, deadline=None)
@given(
    units=st.lists(UNIT, min_size=1, max_size=12),
    slack=st.integers(0, 40),
    seed=st.integers(0, 2**16),
)
def test_bands_come_out_whole_in_order_and_exactly_once(units, slack, seed):
    data, groups = dataset(units)
    need = max(len(g) * len(data[g[0]]) for g in groups)
    sampler = SizeAwareSampler(data, max_atoms=need + slack)
    rng = np.random.default_rng(seed)
    in_flight: list[list[int]] = []
    seen: list[int] = []
    while not sampler.exhausted:
        used = sum(len(data[i]) for unit in in_flight for i in unit)
        _, ids = sampler.take(need + slack - used, 1 << 30)
        if not ids and not in_flight:
            pytest.fail("nothing taken with the whole budget free")
        for g in groups:  # a band is taken whole or not at all, its images in order
            hit = [i for i in ids if i in g]
            assert hit in ([], g)
            if hit:
                at = ids.index(g[0])
                assert ids[at : at + len(g)] == g
        seen += ids
        in_flight += [g for g in groups if g[0] in ids]
        if in_flight:  # some finish (whole bands: a band's images leave together)
            done = rng.random(len(in_flight)) < 0.5
            in_flight = [u for u, d in zip(in_flight, done) if not d]
    assert sorted(seen) == list(range(len(data)))


def test_max_systems_counts_a_bands_images():
    data, _ = dataset([(4, 2), (1, 2), (3, 2)])
    sampler = SizeAwareSampler(data, max_atoms=100, max_systems=4)
    _, ids = sampler.take(100, 4)
    assert ids == [0, 1, 2, 3]  # the band of 4; the next unit needs a fifth slot
    _, ids = sampler.take(100, 4)
    assert ids == [4, 5, 6, 7]
    with pytest.raises(StructureError, match=r"band path_id 100 .* max_systems to at least 4"):
        SizeAwareSampler(data, max_atoms=100, max_systems=3)


def test_a_restart_leaves_out_a_band_only_when_all_its_images_are_stored():
    """``without`` (a restart skipping stored systems): a band with an image not stored
    runs again whole, never split; a band stored whole and single structures drop."""
    data, _ = dataset([(3, 2), (1, 2), (3, 2), (1, 2)])  # ids: band 0-2, 3, band 4-6, 7
    rest = SizeAwareSampler(data, max_atoms=100).without({0, 1, 3, 4, 5, 6})
    assert rest.system_ids.tolist() == [0, 1, 2, 7]
    _, ids = rest.take(100, 10)
    assert ids == [0, 1, 2, 7]


@pytest.mark.parametrize("big", [2, 3])
def test_a_refill_passes_at_most_lookahead_units_that_do_not_fit(big):
    """First fit looks past at most ``LOOKAHEAD`` structures that do not fit: with 3,
    a small structure behind 2 large ones is taken, behind 3 it is not."""
    data, _ = dataset([(1, 9)] * big + [(1, 1)])
    sampler = SizeAwareSampler(data, max_atoms=10)
    sampler.LOOKAHEAD = 3
    _, ids = sampler.take(5, 10)
    assert ids == ([big] if big < sampler.LOOKAHEAD else [])
