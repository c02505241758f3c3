"""Sinks read back what was written: HostMemory in system_id order, a ZarrSink's columns
that a later write adds and the model errors of quarantined systems."""

from __future__ import annotations

import numpy as np
import torch
import zarr

import alchemi_lit as al
from alchemi_lit.core.state import MODEL_ERROR_KEY
from alchemi_lit.data import mixed_argon
from alchemi_lit.sinks import HostMemory, ZarrSink

DATA = mixed_argon(4, 8, 30, seed=4)


def host_batch(ids: list[int]) -> al.Batch:
    return al.Batch.from_atoms([DATA[k] for k in ids], system_ids=ids, dtype=torch.float64)


def test_rows_written_before_a_float_column_existed_read_as_nan(tmp_path):
    """Systems 0 and 1 are committed without a ``stage_energy`` column; system 2 brings
    one (-1.5 eV).  The earlier rows read NaN -- not recorded -- and not 0 eV, which
    would pass for an energy."""
    sink = ZarrSink(tmp_path / "r.zarr", flush_every=1)
    sink.open({})
    sink.write(host_batch([0, 1]))
    later = host_batch([2])
    later.ensure_field("stage_energy", "system", dtype=torch.float64, fill=-1.5)
    sink.write(later)
    sink.close()
    column = zarr.open_group(tmp_path / "r.zarr", mode="r")["systems/stage_energy"][:]
    assert np.isnan(column[:2]).all() and column[2] == -1.5


def test_the_model_errors_of_every_flush_are_kept(tmp_path):
    """Two flushes, each with one system the model failed on: the store's ``errors``
    names both (keyed by system_id), the second flush adding to the first's."""
    sink = ZarrSink(tmp_path / "r.zarr", flush_every=1)
    sink.open({})
    for sid, why in ((0, "RuntimeError: first"), (3, "ValueError: second")):
        batch = host_batch([sid])
        batch.info.setdefault(sid, {})[MODEL_ERROR_KEY] = why
        sink.write(batch)
    sink.write(host_batch([1]))  # no error: nothing added or removed
    sink.close()
    errors = dict(zarr.open_group(tmp_path / "r.zarr", mode="r").attrs["errors"])
    assert errors == {"0": "RuntimeError: first", "3": "ValueError: second"}


def test_host_memory_reads_back_in_system_id_order_whatever_the_write_order():
    """Written as ids [3, 1] then [2, 0], HostMemory gives [0, 1, 2, 3] -- ``read()``'s
    documented order, and ``read_batch()``'s, the batch a resume or a caller takes
    directly -- each row still the structure of its id (ASE's positions)."""
    memory = HostMemory()
    memory.write(al.Batch.from_atoms([DATA[3], DATA[1]], system_ids=[3, 1]))
    memory.write(al.Batch.from_atoms([DATA[2], DATA[0]], system_ids=[2, 0]))
    assert memory.read_batch().system_id.tolist() == [0, 1, 2, 3]
    frames = memory.read()
    assert [a.info["system_id"] for a in frames] == [0, 1, 2, 3]
    for atoms in frames:
        np.testing.assert_array_equal(atoms.positions, DATA[atoms.info["system_id"]].positions)


def test_a_run_replacing_a_store_may_reuse_its_ids(tmp_path):
    """``mode="w"`` replaces a store: the ids it held are no clash (only a run appending
    to it must bring new ids).  A second run over the same systems 0 and 1 is not
    refused, and the store then holds its 2 systems once each, as one run."""
    from alchemi_lit.integrators import FIRE
    from alchemi_lit.models import LennardJones

    def run(mode: str) -> None:
        al.Simulator(
            model=LennardJones(0.0104, 3.40, 6.0), stages=FIRE(fmax=0.05, max_steps=1),
            sinks=[ZarrSink(tmp_path / "r.zarr", mode=mode)], accelerator="cpu", precision="64",
        ).run(DATA[:2])  # fmt: skip

    run("w-")
    assert ZarrSink(tmp_path / "r.zarr", mode="w").id_clashes([0, 1]).tolist() == []
    run("w")
    group = zarr.open_group(tmp_path / "r.zarr", mode="r")
    assert group["systems/system_id"][: group.attrs["n_systems"]].tolist() == [0, 1]
    assert len(group.attrs["runs"]) == 1
