"""Per-system sums and broadcasts (``Batch.segments``) against plain index_add_/gather."""

from __future__ import annotations

import torch
from ase.build import bulk, molecule

from alchemi_lit import Batch


def ragged_batch() -> Batch:
    systems = [
        bulk("Cu", "fcc", a=3.6).repeat((2, 1, 1)),
        molecule("H2O"),
        bulk("Si", "diamond", a=5.43),
        molecule("CH4"),
    ]
    return Batch.from_atoms(systems, dtype=torch.float64)


def test_sums_match_index_add_reference():
    b = ragged_batch()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(b.num_atoms, dtype=torch.float64, generator=g)
    x3 = torch.randn(b.num_atoms, 3, dtype=torch.float64, generator=g)
    idx = b.system_idx
    ref = torch.zeros(b.num_systems, dtype=x.dtype).index_add_(0, idx, x)
    ref3 = torch.zeros(b.num_systems, 3, dtype=x.dtype).index_add_(0, idx, x3)
    seg = b.segments
    torch.testing.assert_close(seg.sum(x), ref, rtol=0, atol=1e-13)
    torch.testing.assert_close(seg.sum(x3), ref3, rtol=0, atol=1e-13)
    torch.testing.assert_close(seg.sum_xyz(x3), ref3.sum(-1), rtol=0, atol=1e-13)
    # integers take the index_add_ path and stay integers
    counts = seg.sum(torch.ones(b.num_atoms, dtype=torch.int64))
    assert counts.tolist() == b.n_atoms.tolist()
    # non-finite values stay in their own system
    x[0] = float("nan")
    out = seg.sum(x)
    assert torch.isnan(out[0]) and torch.isfinite(out[1:]).all()


def test_broadcasts_and_masses_cache():
    b = ragged_batch()
    seg = b.segments
    per_system = torch.arange(b.num_systems, dtype=torch.float64) + 0.5
    (spread,) = seg.to_xyz(per_system)
    assert spread.shape == (b.num_atoms, 3) and spread.is_contiguous()
    torch.testing.assert_close(spread, per_system[b.system_idx].unsqueeze(-1).expand(-1, 3))
    assert torch.equal(seg.to_atoms(per_system), per_system[b.system_idx])
    m3 = seg.atom_xyz(b.masses)
    assert torch.equal(m3, b.masses.unsqueeze(-1).expand(-1, 3))
    assert seg.atom_xyz(b.masses) is m3  # kept while the masses are unchanged
    b.masses.mul_(2.0)  # written in place: rebuilt
    assert torch.equal(seg.atom_xyz(b.masses)[:, 0], b.masses)
    b.masses = b.masses * 0.5  # replaced: rebuilt
    assert torch.equal(seg.atom_xyz(b.masses)[:, 2], b.masses)


def test_cache_follows_the_layout():
    b = ragged_batch()
    first = b.segments
    assert b.segments is first
    sub = b.select([3, 0])
    assert sub.segments is not first
    x = torch.ones(sub.num_atoms, dtype=torch.float64)
    assert sub.segments.sum(x).tolist() == sub.n_atoms.to(torch.float64).tolist()
    b.system_idx = b.system_idx.clone()  # reassigning the index drops the cache
    assert b.segments is not first


def test_local_index_counts_atoms_within_each_system():
    from alchemi_lit.core.random import local_atom_index

    b = ragged_batch()
    assert torch.equal(b.segments.local_index, local_atom_index(b.system_idx, b.ptr))
    assert b.segments.local_index[b.ptr[:-1]].tolist() == [0] * b.num_systems


def test_to_xyz_numpy_path_equals_the_gather():
    """On CPU ``to_xyz`` repeats runs with NumPy; it must equal the index gather exactly,
    for several values at once, float32, and tensors that track gradients (gathered)."""
    b = ragged_batch()
    seg = b.segments
    g = torch.Generator().manual_seed(1)
    for dtype in (torch.float64, torch.float32):
        values = [torch.randn(b.num_systems, generator=g).to(dtype) for _ in range(3)]
        got = seg.to_xyz(*values)
        for v, out in zip(values, got):
            ref = v.index_select(0, seg.xyz_index).view(b.num_atoms, 3)
            assert out.dtype == dtype and out.is_contiguous() and torch.equal(out, ref)
    mixed = seg.to_xyz(torch.ones(b.num_systems), torch.ones(b.num_systems, dtype=torch.float64))
    assert [t.dtype for t in mixed] == [torch.float32, torch.float64]
    w = torch.randn(b.num_systems, dtype=torch.float64, requires_grad=True)
    (spread,) = seg.to_xyz(w)
    spread.sum().backward()  # still differentiable: 3 components per atom
    assert torch.equal(w.grad, 3.0 * b.n_atoms.to(torch.float64))


def test_derived_masses_kept_until_the_masses_change():
    b = ragged_batch()
    seg = b.segments
    calls = []

    def inverse(m3: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return 0.5 / m3

    first = seg.derived_xyz(b.masses, ("dt/m", 0.5), inverse)
    assert torch.equal(first[:, 1], 0.5 / b.masses)
    assert seg.derived_xyz(b.masses, ("dt/m", 0.5), inverse) is first and len(calls) == 1
    b.masses.mul_(2.0)  # written in place: recomputed
    assert torch.equal(seg.derived_xyz(b.masses, ("dt/m", 0.5), inverse)[:, 0], 0.5 / b.masses)
    assert len(calls) == 2
    for k in range(50):  # a time step changing every call keeps a bounded number
        seg.derived_xyz(b.masses, ("dt/m", 0.01 * k), lambda m, k=k: 0.01 * k / m)
    assert len(seg._derived) <= 8


def test_force_norms_computed_once_per_forces():
    b = ragged_batch()
    b.forces = torch.randn(b.num_atoms, 3, dtype=torch.float64)
    f2 = b.force_sq_norms()
    torch.testing.assert_close(f2, (b.forces**2).sum(-1), rtol=1e-15, atol=0)
    assert b.force_sq_norms() is f2
    b.forces.mul_(2.0)  # written in place
    torch.testing.assert_close(b.force_sq_norms(), 4.0 * f2, rtol=1e-15, atol=0)
    b.forces = torch.zeros_like(b.forces)  # replaced
    assert float(b.force_sq_norms().sum()) == 0.0


def test_fixed_atom_check_follows_the_fixed_field():
    b = ragged_batch()
    assert not b.may_have_fixed_atoms()
    b.fixed[3] = True  # written in place
    assert b.may_have_fixed_atoms()
    b.fixed = torch.zeros_like(b.fixed)  # replaced
    assert not b.may_have_fixed_atoms()
