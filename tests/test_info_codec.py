"""Per-system info through JSON: what stores and checkpoints keep of ase.Atoms.info."""

from __future__ import annotations

import numpy as np
import torch

from alchemi_lit.info_codec import info_from_json, info_to_json


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
    }
    back = info_from_json(info_to_json(info))
    assert back["material_id"] == "mp-149" and back["n"] == 7 and back["flag"] is True
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
