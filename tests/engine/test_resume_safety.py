"""Nothing finished is lost and a resume never mixes runs (issue #16, parts 2-5):

* a resume of another run -- another stage or criterion parameter, model parameter or
  weight, precision, seed or other coordinates -- is refused, naming what differs, on
  one device and on a pipeline alike;
* a run stopped before its first checkpoint (or without a Checkpoint callback)
  resumes by computing only the systems its store does not hold, and ends as the
  uninterrupted run;
* a damaged checkpoint (a flipped bit, a truncation) is refused, naming the file, and
  the one before it is used;
* a system the model fails on at its first evaluation is never reported converged.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import alchemi_lit as al
from alchemi_lit.callbacks import Checkpoint, HookStageEnum, LambdaCallback
from alchemi_lit.core.errors import ConfigError
from alchemi_lit.core.state import EXIT_CONVERGED, EXIT_MODEL_ERROR
from alchemi_lit.data import SizeAwareSampler, mixed_argon
from alchemi_lit.engine.checkpoint_file import CheckpointDamaged, read_checkpoint
from alchemi_lit.integrators import FIRE, Langevin
from alchemi_lit.models import LennardJones
from alchemi_lit.sinks import ZarrSink

DATA = mixed_argon(10, 8, 30, seed=4)


class Crash(Exception):
    pass


def plan(temperature: float = 60.0, fmax: float = 0.05) -> al.Fused:
    return FIRE(fmax=fmax, max_steps=40) + Langevin(
        dt=2.0, temperature=temperature, friction=0.02, steps=20
    )


def make(
    tmp: Path, stages=None, model=None, crash_at=None, checkpoint=True, every=10, **kw
) -> al.Simulator:
    callbacks = []
    if checkpoint:
        callbacks.append(Checkpoint(tmp / "ckpt", every=every))
    if crash_at is not None:

        def boom(ctx):
            if ctx.step == crash_at:
                raise Crash(f"stopped at step {crash_at}")

        callbacks.append(LambdaCallback(HookStageEnum.AFTER_STEP, boom))
    return al.Simulator(
        model=model or LennardJones(0.0104, 3.40, 6.0),
        stages=stages or plan(),
        sinks=[ZarrSink(tmp / "res.zarr", mode="w", flush_every=1)],
        callbacks=callbacks,
        sync_every=5,
        **kw,
    )


def sampler(data=DATA) -> SizeAwareSampler:
    return SizeAwareSampler(data, max_atoms=120)


def stored(path: Path) -> al.Batch:
    return ZarrSink(path).read_batch()


def assert_same_systems(a: al.Batch, b: al.Batch) -> None:
    assert a.system_id.tolist() == b.system_id.tolist()
    for key in ("positions", "velocities", "forces"):
        assert torch.equal(a.atom[key], b.atom[key]), key
    for key in ("energy", "total_steps", "converged", "exit_code", "stage_steps"):
        assert torch.equal(a.system[key], b.system[key]), key


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> al.Batch:
    tmp = tmp_path_factory.mktemp("reference")
    make(tmp).run(sampler())
    return stored(tmp / "res.zarr")


@pytest.fixture(scope="module")
def crashed(tmp_path_factory) -> Path:
    """A run that crashed at step 35, with checkpoints at steps 20 and 30."""
    tmp = tmp_path_factory.mktemp("crashed")
    with pytest.raises(Crash):
        make(tmp, crash_at=35).run(sampler())
    assert [p.name for p in sorted((tmp / "ckpt").glob("*.ckpt"))] == [
        "step-000000000020.ckpt",
        "step-000000000030.ckpt",
    ]
    return tmp


class _Scaled(LennardJones):
    """LJ with a learnable scale: a model whose weights (state dict) can change."""

    def __init__(self) -> None:
        super().__init__(0.0104, 3.40, 6.0)
        self.scale = torch.nn.Parameter(torch.ones((), dtype=torch.float64))

    def energy_and_edge_gradient(self, batch, edges):
        energy, grad = super().energy_and_edge_gradient(batch, edges)
        return energy * self.scale, grad * self.scale


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (
            {"stages": plan(temperature=300.0)},
            r"stage 1 \(Langevin\)\.temperature: 60\.0 -> 300\.0",
        ),
        ({"stages": plan(fmax=0.02)}, r"stage 0 \(FIRE\)\.criterion\.fmax: 0\.05 -> 0\.02"),
        ({"stages": FIRE(fmax=0.05, max_steps=40)}, r"plan: stages FIRE, Langevin -> FIRE"),
        ({"model": LennardJones(0.0110, 3.40, 6.0)}, r"model\.epsilon: 0\.0104 -> 0\.011"),
        ({"precision": "32"}, r"precision: '64' -> '32'"),
        ({"seed": 7}, r"seed: 0 -> 7"),
    ],
    ids=["temperature", "criterion", "plan", "epsilon", "precision", "seed"],
)
def test_a_resume_of_another_run_is_refused_naming_the_difference(crashed, change, named):
    with pytest.raises(ConfigError, match=named):
        make(crashed, **change).run(sampler(), resume=crashed / "ckpt")


def test_a_resume_with_moved_atoms_or_other_weights_is_refused(tmp_path, crashed):
    moved = [a.copy() for a in DATA]
    moved[3].positions[0, 0] += 1e-9  # same sizes, ids and species
    with pytest.raises(ConfigError, match=r"input structures .* differ"):
        make(crashed).run(sampler(moved), resume=crashed / "ckpt")

    with pytest.raises(Crash):
        make(tmp_path, model=_Scaled(), crash_at=12).run(sampler())
    other = _Scaled()
    with torch.no_grad():
        other.scale.fill_(1.0 + 1e-12)
    with pytest.raises(ConfigError, match=r"model\.weights differ"):
        make(tmp_path, model=other).run(sampler(), resume=tmp_path / "ckpt")


def test_a_flipped_bit_is_refused_and_the_checkpoint_before_it_is_used(
    tmp_path, crashed, reference
):
    import shutil

    shutil.copytree(crashed / "ckpt", tmp_path / "ckpt")
    newest = tmp_path / "ckpt" / "step-000000000030.ckpt"
    data = bytearray(newest.read_bytes())
    data[len(data) * 2 // 3] ^= 0x10  # one bit, inside a record
    newest.write_bytes(bytes(data))
    with pytest.raises(CheckpointDamaged, match=r"step-000000000030\.ckpt.*fails its checksum"):
        read_checkpoint(newest)
    with pytest.raises(ConfigError, match=r"damaged.*resume from step-000000000020\.ckpt"):
        make(tmp_path).run(sampler(), resume=newest)  # the file itself: refused
    # the store the crashed run wrote, as it was (the resume rolls it back to step 20)
    shutil.copytree(crashed / "res.zarr", tmp_path / "res.zarr")
    make(tmp_path).run(sampler(), resume=tmp_path / "ckpt")
    assert_same_systems(reference, stored(tmp_path / "res.zarr"))


@pytest.mark.parametrize("damage", ["truncate", "header"])
def test_damaged_files_are_named_and_all_damaged_is_an_error(tmp_path, crashed, damage):
    import shutil

    shutil.copytree(crashed / "ckpt", tmp_path / "ckpt")
    for f in (tmp_path / "ckpt").glob("*.ckpt"):
        data = f.read_bytes()
        f.write_bytes(
            data[: len(data) // 2] if damage == "truncate" else data[:30] + b"x" + data[31:]
        )
    with pytest.raises(ConfigError, match=r"every checkpoint there is damaged.*step-000000000020"):
        make(tmp_path).run(sampler(), resume=tmp_path / "ckpt")


@pytest.mark.parametrize("crash_at", [1, 45])
def test_stopped_before_the_first_checkpoint_resumes_from_the_store(tmp_path, reference, crash_at):
    """Step 1: nothing finished, no checkpoint, an empty store; step 45: some systems
    finished (and stored), still no checkpoint.  Either way a resume computes the
    systems the store lacks and the store ends as the uninterrupted run's."""
    with pytest.raises(Crash):
        make(tmp_path, crash_at=crash_at, every=100).run(sampler())
    assert not list((tmp_path / "ckpt").glob("*.ckpt"))
    before = len(ZarrSink(tmp_path / "res.zarr"))
    assert (before > 0) == (crash_at == 45)
    results = make(tmp_path, every=100).run(sampler(), resume=tmp_path / "ckpt")
    assert_same_systems(reference, stored(tmp_path / "res.zarr"))
    assert len(results) == len(DATA)  # the stored systems are part of the run's results
    import zarr

    runs = zarr.open_group(str(tmp_path / "res.zarr"), mode="r").attrs["runs"]
    assert len(runs) == 1 and runs[0]["stats"]["resumed"]  # the same run, gone on


