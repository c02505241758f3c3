"""Batch input validation and the ase.Atoms round trip, as the issue asks for them.

Every input error raises the documented type with a message naming the system as
``system 2 (system_id 30)`` and the fix; close atoms are a StructureWarning; the round
trip keeps cell, pbc, masses, momenta, tags, constraints, info and per-atom arrays.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import ase.io
import numpy as np
import pytest
import torch
from ase import Atoms
from ase.calculators.lj import LennardJones as AseLJ
from ase.constraints import FixAtoms, FixBondLength, FixCartesian, FixScaled

import alchemi_lit as al
from alchemi_lit.core.errors import BatchError, StructureError, StructureWarning
from alchemi_lit.core.state import ARRAYS_KEY, system_name, validate_atoms
from alchemi_lit.data import read_structures
from alchemi_lit.models import LennardJones
from alchemi_lit.sinks import ZarrSink
from conftest import AR_EPSILON, AR_SIGMA, perturbed_argon, triclinic_argon

DT = torch.float64
IDS = [10, 11, 30, 12]  # the bad structure goes to index 2: "system 2 (system_id 30)"


def with_bad(bad: Atoms) -> list[Atoms]:
    good = perturbed_argon(3, 1, 0.05, seed=1)
    return [*good[:2], bad, good[2]]


def argon4(**kw) -> Atoms:
    a = perturbed_argon(1, 1, 0.05, seed=2)[0]
    for k, v in kw.items():
        getattr(a, f"set_{k}")(v)
    return a


def moved(atom: int, to: list[float] | None = None, by: float = 0.0) -> Atoms:
    a = argon4()
    a.positions[atom] = a.positions[0] + [by, 0.0, 0.0] if to is None else to
    return a


def nan_at(atom: int, value: float, attr: str = "positions") -> Atoms:
    a = argon4()
    arr = a.get_momenta() if attr == "momenta" else a.positions
    arr[atom, 1] = value
    if attr == "momenta":
        a.set_momenta(arr)
    return a


def masses(*values: float) -> Atoms:
    a = argon4()
    m = a.get_masses()
    m[: len(values)] = values
    a.set_masses(m)
    return a


def cell(vectors, pbc=True) -> Atoms:
    return Atoms("Ar2", positions=[[0, 0, 0], [1.9, 1.9, 0]], cell=vectors, pbc=pbc)


def constrained(c) -> Atoms:
    a = argon4()
    a.set_constraint(c)
    return a


# (make the bad structure, exception type, fix named in the message)
ERRORS: dict[str, tuple[Callable[[], Atoms], type[Exception], str]] = {
    "empty": (Atoms, StructureError, "remove it from the input"),
    "nan-position": (lambda: nan_at(1, np.nan), StructureError, "fix or drop"),
    "inf-position": (lambda: nan_at(3, -np.inf), StructureError, "fix or drop"),
    "nan-momentum": (lambda: nan_at(2, np.nan, "momenta"), StructureError, "zero them"),
    "zero-mass": (lambda: masses(0.0), StructureError, "set positive masses"),
    "negative-mass": (lambda: masses(39.9, -1.0), StructureError, "set positive masses"),
    "nan-cell": (lambda: cell([[4, 0, 0], [0, np.nan, 0], [0, 0, 4]]), StructureError, "fix"),
    "singular-cell": (lambda: cell(np.zeros((3, 3))), StructureError, "give a full cell"),
    "nearly-singular-cell": (
        lambda: cell([[4, 0, 0], [0, 4, 0], [0, 0, 1e-5]]),
        StructureError,
        "or set pbc=False",
    ),
    "nearly-parallel-vectors": (  # long vectors, but the cell is 1e-4 Å thick
        lambda: cell([[4, 0, 0], [4, 1e-4, 0], [0, 0, 4]]),
        StructureError,
        "give a full cell",
    ),
    "thin-along-periodic-of-mixed": (
        lambda: cell([[4, 0, 0], [0, 2e-4, 0], [0, 0, 4]], pbc=[True, True, False]),
        StructureError,
        "pbc=False",
    ),
    "coincident-atoms": (lambda: moved(2, by=0.0), StructureError, "remove the duplicate"),
    "coincident-through-image": (
        lambda: moved(1, to=argon4().positions[0] + [5.26, 0, 0]),
        StructureError,
        "remove the duplicate",
    ),
    "unsupported-constraint": (
        lambda: constrained(FixScaled(0, mask=(True, False, False))),
        StructureError,
        "Remove it (atoms.set_constraint())",
    ),
    "fixed-atom-in-a-rigid-bond": (
        lambda: constrained([FixAtoms([0]), FixBondLength(0, 1)]),
        StructureError,
        "drop one of the constraints",
    ),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_every_input_error_names_the_system_and_the_fix(case: str) -> None:
    make, exc, fix = ERRORS[case]
    with pytest.raises(exc) as err:
        al.Batch.from_atoms(with_bad(make()), system_ids=IDS)
    assert isinstance(err.value, ValueError)
    message = str(err.value)
    assert message.startswith("system 2 (system_id 30)"), message
    assert fix in message, message
    assert err.value.system_index == 2
    # the sampler's path (no ids): named by the dataset index alone
    with pytest.raises(exc, match=r"^system 5\b"):
        validate_atoms(make(), 5)


def test_system_name_helper() -> None:
    assert system_name(2, 30) == "system 2 (system_id 30)"
    assert system_name(2, 2) == system_name(2) == "system 2"  # default ids: no repetition


def test_coincident_atoms_are_an_error_even_with_the_warning_off() -> None:
    with pytest.raises(
        StructureError, match=r"^system 0: atoms 0 and 2 coincide \(distance 1e-06 Å\)"
    ):
        al.Batch.from_atoms([moved(2, by=1e-6)], min_distance=0.0)
    al.Batch.from_atoms([moved(2, by=1e-6)], validate=False)  # unchecked on request


def test_partial_fix_cartesian_comes_back_as_itself() -> None:
    a = constrained(FixCartesian([1, 3], (True, False, True)))
    (back,) = al.Batch.from_atoms([a]).to_atoms(results=False)
    assert back.constraints[0].todict() == a.constraints[0].todict()


def test_full_fix_cartesian_is_fix_atoms() -> None:
    a = constrained([FixCartesian([1, 3]), FixAtoms([0])])  # mask (True, True, True)
    batch = al.Batch.from_atoms([a], dtype=DT)
    assert batch.fixed.tolist() == [True, True, False, True]
    (back,) = batch.to_atoms(results=False)
    assert sorted(back.constraints[0].index.tolist()) == [0, 1, 3]
    assert isinstance(back.constraints[0], FixAtoms)


# ---------------------------------------------------------------------- warnings
def test_close_atoms_warn_naming_system_id_distance_pair_and_parameter() -> None:
    with pytest.warns(StructureWarning) as record:
        batch = al.Batch.from_atoms(with_bad(moved(2, by=0.3)), system_ids=IDS)
    assert batch.num_systems == 4  # a warning, not an error
    (w,) = record
    msg = str(w.message)
    assert msg.startswith("system 2 (system_id 30): atoms 0 and 2 are only 0.300 Å apart"), msg
    assert "min_distance=0.5" in msg and "smaller min_distance=" in msg
    assert (w.message.system_index, w.message.system_id) == (2, 30)
    assert w.filename == __file__  # points at the caller, not into alchemi_lit
    with warnings.catch_warnings():
        warnings.simplefilter("error", StructureWarning)
        al.Batch.from_atoms(with_bad(moved(2, by=0.3)), system_ids=IDS, min_distance=0.2)


@pytest.mark.parametrize(
    ("edge", "expect"),
    [
        (2.0, None),  # self-image 2 Å away: fine
        (0.3, "atom 0 is only 0.300 Å from its own periodic image"),
        (0.05, "the cell is only 0.050 Å thick"),  # too thin to search pairs cheaply
    ],
)
def test_one_atom_periodic_cell_checks_its_own_images(edge: float, expect: str | None) -> None:
    a = Atoms("Ar", positions=[[0, 0, 0]], cell=[edge] * 3, pbc=True)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        al.Batch.from_atoms([argon4(), a], system_ids=[0, 7])
    found = [str(w.message) for w in record if issubclass(w.category, StructureWarning)]
    if expect is None:
        assert not found
    else:
        assert len(found) == 1 and found[0].startswith("system 1 (system_id 7): ")
        assert expect in found[0] and "min_distance=" in found[0]


def test_momenta_of_fixed_atoms_are_zeroed_with_a_warning() -> None:
    a = argon4()
    p = np.arange(12.0).reshape(4, 3) - 5.0
    a.set_momenta(p)
    a.set_constraint(FixAtoms([1, 2]))  # after the momenta: fixed atoms still move
    with pytest.warns(StructureWarning, match=r"system 0: fixed atom\(s\) \[1, 2\] have nonzero"):
        batch = al.Batch.from_atoms([a], dtype=DT)
    (back,) = batch.to_atoms(results=False)
    expected = p.copy()
    expected[[1, 2]] = 0.0
    np.testing.assert_allclose(back.get_momenta(), expected, rtol=1e-15, atol=0)
    assert batch.kinetic_energy().item() == pytest.approx(
        0.5 * (expected**2 / a.get_masses()[:, None]).sum(), rel=1e-14
    )


# ---------------------------------------------------------------------- ids and fields
def test_repeated_system_ids_name_the_ids() -> None:
    structures = perturbed_argon(3, 1, 0.05, seed=3)
    with pytest.raises(StructureError, match=r"system_id\(s\) \[5\] occur more than once"):
        al.Batch.from_atoms(structures, system_ids=[5, 7, 5])
    batch = al.Batch.from_atoms(structures, system_ids=[5, 7, 9])
    with pytest.raises(BatchError, match=r"select: system_id\(s\) \[7\].*select each row once"):
        batch.select([1, 0, 1])
    with pytest.raises(BatchError, match=r"concatenate: system_id\(s\) \[9\].*new ids"):
        al.Batch.concatenate([batch.select([2]), batch.select([0, 2])])
    assert al.Batch.concatenate([batch.select([2]), batch.select([0])]).num_systems == 2


@pytest.mark.parametrize(
    ("declare", "match"),
    [
        (
            lambda b: b.ensure_field("x", "system"),
            r"'x' is a per-atom field of shape \[n\] \(torch.float64\) in batch 0 but a "
            r"per-system field of shape \[n\] \(torch.float64\) in batch 1",
        ),
        (lambda b: b.ensure_field("x", "atom", shape=(3,)), r"shape \[n\] .* shape \[n, 3\]"),
        (lambda b: b.ensure_field("x", "atom", dtype=torch.int64), r"float64.*int64"),
    ],
    ids=["kind", "shape", "dtype"],
)
def test_concatenate_rejects_fields_declared_differently(declare, match: str) -> None:
    a = al.Batch.from_atoms(perturbed_argon(1, 1), system_ids=[0], dtype=DT)
    b = al.Batch.from_atoms(perturbed_argon(1, 1), system_ids=[1], dtype=DT)
    a.ensure_field("x", "atom")
    declare(b)
    with pytest.raises(BatchError, match=match) as err:
        al.Batch.concatenate([a, b])
    assert "declare it alike in every batch" in str(err.value)


def test_copies_do_not_share_info() -> None:
    a = argon4()
    a.info["history"] = [1.0]
    batch = al.Batch.from_atoms([a])
    a.info["history"].append(2.0)  # the input changes afterwards
    assert batch.info[0]["history"] == [1.0]
    for copy in (batch.to(dtype=torch.float32), batch.clone()):
        copy.info[0]["history"].append(3.0)
        copy.info[0]["new"] = True
        assert batch.info[0] == {"history": [1.0]}
    (back,) = batch.to_atoms()
    back.info["history"].append(4.0)
    assert batch.info[0]["history"] == [1.0]


# ---------------------------------------------------------------------- round trip
def test_round_trip_keeps_per_atom_arrays(tmp_path: Path) -> None:
    a, b = argon4(), triclinic_argon(1, 0.05, 0.05, seed=4)
    a.set_initial_magnetic_moments([0.5, -0.5, 1.0, 0.0])
    a.set_initial_charges([0.1, -0.1, 0.2, -0.2])
    b.set_array("fragment", np.arange(len(b), dtype=np.int32))
    b.set_array("dipole", np.random.default_rng(0).normal(size=(len(b), 3)))
    b.set_array("selected", np.arange(len(b)) % 3 == 0)  # bool and unsigned: numeric too
    b.set_array("shell", (np.arange(len(b)) % 4).astype(np.uint8))
    b.set_array("label", np.array(["x"] * len(b)))  # not numeric: dropped, with a warning
    b.set_array("phase", np.exp(1j * np.arange(len(b))))  # complex: numeric, yet dropped
    dropped = r"system 1 \(system_id 4\).*\['label', 'phase'\] are not real numbers, integers"
    with pytest.warns(StructureWarning, match=dropped):
        batch = al.Batch.from_atoms([a, b], system_ids=[3, 4], dtype=DT)
    sub = al.Batch.concatenate([batch.select([1]), batch.select([0])])  # moved around
    sink = ZarrSink(tmp_path / "r.zarr")  # and through a results store
    sink.open({})
    sink.write(sub)
    sink.close()
    for out in (sub.to_atoms(results=False), sink.read_batch().to_atoms(results=False)):
        np.testing.assert_array_equal(out[0].get_initial_magnetic_moments(), [0.5, -0.5, 1, 0])
        np.testing.assert_array_equal(out[0].get_initial_charges(), [0.1, -0.1, 0.2, -0.2])
        np.testing.assert_array_equal(out[1].arrays["fragment"], b.arrays["fragment"])
        assert out[1].arrays["fragment"].dtype == np.int32
        np.testing.assert_array_equal(out[1].arrays["dipole"], b.arrays["dipole"])
        for name in ("selected", "shell"):
            np.testing.assert_array_equal(out[1].arrays[name], b.arrays[name])
            assert out[1].arrays[name].dtype == b.arrays[name].dtype, name
        assert "label" not in out[1].arrays and "phase" not in out[1].arrays
        assert ARRAYS_KEY not in out[0].info and out[0].info == a.info == {}


def test_reserved_info_key_is_an_error() -> None:
    a = argon4()
    a.info[ARRAYS_KEY] = 1
    with pytest.raises(StructureError, match=r"system 2 \(system_id 30\).*reserved.*rename"):
        al.Batch.from_atoms(with_bad(a), system_ids=IDS)


def test_to_atoms_keeps_a_users_info_under_result_keys() -> None:
    a, b = argon4(), argon4()
    a.info.update(system_id="sample-A", steps=3, name="a")
    b.info.update(system_id=8)  # equals the id it gets: nothing to keep
    batch = al.Batch.from_atoms([a, b], system_ids=[9, 8])
    assert batch.to_atoms(results=False)[1].info == a.info  # nothing added, nothing moved
    with pytest.warns(StructureWarning, match=r"system_id\(s\) \[9\].*\['steps', 'system_id'\]"):
        out = batch.to_atoms()
    got_b, got_a = out
    assert got_a.info["system_id"] == 9 and got_a.info["input_system_id"] == "sample-A"
    assert got_a.info["steps"] == 0 and got_a.info["input_steps"] == 3
    assert got_a.info["name"] == "a"
    assert got_b.info["system_id"] == 8 and "input_system_id" not in got_b.info
    # results fed back in are simply updated: no warning, no input_* keys piling up
    again = al.Batch.from_atoms([got_b], system_ids=[8])
    again.total_steps = torch.tensor([5])
    with warnings.catch_warnings():
        warnings.simplefilter("error", StructureWarning)
        (twice,) = again.to_atoms()
    assert twice.info["steps"] == 5 and not any(k.startswith("input_") for k in twice.info)


def test_results_of_two_runs_fed_back_together_keep_apart() -> None:
    """Results carry their system_id and step count; two runs' results (ids 0, 1 each)
    fed back together cannot keep both ids: they are numbered by position, not refused
    as duplicates.  A result's step count never starts below 0."""
    first = al.Batch.from_atoms([argon4(), argon4()]).to_atoms()
    second = al.Batch.from_atoms([argon4(), argon4()]).to_atoms()
    assert [a.info["system_id"] for a in first + second] == [0, 1, 0, 1]
    assert al.Batch.from_atoms(first + second).system_id.tolist() == [0, 1, 2, 3]
    second[0].info["system_id"], second[1].info["system_id"] = 7, 5
    assert al.Batch.from_atoms(second).system_id.tolist() == [7, 5]  # distinct: kept
    second[0].info["steps"] = -2
    assert al.Batch.from_atoms(second).total_steps.tolist() == [0, 0]


