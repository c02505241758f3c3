"""Batch: ASE round trip, validation, select/concatenate, casts (kinetics: test_state_kinetics)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.calculators.singlepoint import SinglePointCalculator
from ase.constraints import FixAtoms, FixInternals, FixScaled
from ase.md import velocitydistribution

from alchemi_lit import Batch, StructureError
from alchemi_lit.core.errors import StructureWarning
from alchemi_lit.core.state import ATOM_FIELDS, EXIT_CONVERGED, EXIT_MAX_STEPS, SYSTEM_FIELDS
from conftest import (
    cluster_argon,
    mixed_pbc_argon,
    perturbed_argon,
    rng_for,
    slab_argon,
    triclinic_argon,
)

DT = torch.float64
# ASE >= 3.26 deprecates MaxwellBoltzmannDistribution in favour of thermalize_momenta
thermalize = getattr(
    velocitydistribution, "thermalize_momenta", velocitydistribution.MaxwellBoltzmannDistribution
)


def rich_structures(seed: int = 0) -> list[Atoms]:
    """Structures carrying every field from_atoms keeps (momenta, tags, masses, ...)."""
    structures = [
        perturbed_argon(1, 1, 0.1, seed)[0],
        triclinic_argon(2, 0.1, 0.05, seed + 1),
        mixed_pbc_argon((True, False, True), 1, 0.1, seed + 2),
        slab_argon(1, 2, 0.1, seed + 3),
        cluster_argon(4.0, 0.1, seed + 4),
    ]
    rng = rng_for(seed + 5)
    for k, atoms in enumerate(structures):
        n = len(atoms)
        atoms.set_tags(rng.integers(0, 5, size=n))
        masses = atoms.get_masses()
        if k % 2 == 0:
            masses = rng.uniform(10.0, 80.0, size=n)  # custom masses
        atoms.set_masses(masses)
        if k != 1:
            atoms.set_constraint(FixAtoms(indices=rng.choice(n, size=2, replace=False)))
        atoms.set_momenta(rng.normal(size=(n, 3)) * 3.0)  # constraint zeroes fixed atoms
        atoms.info.update(name=f"structure-{k}", charge=k - 2, tags_sum=int(atoms.get_tags().sum()))
    return structures


def assert_same_atoms(a: Atoms, b: Atoms) -> None:
    np.testing.assert_array_equal(a.numbers, b.numbers)
    np.testing.assert_allclose(a.positions, b.positions, rtol=0, atol=1e-12)
    np.testing.assert_allclose(a.cell.array, b.cell.array, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(a.pbc, b.pbc)
    np.testing.assert_allclose(a.get_masses(), b.get_masses(), rtol=1e-14)
    np.testing.assert_allclose(a.get_momenta(), b.get_momenta(), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(a.get_tags(), b.get_tags())
    fixed = [sorted(c.index.tolist()) for c in a.constraints]
    assert fixed == [sorted(c.index.tolist()) for c in b.constraints]
    assert all(isinstance(c, FixAtoms) for c in b.constraints)


# ---------------------------------------------------------------------- round trip
def test_round_trip_keeps_everything_in_system_id_order() -> None:
    structures = rich_structures()
    ids = [30, 10, 40, 0, 20]  # shuffled
    batch = Batch.from_atoms(structures, system_ids=ids, dtype=DT)
    assert batch.num_systems == 5 and batch.num_atoms == sum(len(a) for a in structures)
    assert batch.system_id.tolist() == ids
    out = batch.to_atoms(results=False)
    order = np.argsort(ids)
    assert len(out) == len(structures)
    for got, k in zip(out, order):
        ref = structures[k]
        assert_same_atoms(ref, got)
        assert got.info == ref.info  # results=False adds nothing
        assert got.calc is None


def test_round_trip_results_info_and_fixed_mask() -> None:
    structures = rich_structures(seed=1)
    batch = Batch.from_atoms(structures, system_ids=[4, 3, 2, 1, 0], dtype=DT)
    fixed = torch.cat(
        [
            torch.as_tensor(np.isin(np.arange(len(a)), a.constraints[0].index))
            if a.constraints
            else torch.zeros(len(a), dtype=torch.bool)
            for a in structures
        ]
    )
    assert torch.equal(batch.fixed, fixed)
    assert not bool(batch.velocities[batch.fixed].any())
    out = batch.to_atoms()
    for got, ref in zip(out, structures[::-1]):
        assert_same_atoms(ref, got)
        for key in ("system_id", "status", "steps", "converged", "exit_reason"):
            assert key in got.info
        assert got.info["name"] == ref.info["name"]
        assert got.calc is None  # energy still NaN: nothing computed yet


def test_unsupported_constraints_raise_naming_the_system() -> None:
    for bad in (FixScaled(0, mask=(True, False, False)), FixInternals(bonds=[(2.0, [0, 1])])):
        structures = perturbed_argon(3, 1, 0.1, seed=2)
        structures[2].set_constraint(bad)
        with pytest.raises(StructureError, match="system 2") as err:
            Batch.from_atoms(structures)
        assert type(bad).__name__ in str(err.value)
        assert "FixAtoms" in str(err.value)  # the fix: express it with FixAtoms
        assert err.value.system_index == 2
    # also without validation: dropping a constraint would silently change physics
    with pytest.raises(StructureError, match="system 2"):
        Batch.from_atoms(structures, validate=False)


# ---------------------------------------------------------------------- validation
def _with_bad_system(index: int, bad: Atoms) -> list[Atoms]:
    structures = perturbed_argon(3, 1, 0.1, seed=3)
    structures.insert(index, bad)
    return structures


def _nan_positions() -> Atoms:
    a = perturbed_argon(1, 1, 0.1, seed=4)[0]
    a.positions[1, 2] = np.nan
    return a


def _inf_positions() -> Atoms:
    a = perturbed_argon(1, 1, 0.1, seed=4)[0]
    a.positions[3, 0] = -np.inf
    return a


def _masses(values) -> Atoms:
    a = perturbed_argon(1, 1, 0.1, seed=4)[0]
    m = a.get_masses()
    m[: len(values)] = values
    a.set_masses(m)
    return a


def _singular(cell, pbc) -> Atoms:
    return Atoms("Ar2", positions=[[0, 0, 0], [1.9, 1.9, 1.9]], cell=cell, pbc=pbc)


@pytest.mark.parametrize(
    ("make", "hint"),
    [
        (lambda: Atoms(), "remove it"),
        (_nan_positions, "fix or drop"),
        (_inf_positions, "fix or drop"),
        (lambda: _masses([0.0]), "set positive masses"),
        (lambda: _masses([39.9, -1.0]), "set positive masses"),
        (lambda: _singular(np.zeros((3, 3)), True), "give a full cell"),
        (lambda: _singular([[4, 0, 0], [0, 4, 0], [0, 0, 0]], True), "give a full cell"),
        (lambda: _singular([[4, 0, 0], [8, 0, 0], [0, 0, 4]], [True, True, False]), "pbc=False"),
        (lambda: _singular([[4, 0, 0], [0, 4, 0], [4, 4, 0]], True), "give a full cell"),
    ],
    ids=[
        "empty",
        "nan",
        "inf",
        "zero-mass",
        "negative-mass",
        "zero-cell",
        "zero-vector",
        "parallel-periodic",
        "coplanar",
    ],
)
@pytest.mark.parametrize("index", [0, 2])
def test_validation_errors_name_system_and_fix(make, hint: str, index: int) -> None:
    structures = _with_bad_system(index, make())
    with pytest.raises(StructureError) as err:
        Batch.from_atoms(structures)
    assert isinstance(err.value, ValueError)
    assert f"system {index}" in str(err.value)
    assert hint in str(err.value)
    assert err.value.system_index == index


def test_input_list_errors() -> None:
    with pytest.raises(StructureError, match="no structures"):
        Batch.from_atoms([])
    structures = perturbed_argon(2, 1, 0.1)
    with pytest.raises(ValueError, match="system_ids"):
        Batch.from_atoms(structures, system_ids=[0])
    with pytest.raises(ValueError, match="unique"):
        Batch.from_atoms(structures, system_ids=[5, 5])


@pytest.mark.parametrize("ids", [[0.5, 1.7], [0, float("nan")], ["a", 1], [True, 2]])
def test_system_ids_that_are_not_whole_numbers_are_refused(ids: list) -> None:
    """Not truncated: 0.5 and 1.7 would silently become ids 0 and 1 -- by a Batch or a
    SizeAwareSampler alike."""
    from alchemi_lit.data import SizeAwareSampler

    message = r"system_ids must be whole numbers.*pass integers"
    with pytest.raises(StructureError, match=message):
        Batch.from_atoms(perturbed_argon(2, 1, 0.1), system_ids=ids)
    with pytest.raises(StructureError, match=message):
        SizeAwareSampler(perturbed_argon(2, 1, 0.1), max_atoms=8, system_ids=ids)


def test_system_ids_of_numpy_and_torch_integers_are_taken() -> None:
    structures = perturbed_argon(3, 1, 0.1)
    for ids in (np.array([7, 3, 5]), torch.tensor([7, 3, 5]), [7.0, 3, np.int32(5)]):
        assert Batch.from_atoms(structures, system_ids=ids).system_id.tolist() == [7, 3, 5]


def test_close_atoms_warn_with_system_index() -> None:
    structures = perturbed_argon(3, 1, 0.05, seed=6)
    structures[1].positions[2] = structures[1].positions[0] + [0.3, 0.0, 0.0]
    with pytest.warns(StructureWarning) as record:
        batch = Batch.from_atoms(structures)  # a warning, not an error
    assert batch.num_systems == 3
    assert len(record) == 1
    assert "system 1" in str(record[0].message) and "0.300" in str(record[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error", StructureWarning)
        Batch.from_atoms(structures, min_distance=0.2)  # threshold respected
        Batch.from_atoms(structures, validate=False)


def test_close_periodic_images_warn() -> None:
    atoms = Atoms("Ar2", positions=[[0.1, 1, 1], [3.8, 1, 1]], cell=[4.0, 4.0, 4.0], pbc=True)
    with pytest.warns(StructureWarning) as record:
        Batch.from_atoms([perturbed_argon(1, 1)[0], atoms])
    assert len(record) == 1 and "system 1" in str(record[0].message)


def test_slab_with_zero_third_vector_is_accepted(log_messages) -> None:
    slab = slab_argon(2, 2, 0.1, seed=7)
    assert not slab.cell.array[2].any()
    batch = Batch.from_atoms([slab], dtype=DT)
    assert batch.pbc.tolist() == [[True, True, False]]
    assert float(batch.volume[0]) == 0.0
    assert not [m for level, m in log_messages if level == "WARNING"]
    # without any cell, non-periodic: accepted as well
    Batch.from_atoms([cluster_argon(4.0, 0.1, seed=8)], dtype=DT)


# ---------------------------------------------------------------------- select/concat
def _batch_with_extras(seed: int = 0) -> Batch:
    batch = Batch.from_atoms(rich_structures(seed), system_ids=[7, 3, 5, 1, 9], dtype=DT)
    g = torch.Generator().manual_seed(seed)
    batch.ensure_field("fire_dt", "system", fill=0.1)
    batch.fire_dt = torch.rand(batch.num_systems, generator=g, dtype=DT)
    batch.ensure_field("chain", "system", shape=(2, 3), dtype=torch.int64)
    batch.chain = torch.randint(0, 100, (batch.num_systems, 2, 3), generator=g)
    batch.ensure_field("buffer", "atom", shape=(3,))
    batch.buffer = torch.randn((batch.num_atoms, 3), generator=g, dtype=DT)
    batch.ensure_field("flag", "atom", dtype=torch.bool)
    batch.flag = torch.rand(batch.num_atoms, generator=g) > 0.5
    batch.energy = torch.randn(batch.num_systems, generator=g, dtype=DT)
    batch.forces = torch.randn((batch.num_atoms, 3), generator=g, dtype=DT)
    batch.step = torch.arange(batch.num_systems) * 3
    return batch


def assert_rows_equal(sub: Batch, full: Batch, rows: list[int]) -> None:
    assert set(sub.atom) == set(full.atom) and set(sub.system) == set(full.system)
    aidx = torch.cat([torch.arange(int(full.ptr[r]), int(full.ptr[r + 1])) for r in rows])
    for k, v in full.atom.items():
        if k == "system_idx":
            continue
        assert torch.equal(sub.atom[k], v[aidx]), k
    for k, v in full.system.items():
        assert torch.equal(sub.system[k], v[rows]), k
    expected_idx = torch.repeat_interleave(torch.arange(len(rows)), full.n_atoms[rows])
    assert torch.equal(sub.system_idx, expected_idx)
    assert sub.layout is not full.layout


@pytest.mark.parametrize("rows", [[3, 0], [4], [0, 1, 2, 3, 4], [2, 4, 1]])
def test_select_keeps_every_field(rows: list[int]) -> None:
    batch = _batch_with_extras()
    sub = batch.select(rows)
    assert_rows_equal(sub, batch, rows)
    assert set(sub.info) == {int(batch.system_id[r]) for r in rows}
    assert torch.equal(batch.select(torch.tensor(rows)).positions, sub.positions)


def test_select_with_boolean_mask() -> None:
    batch = _batch_with_extras()
    mask = torch.tensor([True, False, True, False, True])
    sub = batch.select(mask)
    assert_rows_equal(sub, batch, [0, 2, 4])
    assert batch.select([]).num_systems == 0


def test_concatenate_round_trip() -> None:
    batch = _batch_with_extras(seed=1)
    parts = [batch.select([0, 1]), batch.select([2]), batch.select([3, 4])]
    joined = Batch.concatenate(parts)
    assert_rows_equal(joined, batch, [0, 1, 2, 3, 4])
    assert joined.info == batch.info
    shuffled = Batch.concatenate([parts[2], parts[0]])
    assert_rows_equal(shuffled, batch, [3, 4, 0, 1])
    single = Batch.concatenate([parts[1]])
    assert_rows_equal(single, batch, [2])
    single.positions += 1.0  # a new batch, as with several: the part is untouched
    single.info[int(single.system_id[0])]["name"] = "changed"
    assert_rows_equal(parts[1], batch, [2])
    assert parts[1].info == {5: batch.info[5]} and batch.info[5]["name"] == "structure-2"
    with pytest.raises(ValueError):
        Batch.concatenate([])


def test_concatenate_fills_missing_fields_with_zeros() -> None:
    a = _batch_with_extras(seed=2).select([0, 1])
    b = Batch.from_atoms(perturbed_argon(2, 1, 0.1, seed=3), system_ids=[50, 51], dtype=DT)
    joined = Batch.concatenate([a, b])
    assert joined.num_systems == 4 and joined.num_atoms == a.num_atoms + b.num_atoms
    assert torch.equal(joined.fire_dt[:2], a.fire_dt)
    assert not bool(joined.fire_dt[2:].any())
    assert joined.chain.dtype == torch.int64 and joined.chain.shape == (4, 2, 3)
    assert not bool(joined.buffer[a.num_atoms :].any())
    assert joined.flag.dtype == torch.bool
    assert torch.equal(joined.system_idx, torch.repeat_interleave(torch.arange(4), joined.n_atoms))
    assert torch.equal(joined.positions, torch.cat([a.positions, b.positions]))


def test_to_float32_casts_only_float_fields() -> None:
    batch = _batch_with_extras(seed=3)
    low = batch.to(dtype=torch.float32)
    assert low.dtype == torch.float32
    for store in ("atom", "system"):
        for k, v in getattr(batch, store).items():
            w = getattr(low, store)[k]
            if v.is_floating_point():
                assert w.dtype == torch.float32, k
                torch.testing.assert_close(w, v.to(torch.float32), equal_nan=True)
            else:
                assert w.dtype == v.dtype and torch.equal(w, v), k
    assert low.layout is not batch.layout
    assert batch.dtype == DT  # the original is untouched


def test_core_fields_and_setattr_checks() -> None:
    batch = Batch.from_atoms(perturbed_argon(2, 1), dtype=DT)
    assert set(ATOM_FIELDS) <= set(batch.atom) and set(SYSTEM_FIELDS) <= set(batch.system)
    assert torch.isnan(batch.energy).all()
    with pytest.raises(ValueError, match="leading size"):
        batch.energy = torch.zeros(3, dtype=DT)
    with pytest.raises(AttributeError, match="ensure_field"):
        batch.not_a_field = torch.zeros(2)
    with pytest.raises(AttributeError):
        _ = batch.not_a_field
    with pytest.raises(ValueError, match="already exists"):
        batch.ensure_field("energy", "atom")
    with pytest.raises(ValueError, match="kind must be 'atom' or 'system', got 'atoms'"):
        batch.ensure_field("per_atom", "atoms", shape=(3,))  # type: ignore[arg-type]
    assert not batch.has_field("per_atom")
    f = batch.ensure_field("x", "system", fill=2.5)
    assert f.dtype == DT and f.tolist() == [2.5, 2.5]  # the batch's float dtype, filled
    assert batch.ensure_field("x", "system", fill=9.0) is f  # existing field is kept
    g = batch.ensure_field("count", "atom", shape=(2,), dtype=torch.int64, fill=7)
    assert g.shape == (8, 2) and g.dtype == torch.int64 and bool((g == 7).all())
    assert batch.ptr.tolist() == [0, 4, 8]
    assert batch.atom_mask(torch.tensor([False, True])).tolist() == [False] * 4 + [True] * 4


# ---------------------------------------------------------------------- results
def test_to_atoms_attaches_results() -> None:
    structures = [*perturbed_argon(2, 1, 0.1, seed=5), slab_argon(1, 2, 0.1, seed=6)]
    batch = Batch.from_atoms(structures, system_ids=[2, 0, 1], dtype=DT)
    g = torch.Generator().manual_seed(0)
    batch.energy = torch.tensor([-1.5, float("nan"), -3.25], dtype=DT)  # row 1 not evaluated
    batch.forces = torch.randn((batch.num_atoms, 3), generator=g, dtype=DT)
    stress = torch.randn((3, 3, 3), generator=g, dtype=DT)
    batch.stress = stress + stress.transpose(1, 2)
    batch.total_steps = torch.tensor([10, 20, 30])
    batch.converged = torch.tensor([True, False, False])
    batch.exit_code = torch.tensor([EXIT_CONVERGED, 0, EXIT_MAX_STEPS])
    out = batch.to_atoms()  # sorted by system_id: rows 1, 2, 0
    rows = [1, 2, 0]
    for atoms, row in zip(out, rows):
        assert atoms.info["system_id"] == int(batch.system_id[row])
        assert atoms.info["steps"] == int(batch.total_steps[row])
        assert atoms.info["converged"] is bool(batch.converged[row])
    assert [a.info["exit_reason"] for a in out] == ["running", "max_steps", "converged"]
    assert out[0].calc is None  # energy NaN: no results to attach
    for atoms, row in zip(out[1:], rows[1:]):
        assert isinstance(atoms.calc, SinglePointCalculator)
        lo, hi = int(batch.ptr[row]), int(batch.ptr[row + 1])
        assert atoms.get_potential_energy() == float(batch.energy[row])
        np.testing.assert_array_equal(atoms.get_forces(), batch.forces[lo:hi].numpy())
    # the cubic system has a volume and gets stress; the zero-vector slab does not
    np.testing.assert_allclose(out[2].get_stress(voigt=False), batch.stress[0].numpy(), atol=1e-15)
    assert "stress" not in out[1].calc.results