def test_without_a_checkpoint_callback_resume_true_computes_only_the_rest(tmp_path, reference):
    with pytest.raises(Crash):
        make(tmp_path, crash_at=45, checkpoint=False).run(sampler())
    done = set(stored(tmp_path / "res.zarr").system_id.tolist())
    assert done
    computed = []
    spy = LambdaCallback(
        HookStageEnum.ON_CONVERGE, lambda ctx: computed.extend(ctx.batch.system_id.tolist())
    )
    sim = make(tmp_path, checkpoint=False)
    sim.callbacks.append(spy)
    sim.run(sampler(), resume=True)
    assert done.isdisjoint(computed)
    assert_same_systems(reference, stored(tmp_path / "res.zarr"))


def test_a_restart_from_another_runs_store_is_refused(tmp_path):
    with pytest.raises(Crash):
        make(tmp_path, crash_at=45, checkpoint=False).run(sampler())
    with pytest.raises(ConfigError, match=r"res\.zarr.*temperature: 60\.0 -> 90\.0"):
        make(tmp_path, stages=plan(temperature=90.0), checkpoint=False).run(sampler(), resume=True)


class _FailsOn(LennardJones):
    """LJ that raises for systems containing a given number of atoms."""

    def __init__(self, n_atoms: int) -> None:
        super().__init__(0.0104, 3.40, 6.0)
        self.bad = n_atoms

    def forward(self, batch, compute_stress=True, neighbors=None):
        if bool((batch.n_atoms == self.bad).any()):
            raise RuntimeError("unsupported structure")
        return super().forward(batch, compute_stress=compute_stress, neighbors=neighbors)