# ---------------------------------------------------------------------- the snippet
def test_headline_snippet_matches_ase_lennard_jones(tmp_path: Path) -> None:
    """extxyz -> Batch -> LennardJones -> back to ASE, against ase's LennardJones."""
    rng = np.random.default_rng(5)
    structures = [
        perturbed_argon(1, 2, 0.1, seed=6)[0],  # 32 atoms
        perturbed_argon(1, 1, 0.1, seed=7)[0],  # 4
        triclinic_argon(2, 0.1, 0.05, seed=8),  # 8
        perturbed_argon(1, (2, 1, 1), 0.1, seed=9)[0],  # 8, cubic
    ]
    for atoms in structures:
        atoms.set_momenta(rng.normal(size=(len(atoms), 3)))
    path = tmp_path / "argon.extxyz"
    ase.io.write(path, structures, format="extxyz")
    read = read_structures(path)

    batch = al.Batch.from_atoms(read)
    assert batch.dtype == torch.float64
    out = LennardJones(epsilon=0.0104, sigma=3.40, cutoff=8.5)(batch)
    assert out["energy"].shape == (4,)
    assert out["forces"].shape == (batch.num_atoms, 3)
    assert out["stress"].shape == (4, 3, 3)
    for row, atoms in enumerate(read):
        ref = atoms.copy()
        ref.calc = AseLJ(epsilon=AR_EPSILON, sigma=AR_SIGMA, rc=8.5)
        lo, hi = int(batch.ptr[row]), int(batch.ptr[row + 1])
        assert abs(float(out["energy"][row]) - ref.get_potential_energy()) < 1e-8
        np.testing.assert_allclose(out["forces"][lo:hi].numpy(), ref.get_forces(), atol=1e-6)
        np.testing.assert_allclose(
            out["stress"][row].numpy(), ref.get_stress(voigt=False), atol=1e-6
        )

    back = batch.to_atoms()
    assert [len(x) for x in back] == [32, 4, 8, 8]  # input (system_id) order
    for got, ref in zip(back, read):
        np.testing.assert_array_equal(got.positions, ref.positions)
        np.testing.assert_array_equal(got.cell.array, ref.cell.array)
        np.testing.assert_allclose(got.get_momenta(), ref.get_momenta(), rtol=1e-14)


