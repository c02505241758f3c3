"""Datasets read on access (issue 46, part 1): every format equals ASE's own reading of
it frame by frame, in any access order, and bad files or indices are named."""

from __future__ import annotations

import pickle
from pathlib import Path

import ase.db
import ase.io
import numpy as np
import pytest
from ase.build import bulk
from ase.calculators.emt import EMT

from alchemi_lit.core.errors import ConfigError, StructureError
from alchemi_lit.data import open_dataset
from alchemi_lit.data.ase_datasets import AseDbDataset, FileFramesDataset, TrajDataset
from alchemi_lit.data.datasets import Subset, parse_shard, shard_range
from alchemi_lit.data.extxyz_dataset import ExtxyzDataset
from alchemi_lit.data.store_dataset import StoreDataset


def frames(n: int = 7) -> list:
    """Cu/Au cells of different sizes with info, per-atom arrays and EMT results."""
    out = []
    for k in range(n):
        a = bulk("Cu", "fcc", a=3.6, cubic=True) * (1, 1, 1 + k % 3)
        a.rattle(0.05, seed=k)
        a.numbers[0] = 79 if k % 2 else 29
        a.info.update({"tag": k, "label": f"s{k}", "weight": 0.5 * k})
        a.arrays["charge"] = np.linspace(-1, 1, len(a)) * k
        a.pbc = (True, True, k % 4 != 3)
        a.calc = EMT()
        a.get_forces()
        a.get_stress() if all(a.pbc) else None
        out.append(a)
    return out


def same(got, ref, results: bool = True) -> None:
    """``got`` equals ``ref``: positions, numbers, cell, pbc, info, arrays, results."""
    np.testing.assert_array_equal(got.numbers, ref.numbers)
    np.testing.assert_array_equal(got.positions, ref.positions)
    np.testing.assert_array_equal(got.cell.array, ref.cell.array)
    np.testing.assert_array_equal(got.pbc, ref.pbc)
    assert set(got.arrays) == set(ref.arrays)
    for key in ref.arrays:
        np.testing.assert_array_equal(got.arrays[key], ref.arrays[key])
    assert got.info == ref.info
    if results:
        assert (got.calc is None) == (ref.calc is None)
        if ref.calc is not None:
            assert set(got.calc.results) == set(ref.calc.results)
            for key, value in ref.calc.results.items():
                np.testing.assert_array_equal(got.calc.results[key], value)


def check_against(ds, ref: list, results: bool = True) -> None:
    assert len(ds) == len(ref)
    order = np.random.default_rng(3).permutation(len(ref))  # any order, twice
    for k in [*order, *order[::-1], -1, -len(ref)]:
        same(ds[int(k)], ref[int(k)], results)
    same(ds[-1], ref[-1], results)
    copy = pickle.loads(pickle.dumps(ds))  # (a launcher may send it to a rank)
    same(copy[len(ref) - 1], ref[-1], results)