@pytest.mark.parametrize("refill", [False, True])
def test_a_system_failing_at_its_first_evaluation_is_not_converged(refill):
    data = mixed_argon(6, 8, 30, seed=1)
    bad = len(data[4])
    assert sum(len(a) == bad for a in data) == 1
    sim = al.Simulator(model=_FailsOn(bad), stages=plan(), sync_every=5)
    source = SizeAwareSampler(data, max_atoms=60) if refill else data
    res = sim.run(source)
    row = res.system_id.tolist().index(4)
    assert int(res.batch.exit_code[row]) == EXIT_MODEL_ERROR
    assert not bool(res.converged[row])
    assert int(res.stage_steps[row].sum()) == 0  # it never entered a stage ...
    assert int(res.batch.stage_exit[row, 0]) != EXIT_CONVERGED  # ... nor "converged" in FIRE
    assert res.exit_reasons[row] == "model_error"
    others = [r for r in range(len(res)) if r != row]
    assert bool(res.converged[others].all())


def test_a_system_failing_after_converging_is_not_reported_converged():
    """Converged in FIRE, then quarantined in the MD stage: not converged."""
    data = mixed_argon(4, 8, 30, seed=1)

    def poison(ctx):
        if ctx.step == 30:
            b = ctx.batch
            md = b.status == 1
            b.positions = torch.where(b.atom_mask(md).unsqueeze(-1), float("nan"), b.positions)

    sim = al.Simulator(
        model=LennardJones(0.0104, 3.40, 6.0),
        stages=plan(),
        callbacks=[LambdaCallback(HookStageEnum.AFTER_PRE_UPDATE, poison)],
        sync_every=5,
    )
    res = sim.run(data)
    hit = [r for r, reason in enumerate(res.exit_reasons) if reason == "non_finite"]
    assert hit, "the poisoning did not reach a system in the MD stage"
    assert not bool(res.converged[hit].any())


def test_a_checkpoint_file_is_whole_when_renamed_and_refuses_bytes_after_it(tmp_path, monkeypatch):
    """The temporary file is complete and fsynced when it is renamed over the final name
    (a crash then leaves the old file or the new one, never part of one), its records
    come back with their dtypes, and bytes after the last record are refused."""
    import os

    from alchemi_lit.engine import checkpoint_file

    synced: set[int] = set()
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        synced.add(os.fstat(fd).st_ino)
        real_fsync(fd)

    def replace(src, dst) -> None:  # type: ignore[no-untyped-def]
        assert os.stat(src).st_ino in synced, "renamed before it was fsynced"
        assert checkpoint_file.is_intact(src), "renamed before it was complete"
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    records = {"step": 7, "x": torch.arange(5, dtype=torch.float32), "ids": [3, 1]}
    path = checkpoint_file.write_checkpoint(tmp_path / "c.ckpt", records)
    back = read_checkpoint(path)
    assert back["step"] == 7 and back["ids"] == [3, 1]
    assert back["x"].dtype == torch.float32 and torch.equal(back["x"], records["x"])
    path.write_bytes(path.read_bytes() + b"\0")
    with pytest.raises(CheckpointDamaged, match=r"c\.ckpt.*1 unexpected bytes after the last"):
        read_checkpoint(path)