@pytest.mark.parametrize("cutoff", [0.5, 1.5, 2.9, 4.0])
def test_closest_pair_matches_ase_whatever_the_search_radius(cutoff: float) -> None:
    """Validation searches wider than min_distance (a vesin search of 0.5 Å in a large
    cell is dominated by its bins) and keeps the closest pair: it must be the closest
    pair ASE finds within the cutoff -- periodic images and an atom's own images
    included -- or none when ASE finds none."""
    from ase.neighborlist import neighbor_list

    from alchemi_lit.core.geometry import closest_pair as _closest_pair

    rng = np.random.default_rng(7)
    for k in range(12):
        n = int(rng.integers(2, 70))  # above the all-pairs limit too (periodic: vesin)
        length = rng.uniform(1.2, 12.0)
        cell = np.diag(rng.uniform(0.8, 1.2, 3) * length) + rng.normal(0, 0.1 * length, (3, 3))
        pbc = [True, True, k % 3 != 0]
        atoms = Atoms(f"Ar{n}", positions=rng.uniform(0, 1, (n, 3)) @ cell, cell=cell, pbc=pbc)
        got = _closest_pair(atoms.positions, atoms.cell.array, np.asarray(pbc), cutoff)
        d = neighbor_list("d", atoms, cutoff, self_interaction=False)
        if len(d) == 0:
            assert got is None, (k, got)
        else:
            assert got is not None and got[0] == pytest.approx(float(d.min()), abs=1e-12), k


