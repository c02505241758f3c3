"""The RDF's pair histogram: the numba kernel against the torch reference, and both
against ASE's ``get_rdf`` on mixed-element, triclinic and partly periodic frames."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.build import bulk
from ase.geometry.rdf import get_rdf

from alchemi_lit.core import rdf

RMAX, NBINS = 3.9, 30
PARTIALS = [(11, 17), (17, 11), (17, 17)]


def frames() -> list[Atoms]:
    """Rock salt rattled (two elements), a triclinic cell, a slab periodic in x and y."""
    salt = bulk("NaCl", "rocksalt", a=5.64, cubic=True).repeat((2, 2, 2))
    salt.rattle(0.1, seed=1)
    tri = bulk("NaCl", "rocksalt", a=5.64).repeat((4, 4, 4))  # (fcc primitive: triclinic)
    tri.rattle(0.1, seed=2)
    slab = salt.copy()
    slab.pbc = (True, True, False)
    slab.center(vacuum=4.0, axis=2)
    return [salt, tri, slab]


def batch(atoms: list[Atoms]) -> dict:
    n = torch.tensor([len(a) for a in atoms])
    out = {
        "positions": torch.tensor(np.concatenate([a.positions for a in atoms])),
        "cell": torch.tensor(np.stack([a.cell.array for a in atoms])),
        "pbc": torch.tensor(np.stack([a.pbc for a in atoms])),
        "system": torch.repeat_interleave(torch.arange(len(atoms)), n),
        "numbers": torch.tensor(np.concatenate([a.numbers for a in atoms])),
        "n_atoms": n,
    }
    out["pairs"] = rdf.all_pairs(n)
    out["weights"] = rdf.pair_weights(out["numbers"], *out["pairs"], PARTIALS)
    return out


def histogram(b: dict, reference: bool) -> torch.Tensor:
    run = rdf.pair_histogram.reference if reference else rdf.pair_histogram
    return run(b["positions"], b["cell"], b["pbc"], b["system"], b["numbers"], b["n_atoms"],
               b["pairs"], b["weights"], RMAX, NBINS, PARTIALS)  # fmt: skip


def test_the_pairs_are_every_unordered_pair_once() -> None:
    i, j = rdf.all_pairs(torch.tensor([3, 0, 2]))
    assert list(zip(i.tolist(), j.tolist())) == [(0, 1), (0, 2), (1, 2), (3, 4)]


def test_kernel_counts_equal_the_torch_reference() -> None:
    pytest.importorskip("numba")
    b = batch(frames())
    assert rdf.pair_histogram.choose(
        b["positions"], b["cell"], b["pbc"], b["system"], b["numbers"], b["n_atoms"]
    ) == "numba"
    got, want = histogram(b, False), histogram(b, True)
    assert want.sum() > 0 and torch.equal(got, want)


@pytest.mark.parametrize("reference", [False, True])
def test_rdf_frame_equals_ases_total_and_partials(reference: bool, monkeypatch) -> None:
    """g(r) of each frame, total and by element pair (a != b both ways, a == b), equals
    ``get_rdf(..., elements=)``; one batch of all three frames (so no batch mate changes a
    system's counts)."""
    if reference:
        monkeypatch.setattr(rdf.pair_histogram, "implementations", [])
    atoms = frames()
    b = batch(atoms)
    g = rdf.rdf_frame(b["positions"], b["cell"], b["pbc"], b["system"], b["numbers"],
                      b["n_atoms"], b["pairs"], b["weights"], RMAX, NBINS, PARTIALS)  # fmt: skip
    g = g.numpy()
    for k, a in enumerate(atoms):
        np.testing.assert_allclose(g[k, 0], get_rdf(a, RMAX, NBINS, no_dists=True),
                                   rtol=0, atol=1e-10)  # fmt: skip
        for p, pair in enumerate(PARTIALS):
            want = get_rdf(a, RMAX, NBINS, elements=pair, no_dists=True)
            np.testing.assert_allclose(g[k, 1 + p], want, rtol=0, atol=1e-10)


def test_a_system_alone_has_the_counts_it_has_in_the_batch() -> None:
    atoms = frames()
    whole = histogram(batch(atoms), False)
    for k, a in enumerate(atoms):
        assert torch.equal(histogram(batch([a]), False)[0], whole[k])
