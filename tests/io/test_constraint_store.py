"""Results stores keep every constraint kind (#43): a run through a ZarrSink read back
with ``read_results(...).to_atoms()`` gives each system the constraints it entered with,
equal to the in-memory results'; an unconstrained run writes no constraint array; a
merge carries them; a pipeline's results keep them (FixSymmetry included, alone and
with fixed atoms) and equal the fused run's.

Reference: the input's ASE constraints (``todict()``; FixSymmetry by its operations,
``symm_map`` and parameters) and the same run's in-memory ``Results.to_atoms()``.
Small LJ argon clusters (13 atoms) and one argon crystal, float64, a few FIRE steps.
"""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from ase.build import bulk
from ase.cluster import Icosahedron
from ase.constraints import FixAtoms, FixSymmetry

import alchemi_lit as al
from alchemi_lit.core.constraint_io import stored_fields
from alchemi_lit.core.state import Batch
from alchemi_lit.integrators import FIRE
from alchemi_lit.io.store_constraints import stored_columns
from alchemi_lit.models import LennardJones
from alchemi_lit.sinks import ZarrSink, merge_stores, read_results
from alchemi_lit.testing import constraint_cases

CASES = constraint_cases()
NAMES = [*CASES, "FixSymmetry", "FixSymmetry+FixAtoms", "none"]


def cluster(seed: int):
    atoms = Icosahedron("Ar", 2, latticeconstant=5.3)
    atoms.rattle(0.05, seed=seed)
    return atoms


def crystal():
    """A tetragonal argon cell, one atom lifted (P4/mmm: a symm_map that permutes
    atoms, translations), under ASE's FixSymmetry."""
    atoms = bulk("Ar", "fcc", a=5.3, cubic=True)
    atoms.set_cell(atoms.cell.array @ np.diag([1.0, 1.0, 1.03]), scale_atoms=True)
    atoms.positions[1, 2] += 0.1
    atoms.set_constraint(FixSymmetry(atoms, symprec=1e-3))
    return atoms


def make(name: str, seed: int = 0):
    if name == "FixSymmetry":
        return crystal()
    if name == "FixSymmetry+FixAtoms":  # (atoms 0 and 3: one orbit of its P4/mmm)
        atoms = crystal()
        atoms.set_constraint([*atoms.constraints, FixAtoms([0, 3])])
        return atoms
    atoms = cluster(seed)
    if name != "none":
        atoms.set_constraint(CASES[name](atoms))
    return atoms


def systems() -> list:
    return [make(n, seed=k) for k, n in enumerate(NAMES)]


def simulator(**kwargs) -> al.Simulator:
    model = LennardJones(epsilon=0.0104, sigma=3.40, cutoff=6.0)
    return al.Simulator(model=model, stages=FIRE(fmax=1e-3, max_steps=4), precision="64",
                        sync_every=1, **kwargs)  # fmt: skip


def described(c) -> dict:
    """A constraint as comparable plain values (FixSymmetry: its operations; its
    ``atoms`` are a snapshot, not a parameter)."""
    if type(c).__name__ == "FixSymmetry":
        return {
            "name": "FixSymmetry", "symprec": c.symprec,
            "adjust": (c.do_adjust_positions, c.do_adjust_cell),
            "rotations": np.asarray(c.rotations).tolist(),
            "translations": np.asarray(c.translations) % 1.0,
            "symm_map": [list(map(int, m)) for m in c.symm_map],
        }  # fmt: skip
    d = c.todict()
    return {"name": d["name"], **d["kwargs"]}


def assert_same_constraints(got, want, exact: bool = False) -> None:
    """Same kinds in the same order with the same parameters (``exact``: bit for bit,
    else to rounding -- ASE normalises directions in its own order)."""
    assert [type(c).__name__ for c in got] == [type(c).__name__ for c in want]
    for g, w in zip(got, want):
        a, b = described(g), described(w)
        assert a.keys() == b.keys(), (a, b)
        for key in a:
            x, y = a[key], b[key]
            if key == "translations":  # (0 and 1 are one translation)
                d = (np.asarray(x) - np.asarray(y) + 0.5) % 1.0 - 0.5
                assert np.abs(d).max() <= (0 if exact else 1e-9), key
            elif exact or x is None or isinstance(x, (str, bool)):
                assert np.array_equal(np.asarray(x, dtype=object), np.asarray(y, dtype=object))
            else:
                np.testing.assert_allclose(
                    np.asarray(x, float), np.asarray(y, float), rtol=0, atol=1e-12,
                    err_msg=f"{a['name']} {key}",
                )  # fmt: skip


def in_input_order(atoms: list) -> list:
    return sorted(atoms, key=lambda a: a.info["system_id"])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One batch of every kind (and an unconstrained system) run in memory and through
    a ZarrSink writing each bookkeeping's graduates (several appends)."""
    path = tmp_path_factory.mktemp("cstore") / "results.zarr"
    memory = simulator().run(systems()).to_atoms()
    simulator(sinks=[ZarrSink(path, flush_every=1)]).run(systems())
    return path, memory, read_results(path).to_atoms()


@pytest.mark.parametrize("name", NAMES)
def test_a_store_gives_back_every_kind(runs, name: str) -> None:
    _, memory, stored = runs
    k = NAMES.index(name)
    want = make(name, seed=k).constraints
    got = in_input_order(stored)[k].constraints
    assert_same_constraints(got, in_input_order(memory)[k].constraints, exact=True)

    def kind(c):  # (the order within a kind is kept; kinds come in application order)
        return type(c).__name__

    assert_same_constraints(sorted(got, key=kind), sorted(want, key=kind))