def test_structures_one_per_file_read_from_a_folder_or_a_pattern(tmp_path: Path) -> None:
    """A folder or a glob pattern reads every file's structures, sorted by name, each
    with the file it came from in info (kept through a run to its results)."""
    from ase.build import bulk

    for name, element in (("b_cu.cif", "Cu"), ("a_ni.cif", "Ni"), ("c_al.vasp", "Al")):
        ase.io.write(tmp_path / name, bulk(element, cubic=True))
    found = read_structures(tmp_path)
    assert [a.get_chemical_formula() for a in found] == ["Ni4", "Cu4", "Al4"]
    assert [Path(a.info["source_file"]).name for a in found] == [
        "a_ni.cif",
        "b_cu.cif",
        "c_al.vasp",
    ]
    cifs = read_structures(tmp_path / "*.cif")
    assert [Path(a.info["source_file"]).name for a in cifs] == ["a_ni.cif", "b_cu.cif"]
    out = al.Simulator(model=al.models.EMT(), stages=al.integrators.FIRE(max_steps=2)).run(cifs)
    assert [Path(a.info["source_file"]).name for a in out.to_atoms()] == ["a_ni.cif", "b_cu.cif"]
    (tmp_path / "notes.txt").write_text("not a structure")
    with pytest.raises(StructureError, match=r"notes\.txt.*a pattern such as"):
        read_structures(tmp_path)
    with pytest.raises(StructureError, match=r"no structure file matches .*\*\.xyz"):
        read_structures(tmp_path / "*.xyz")


