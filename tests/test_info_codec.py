"""Per-system info through JSON: what stores and checkpoints keep of ase.Atoms.info."""

from __future__ import annotations

import numpy as np
import torch
from ase.build import bulk

from alchemi_lit.core.info_codec import info_from_json, info_to_json
from alchemi_lit.core.state import Batch
from alchemi_lit.io.serialize import batch_from_state, batch_state


def test_round_trip_keeps_types_dtypes_and_shapes():
    info = {
        "material_id": "mp-149",
        "n": np.int64(7),
        "score": np.float32(0.5),
        "flag": True,
        "none": None,
        "grid": np.arange(6, dtype=np.int32).reshape(2, 3),
        "tensor": torch.tensor([1.5, 2.5], dtype=torch.float64),
        "nested": {"tags": [1, 2, {"deep": np.ones(2)}]},
        "nan": float("nan"),
        "mask": np.array([[True, False], [False, True]]),
        "small": np.array([1, 200], dtype=np.uint8),
        "no_bonds": np.zeros((0, 2), dtype=np.int64),  # a zero dimension: only shape tells
    }
    back = info_from_json(info_to_json(info))
    assert back["material_id"] == "mp-149" and back["n"] == 7 and back["flag"] is True
    assert type(back["n"]) is int and type(back["score"]) is float  # numpy scalars: Python's
    for name in ("mask", "small", "no_bonds"):
        assert (
            back[name].shape == info[name].shape
            and back[name].dtype == info[name].dtype
            and np.array_equal(back[name], info[name])
        )
    assert back["score"] == 0.5 and back["none"] is None
    assert back["grid"].dtype == np.int32 and back["grid"].shape == (2, 3)
    assert np.array_equal(back["grid"], info["grid"])
    assert back["tensor"].dtype == np.float64 and back["tensor"].tolist() == [1.5, 2.5]
    assert np.array_equal(back["nested"]["tags"][2]["deep"], np.ones(2))
    assert np.isnan(back["nan"])


def test_empty_and_unserialisable_entries():
    assert info_to_json({}) == "" and info_to_json(None) == ""
    assert info_from_json("") == {}

    class Thing:
        def __repr__(self) -> str:
            return "Thing()"

    back = info_from_json(info_to_json({"obj": Thing(), "ok": 1}))
    assert back == {"obj": "Thing()", "ok": 1}  # kept as text (a warning names the key)


# ---------------------------------------------------------------------- ASE objects
AR_CIF = """data_Ar
_cell_length_a 5.26
_cell_length_b 5.26
_cell_length_c 5.26
_cell_angle_alpha 90
_cell_angle_beta 90
_cell_angle_gamma 90
_symmetry_space_group_name_H-M 'F m -3 m'
_symmetry_Int_Tables_number 225
loop_
_atom_site_label
_atom_site_type_symbol
_atom_site_fract_x
_atom_site_fract_y
_atom_site_fract_z
Ar1 Ar 0 0 0
"""


def test_ase_objects_come_back_as_themselves(log_messages):
    from ase.cell import Cell
    from ase.spacegroup import Spacegroup

    info = {"spacegroup": Spacegroup(225), "cell": Cell.fromcellpar([3, 4, 5, 90, 90, 100])}
    info["origin_2"] = Spacegroup(227, setting=2)  # (its symmetry operations differ)
    text = info_to_json(info)
    assert '"number": 225' in text  # readable in the store as it is
    back = info_from_json(text)
    assert isinstance(back["spacegroup"], Spacegroup) and back["spacegroup"].no == 225
    assert back["spacegroup"].symbol == "F m -3 m"
    assert back["origin_2"].setting == 2
    assert np.array_equal(back["origin_2"].translations, info["origin_2"].translations)
    assert isinstance(back["cell"], Cell)
    assert np.array_equal(back["cell"].array, info["cell"].array)
    assert not [m for _, m in log_messages if "not JSON data" in m]


def test_cif_inputs_keep_their_spacegroup_without_a_warning(tmp_path, log_messages):
    """Every CIF ASE reads carries a Spacegroup object in its info: a campaign over CIF
    files printed one warning per file and stored the spacegroup as a repr."""
    import alchemi_lit as al
    from alchemi_lit.integrators import FIRE
    from alchemi_lit.models import LennardJones
    from alchemi_lit.sinks import ZarrSink

    for k in range(3):
        (tmp_path / f"ar{k}.cif").write_text(AR_CIF.replace("5.26", f"{5.2 + 0.05 * k:.2f}"))
    store = tmp_path / "r.zarr"
    sim = al.Simulator(
        model=LennardJones(0.0104, 3.40, 6.0), stages=FIRE(max_steps=5), sinks=[ZarrSink(store)]
    )
    sim.run(str(tmp_path / "*.cif"))
    assert not [m for _, m in log_messages if "not JSON data" in m]
    atoms = ZarrSink(store).read()
    assert len(atoms) == 3
    for a in atoms:
        assert a.info["spacegroup"].no == 225 and a.info["spacegroup"].symbol == "F m -3 m"
        assert a.info["source_file"].endswith(".cif")


def test_other_objects_warn_once_per_key_and_type(log_messages):
    class Gadget:
        def __repr__(self) -> str:
            return "Gadget()"

    texts = [info_to_json({"gadget": Gadget()}) for _ in range(5)]
    assert {info_from_json(t)["gadget"] for t in texts} == {"Gadget()"}
    warned = [m for _, m in log_messages if "'info.gadget' (Gadget) is not JSON data" in m]
    assert len(warned) == 1


def test_a_batch_state_round_trips_through_a_weights_only_checkpoint(tmp_path):
    """What a checkpoint holds: every field bit for bit, and the info of each system under
    its (integer) system_id, also for a batch whose rows are not in id order."""
    structures = [bulk("Cu", cubic=True), bulk("Al", cubic=True).repeat((2, 1, 1))]
    structures[1].info.update(label="al", kpts=np.arange(3, dtype=np.int32))
    structures[0].info["label"] = "cu"
    batch = Batch.from_atoms(structures, system_ids=[11, 4])
    batch.energy = torch.tensor([-1.0, float("nan")], dtype=torch.float64)
    torch.save(batch_state(batch), tmp_path / "state.pt")
    back = batch_from_state(torch.load(tmp_path / "state.pt", weights_only=True))
    for store in ("atom", "system"):
        mine, theirs = getattr(batch, store), getattr(back, store)
        assert set(mine) == set(theirs)
        for k in mine:
            assert torch.equal(mine[k].nan_to_num(7.0), theirs[k].nan_to_num(7.0)), k
    assert sorted(back.info) == [4, 11] and back.info[11] == {"label": "cu"}
    assert back.info[4]["label"] == "al" and back.info[4]["kpts"].dtype == np.int32
    assert [a.info["label"] for a in back.to_atoms(results=False)] == ["al", "cu"]