def test_the_store_holds_each_column_once_and_mixed_rows_read_free(runs) -> None:
    """The mixed store: every constraint column, as long as the other columns; the
    unconstrained system reads back free and equal to the in-memory one."""
    path, memory, stored = runs
    group = zarr.open_group(str(path), mode="r")
    held = stored_columns(group)
    assert held == stored_fields()
    n_sys, n_atoms = group.attrs["n_systems"], group.attrs["n_atoms"]
    for name, kind in held.items():
        assert group[f"{kind}s/{name}"].shape[0] == (n_atoms if kind == "atom" else n_sys)
    free = in_input_order(stored)[NAMES.index("none")]
    assert free.constraints == [] and in_input_order(memory)[NAMES.index("none")].constraints == []
    for a, b in zip(in_input_order(memory), in_input_order(stored)):
        assert np.array_equal(a.positions, b.positions)


def test_an_unconstrained_run_writes_no_constraint_array(tmp_path) -> None:
    path = tmp_path / "free.zarr"
    atoms = [make("none", seed=1), make("FixAtoms", seed=2)]  # (FixAtoms: the fixed column)
    simulator(sinks=[ZarrSink(path)]).run(atoms)
    assert stored_columns(zarr.open_group(str(path), mode="r")) == {}
    back = in_input_order(read_results(path).to_atoms())
    assert back[0].constraints == [] and type(back[1].constraints[0]).__name__ == "FixAtoms"
    batch = read_results(path).batch
    assert not any(batch.has_field(n) for n in stored_fields())


def test_columns_made_by_a_later_append_read_zero_for_earlier_rows(tmp_path) -> None:
    """Free rows, then constrained ones (the columns appear), then free ones again
    (written as zeros): each row reads back with exactly its own constraints, and the
    earlier rows' float columns are 0 (free), not NaN."""
    path = tmp_path / "appended.zarr"
    sink = ZarrSink(path, flush_every=1)
    sink.open({})
    names = ["none", "Hookean", "FixSymmetry", "none"]
    for k, name in enumerate(names):
        sink.write(Batch.from_atoms([make(name, seed=k)], system_ids=[k]))
    sink.close()
    group = zarr.open_group(str(path), mode="r")
    assert group["systems/constraint_dof"][0] == 0 and group["atoms/spring_k"][0] == 0
    back = read_results(path).to_atoms()
    for k, name in enumerate(names):
        want = [] if name == "none" else make(name, seed=k).constraints
        assert_same_constraints(back[k].constraints, want)


def test_a_row_rolled_back_by_a_resume_leaves_no_constraint_behind(tmp_path) -> None:
    """A resume rolls the commit marker back over a constrained row; the free system
    written in its place reads back free (the columns are written on every append)."""
    path = tmp_path / "resumed.zarr"
    sink = ZarrSink(path, flush_every=1)
    sink.open({})
    sink.write(Batch.from_atoms([make("none", seed=0)], system_ids=[0]))
    state = sink.state_dict()
    sink.write(Batch.from_atoms([make("FixedLine", seed=1)], system_ids=[1]))
    sink.load_state_dict(state)  # (the checkpoint before the constrained row)
    sink.write(Batch.from_atoms([make("none", seed=2)], system_ids=[2]))
    sink.close()
    back = read_results(path).to_atoms()
    assert [a.info["system_id"] for a in back] == [0, 2]
    assert back[1].constraints == []


def test_a_merge_carries_the_constraint_columns(tmp_path, runs) -> None:
    """A constrained store merged with an unconstrained one (other ids)."""
    path, memory, _ = runs
    free = tmp_path / "free.zarr"
    sim = simulator(sinks=[ZarrSink(free)])
    sim.run(Batch.from_atoms([make("none", seed=7)], system_ids=[100]))
    out = tmp_path / "merged.zarr"
    merge_stores(out, [free, path])
    merged = {a.info["system_id"]: a for a in read_results(out).to_atoms()}
    assert merged.pop(100).constraints == []
    for a in memory:
        assert_same_constraints(merged[a.info["system_id"]].constraints, a.constraints, exact=True)


@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_pipeline_results_keep_every_kind_and_equal_the_fused_run() -> None:
    """``relax | relax`` on two forked gloo ranks: the second rank gets the systems'
    constraints (before, its wire schema had no constraint field: it relaxed them free)
    and the results carry them, FixSymmetry included, as the fused run's do."""
    from alchemi_lit.strategies.buffers import BufferConfig

    model = LennardJones(epsilon=0.0104, sigma=3.40, cutoff=6.0)

    def relax():
        return FIRE(fmax=1e-3, max_steps=3)

    fused = al.Simulator(model=model, stages=relax() + relax(), precision="64", sync_every=1)
    ref = fused.run(systems()).to_atoms()
    sim = al.Simulator(
        model=model, stages=relax() | relax(), precision="64", sync_every=1,
        strategy="pipeline", devices=2, start_method="fork", timeout=30.0,
        buffer=BufferConfig(num_systems=16, num_atoms=256),
    )  # fmt: skip
    got = sim.run(systems()).to_atoms()
    assert [a.info["system_id"] for a in got] == [a.info["system_id"] for a in ref]
    for a, b in zip(got, ref):
        assert np.array_equal(a.positions, b.positions), a.info["system_id"]
        assert_same_constraints(a.constraints, b.constraints, exact=True)
    assert type(got[NAMES.index("FixSymmetry")].constraints[0]).__name__ == "FixSymmetry"