def test_a_run_takes_a_path_to_its_structures(tmp_path: Path) -> None:
    """``sim.run(path)`` reads the structures as read_structures does (here a pattern)."""
    from ase.build import bulk

    for name, element in (("a.cif", "Cu"), ("b.cif", "Ni")):
        ase.io.write(tmp_path / name, bulk(element, cubic=True))
    sim = al.Simulator(model=al.models.EMT(), stages=al.integrators.FIRE(max_steps=2))
    res = sim.run(str(tmp_path / "*.cif"))
    assert [a.get_chemical_formula() for a in res.to_atoms()] == ["Cu4", "Ni4"]
    assert len(sim.run(tmp_path / "a.cif")) == 1


@pytest.mark.parametrize("cutoff", [1e-4, 0.5, 1.5, 2.9])
def test_small_cells_searched_together_find_the_closest_pair_ase_finds(cutoff: float) -> None:
    """The batched search of small periodic cells (every pair with every image in
    reach, many cells at once) finds ASE's closest pair, or none when ASE finds none:
    skewed cells, atoms outside the cell, an atom close to its own image, and (the
    last cells) coincident atoms, through an image or not."""
    from ase.neighborlist import neighbor_list

    from alchemi_lit.core.geometry import (
        closest_pairs_of_small_cells,
        image_reach,
        periodic_heights,
    )

    rng = np.random.default_rng(11)
    n, count = 3, 40
    cells = np.diag(rng.uniform(1.5, 4.0, 3)) + rng.normal(0, 0.6, (count, 3, 3))
    frac = rng.uniform(-1.5, 2.5, (count, n, 3))  # wrapped inside the search, not here
    frac[-3, :2] = [[0.9999, 0.5, 0.5], [1.0001, 0.5, 0.5]]  # close, not through an image,
    # though the cell's boundary lies between them
    frac[-2, 1] = frac[-2, 0] + [1.0, 0.0, -2.0]  # coincide through an image
    frac[-1, 2] = frac[-1, 0] + 1e-9  # coincide
    pos = np.einsum("gnx,gxy->gny", frac, cells)
    reach = tuple(
        np.max([image_reach(periodic_heights(c, np.ones(3, bool)), cutoff) for c in cells], 0)
    )
    got = closest_pairs_of_small_cells(pos, cells, reach, cutoff)
    for k in range(count):
        atoms = Atoms(f"Ar{n}", positions=pos[k], cell=cells[k], pbc=True)
        i, j, d, shift = neighbor_list("ijdS", atoms, cutoff, self_interaction=False)
        if len(d) == 0:
            assert got[k] is None, (k, got[k])
            continue
        assert got[k] is not None and got[k][0] == pytest.approx(float(d.min()), abs=1e-9), k
        closest = d <= d.min() + 1e-9
        found = {(*sorted(p), bool(s.any())) for p, s in zip(zip(i[closest], j[closest]),
                                                             shift[closest])}  # fmt: skip
        assert got[k][1:] in found, (k, got[k], found)
    assert cutoff < 0.1 or got[-3][1:] == (0, 1, False)  # ~1e-3 Å apart
    assert got[-2][1:] == (0, 1, True)
    assert got[-1][1:] == (0, 2, False)