@pytest.mark.parametrize("name", ["f.extxyz", "f.xyz"])
def test_extxyz_by_offsets_equals_ase_read(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    ase.io.write(path, frames(), format="extxyz")
    ds = open_dataset(path)
    assert isinstance(ds, ExtxyzDataset)
    check_against(ds, ase.io.read(path, ":"))


def test_plain_xyz_and_trailing_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "plain.xyz"
    path.write_text("2\ncomment\nH 0 0 0\nH 0 0 0.74\n1\n\nHe 1 2 3\n\n\n")
    check_against(open_dataset(path), ase.io.read(path, ":"))
    plain = tmp_path / "plain2.xyz"
    plain.write_text("2\ncomment\nH 0 0 0\nH 0 0 0.74\n1\nx\nHe 1 2 3\n")
    check_against(open_dataset(plain, format="xyz"), ase.io.read(plain, ":", format="xyz"))


def test_traj_equals_ase_read(tmp_path: Path) -> None:
    path = tmp_path / "f.traj"
    ase.io.write(path, frames())
    ds = open_dataset(path)
    assert isinstance(ds, TrajDataset)
    check_against(ds, ase.io.read(path, ":"))


@pytest.mark.parametrize("name", ["f.db", "f.json"])
def test_ase_database_equals_ase_read_plus_key_value_pairs(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    with ase.db.connect(path) as db:
        for k, a in enumerate(frames()):
            db.write(a, kind=k, path_hint="x")
    ref = ase.io.read(path, ":")
    for k, a in enumerate(ref):
        a.info.update({"kind": k, "path_hint": "x"})
    ds = open_dataset(path)
    assert isinstance(ds, AseDbDataset)
    check_against(ds, ref)


def test_aselmdb_equals_its_rows(tmp_path: Path) -> None:
    pytest.importorskip("ase_db_backends")
    path = tmp_path / "f.aselmdb"
    db = ase.db.connect(path, type="aselmdb")
    for k, a in enumerate(frames()):
        db.write(a, kind=k)
    db.delete([3])  # a deleted row is skipped (ids need not be 1..n)
    db.close()
    ds = open_dataset(path)
    assert isinstance(ds, AseDbDataset)
    refs = []
    for k, a in enumerate(frames()):
        if k != 2:  # (row id 3 is frame 2)
            a.info = {"kind": k}
            del a.arrays["charge"]  # (a database keeps no custom per-atom arrays)
            refs.append(a)
    for got, ref in zip(ds, refs):
        same(got, ref, results=False)
        np.testing.assert_allclose(got.get_potential_energy(), ref.get_potential_energy())
    assert len(ds) == len(refs)
    same(ds[-1], refs[-1], results=False)


def test_a_results_store_reads_by_system_as_read_structures(tmp_path: Path) -> None:
    """Rows out of id order (a second run appended lower ids): the dataset is in id
    order, as read_structures, and index selects alike."""
    from alchemi_lit import Simulator
    from alchemi_lit.core.state import Batch
    from alchemi_lit.data import read_structures
    from alchemi_lit.models import EMT as EMTModel
    from alchemi_lit.sinks import ZarrSink
    from alchemi_lit.workflows.jobs import SinglePoint

    store = tmp_path / "r.zarr"
    structures = frames(9)
    for a in structures:
        a.calc = None
        a.pbc = True
    for ids in (range(5, 9), range(0, 5)):  # rows 0-3 hold ids 5-8
        sim = Simulator(EMTModel(), [SinglePoint()], sinks=[ZarrSink(store, mode="a")])
        sim.run(Batch.from_atoms([structures[k] for k in ids], system_ids=list(ids)))
    ds = open_dataset(store)
    assert isinstance(ds, StoreDataset)
    ref = read_structures(store)
    assert [ds[k].info["system_id"] for k in range(len(ds))] == list(range(9))
    check_against(ds, ref)
    picked = open_dataset(store, index="1:4")
    for k, a in enumerate(read_structures(store, index="1:4")):
        same(picked[k], a)


def test_other_formats_read_one_file_at_a_time(tmp_path: Path) -> None:
    for k, a in enumerate(frames(3)):
        ase.io.write(tmp_path / f"s{k}.cif", a)
    ds = open_dataset(tmp_path / "*.cif")
    ref = [ase.io.read(tmp_path / f"s{k}.cif") for k in range(3)]
    assert len(ds) == 3
    for k in (2, 0, 1):
        assert ds[k].info.pop("source_file") == str(tmp_path / f"s{k}.cif")
        got = ds[k]
        np.testing.assert_array_equal(got.positions, ref[k].positions)
        np.testing.assert_array_equal(got.numbers, ref[k].numbers)
    assert isinstance(ds.parts[0], FileFramesDataset)


def test_index_selects_without_reading(tmp_path: Path) -> None:
    path = tmp_path / "f.extxyz"
    ase.io.write(path, frames(), format="extxyz")
    ref = ase.io.read(path, ":")
    sub = open_dataset(path, index="1:6:2")
    assert isinstance(sub, Subset) and list(sub.positions) == [1, 3, 5]
    for k, j in enumerate([1, 3, 5]):
        same(sub[k], ref[j])
    same(open_dataset(path, index=-1)[0], ref[-1])
    with pytest.raises(StructureError, match="selects no structure"):
        open_dataset(path, index="10:20")
    with pytest.raises(StructureError, match="selects no structure"):
        open_dataset(path, index=99)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("2\nc\nH 0 0 0\n", "ends early"),
        ("x\nc\nH 0 0 0\n", "line 1: expected the atom count"),
        ("1\nc\nH 0 0 0\n\n1\nc\nH 0 0 1\n", "line 4: a blank line between frames"),
        ("", "an empty file: it contains no structures"),
    ],
)
def test_a_broken_xyz_file_is_named(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "bad.xyz"
    path.write_text(text)
    with pytest.raises(StructureError, match=match):
        open_dataset(path)


def test_a_garbled_frame_names_its_index(tmp_path: Path) -> None:
    path = tmp_path / "bad.xyz"
    path.write_text("1\nc\nH 0 0 0\n1\nc\nH zero 0 0\n")
    ds = open_dataset(path)
    with pytest.raises(StructureError, match="structure 1 of"):
        ds[1]


def test_a_file_that_changed_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "f.xyz"
    ase.io.write(path, frames(2), format="extxyz")
    ds = open_dataset(path)
    with open(path, "a") as fh:
        fh.write("1\n\nH 0 0 0\n")
    with pytest.raises(StructureError, match="changed size"):
        ds[0]


def test_missing_paths_and_out_of_range(tmp_path: Path) -> None:
    with pytest.raises(StructureError, match="does not exist"):
        open_dataset(tmp_path / "none.xyz")
    path = tmp_path / "f.xyz"
    ase.io.write(path, frames(2), format="extxyz")
    with pytest.raises(IndexError, match="holds 2"):
        open_dataset(path)[2]
    with pytest.raises(TypeError, match="integers or slices"):
        open_dataset(path)["0"]


def test_shards_are_contiguous_balanced_and_cover_once() -> None:
    for n in (0, 1, 7, 10, 1001):
        for count in (1, 2, 3, 8):
            ranges = [shard_range(n, i, count) for i in range(count)]
            joined = [k for r in ranges for k in r]
            assert joined == list(range(n))
            assert max(map(len, ranges)) - min(map(len, ranges)) <= 1


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("3/3", r"index must be in 0\.\.2"),
        ("-1/3", r"index must be in 0\.\.2"),
        ("0/0", "count must be >= 1"),
        ("1", "INDEX/COUNT"),
        ("a/b", "INDEX/COUNT"),
        ("1/2/3", "INDEX/COUNT"),
    ],
)
def test_bad_shard_specs_are_refused(spec: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_shard(spec)