@pytest.mark.parametrize("change", ["cell", "pbc", "species", "ids", "positions"])
def test_the_input_digest_sees_every_structure_field(change):
    """The resume check's input digest differs when any field that changes a system's
    path changes, given as structures or as a Batch (a strained cell resumed as the old
    one would mix two runs)."""
    from alchemi_lit.engine.fingerprint import input_digest
    from conftest import mixed_structures

    data, ids = mixed_structures()[:3], [0, 1, 2]  # cubic, triclinic, mixed pbc
    other, other_ids = [a.copy() for a in data], ids
    if change == "cell":
        other[1].set_cell(other[1].cell.array * (1 + 1e-12), scale_atoms=False)
    elif change == "pbc":
        other[1].pbc = [not p for p in other[1].pbc]
    elif change == "species":
        other[1].numbers[0] = 36
    elif change == "ids":
        other_ids = [0, 2, 1]
        for a, sid in zip(other, other_ids):
            a.info.update(system_id=sid, steps=0)  # (how results carry their ids)
    else:
        other[1].positions[2, 1] += 1e-12
    assert input_digest(other) != input_digest(data)
    batch = al.Batch.from_atoms(data, system_ids=ids)
    changed = al.Batch.from_atoms(other, system_ids=other_ids, validate=False)
    assert input_digest(changed) != input_digest(batch)
    assert input_digest(batch) == input_digest(data)  # the same structures, as a Batch
    assert input_digest(changed) == input_digest(other)


def test_a_restart_keeps_only_this_runs_systems_from_a_shared_store(tmp_path):
    """Restarting without a checkpoint from a store an earlier run also wrote (mode
    "a"), whose last write was interrupted (rows past the commit mark): the stored
    results handed back are this run's committed systems, and the others -- the
    uncommitted one too -- are left to compute."""
    import zarr

    from alchemi_lit.engine.restart import continue_from_stores

    store = tmp_path / "res.zarr"
    for mode, rows, ids in (("w-", [5, 6, 7], [0, 1, 2]), ("a", [1, 2], [11, 12])):
        sink = ZarrSink(store, mode=mode, flush_every=1)
        sink.open({})
        sink.write(al.Batch.from_atoms([DATA[k] for k in rows], system_ids=ids))
        if mode == "a":  # system 13 written, the commit mark not moved on
            marks = dict(zarr.open_group(str(store), mode="r").attrs)
            sink.write(al.Batch.from_atoms([DATA[3]], system_ids=[13]))
            keys = ("n_systems", "n_atoms")
            zarr.open_group(str(store), mode="r+").attrs.update({k: marks[k] for k in keys})
        sink.close()
    data = SizeAwareSampler(DATA[:4], max_atoms=120, system_ids=[10, 11, 12, 13])
    rest, stored_here = continue_from_stores(
        data, True, [ZarrSink(store, mode="a")], None, lambda: None
    )
    assert stored_here.system_id.tolist() == [11, 12]  # not the earlier run's 0, 1, 2
    assert torch.equal(stored_here.positions, al.Batch.from_atoms(DATA[1:3]).positions)
    assert rest.system_ids.tolist() == [10, 13]


def test_a_restart_hands_back_the_systems_of_every_store(tmp_path):
    """Systems a failing first store handed down the chain sit in the second one: a
    restart without a checkpoint leaves them out of the run AND returns them, each
    system once (the first store's copy where both hold it)."""
    from alchemi_lit.engine.restart import continue_from_stores

    first, second = tmp_path / "first.zarr", tmp_path / "second.zarr"
    for path, rows, ids in ((first, [0, 1], [10, 11]), (second, [1, 2], [11, 12])):
        sink = ZarrSink(path, mode="w-", flush_every=1)
        sink.open({})
        sink.write(al.Batch.from_atoms([DATA[k] for k in rows], system_ids=ids))
        sink.close()
    data = SizeAwareSampler(DATA[:4], max_atoms=120, system_ids=[10, 11, 12, 13])
    stores = [ZarrSink(first, mode="a"), ZarrSink(second, mode="a")]
    rest, stored_here = continue_from_stores(data, True, stores, None, lambda: None)
    assert rest.system_ids.tolist() == [13]
    assert sorted(stored_here.system_id.tolist()) == [10, 11, 12]
    order = np.argsort(stored_here.system_id.numpy())
    expected = al.Batch.from_atoms(DATA[:3]).positions
    assert torch.equal(stored_here.select(order.tolist()).positions, expected)


def test_the_fingerprint_tells_array_settings_apart_at_full_precision():
    """A stage or model setting given as an array or tensor (a target stress, per-axis
    masks) is compared at its own precision: a change in the last bits of a float64
    is a different run, small array or large, and equal values compare equal."""
    from alchemi_lit.engine.fingerprint import canonical, differences

    for make in (np.array, torch.tensor):
        for size in (3, 40):  # listed, and digested
            value = np.linspace(1.0, 2.0, size)
            nudged = value.copy()
            nudged[1] += 1e-15
            same = differences(canonical(make(value)), canonical(make(value.copy())))
            assert same == [], (make, size)
            assert differences(canonical(make(value)), canonical(make(nudged))), (make, size)