def test_validating_many_small_cells_together_names_the_same_first_failure() -> None:
    """validate_structures (small cells searched together) raises for the first failing
    structure in input order, with validate_atoms' message, and collects every failure
    when asked."""
    from alchemi_lit.core.batched_validation import validate_structures

    good = Atoms("Cu", cell=np.eye(3) * 2.5, pbc=True)
    coincident = Atoms("Cu2", positions=[[0, 0, 0], [2.5, 0, 0]], cell=np.eye(3) * 2.5, pbc=True)
    nan = Atoms("Cu", positions=[[np.nan, 0, 0]], cell=np.eye(3) * 2.5, pbc=True)
    structures = [good, good.copy(), nan, coincident, good.copy()]
    with pytest.raises(StructureError) as batched:
        validate_structures(structures, [None] * 5)
    with pytest.raises(StructureError) as alone:
        validate_atoms(nan, 2)
    assert str(batched.value) == str(alone.value)
    errors: list[tuple[int, str]] = []
    validate_structures(structures, [None] * 5, errors=errors)
    assert [k for k, _ in errors] == [2, 3] and "coincide through a periodic image" in errors[1][1]


def test_the_sampler_validates_in_chunks_and_names_each_invalid_structure(monkeypatch):
    """The sampler validates its dataset a chunk at a time (a lazy dataset is never all
    in memory); a structure in a later chunk is still named by its dataset index."""
    import alchemi_lit.data.scan as sampler_module
    from alchemi_lit.data import SizeAwareSampler

    monkeypatch.setattr(sampler_module, "SCAN_CHUNK", 2)
    good = Atoms("Cu", cell=np.eye(3) * 2.5, pbc=True)
    twice = Atoms("Cu2", positions=[[0, 0, 0], [0, 0, 2.5]], cell=np.eye(3) * 2.5, pbc=True)
    data = [good.copy(), good.copy(), good.copy(), twice, good.copy()]
    sampler = SizeAwareSampler(data, max_atoms=8, skip_invalid=True)
    sampler.bind()  # logs the skipped one
    assert [row["index"] for row in sampler.skipped] == [3]
    assert "atoms 0 and 1 coincide through a periodic image" in sampler.skipped[0]["reason"]
