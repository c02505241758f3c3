"""``data.constraints`` in a run config: every structure gets them, the results carry
them back; bad specs name their config key.  Reference: the same constraints set on
``ase.Atoms`` by hand (ASE's own objects), run through the Python API."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from alchemi_lit.cli import main
from alchemi_lit.core.errors import ConfigError
from alchemi_lit.data import BUILTIN_SETS
from alchemi_lit.data.constraint_specs import apply_specs, check_specs
from alchemi_lit.sinks import read_results
from conftest import argon_bulk

SPECS = [
    {"type": "FixAtoms", "tags": [1]},
    {"type": "FixCartesian", "indices": "4:8", "mask": [False, False, True]},
    {"type": "FixedLine", "indices": [9], "direction": [1, 1, 0]},
    {"type": "Hookean", "a1": 10, "a2": 11, "k": 2.0, "rt": 3.0},
]


def test_specs_become_ase_constraints() -> None:
    atoms = argon_bulk(2)
    atoms.set_tags([1, 1] + [0] * (len(atoms) - 2))
    apply_specs(atoms, check_specs(SPECS))
    names = [type(c).__name__ for c in atoms.constraints]
    assert names == ["FixAtoms", "FixCartesian", "FixedLine", "Hookean"]
    assert atoms.constraints[0].index.tolist() == [0, 1]
    assert atoms.constraints[1].index.tolist() == [4, 5, 6, 7]
    assert atoms.get_number_of_degrees_of_freedom() == 3 * len(atoms) - 6 - 4 - 2


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"type": "FixSpin"}, "data.constraints[0]: unknown constraint type 'FixSpin'"),
        ({"type": "FixAtoms"}, "by 'indices' or 'tags'"),
        ({"type": "FixCom", "mask": [1]}, "FixCom takes no arguments, not ['mask']"),
    ],
)
def test_bad_specs_name_their_key(spec, words) -> None:
    with pytest.raises(ConfigError) as err:
        check_specs([spec])
    assert words in str(err.value)


def test_a_config_run_applies_them_to_every_structure(tmp_path: Path) -> None:
    store = tmp_path / "c.zarr"
    config = {
        "simulator": {
            "model": {"class_path": "lj-argon"},
            "stages": [{"class_path": "FIRE", "init_args": {"fmax": 0.05, "max_steps": 5}}],
            "sinks": [{"class_path": "ZarrSink", "init_args": {"store": str(store)}}],
            "precision": "64",
        },
        "data": {
            "structures": "builtin:argon",
            "builtin_args": {"n_systems": 2, "repeat": 2},
            "constraints": [{"type": "FixCartesian", "indices": "0:3", "mask": [0, 0, 1]}],
        },
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["run", "--config", str(path)]) == 0
    inputs = BUILTIN_SETS["argon"](n_systems=2, repeat=2)
    for before, after in zip(inputs, read_results(store).to_atoms()):
        moved = np.abs(after.positions - before.positions)
        assert np.all(moved[:3, 2] == 0) and np.all(moved[:3, :2].max() > 0)  # z fixed only
        assert moved[3:, 2].max() > 0
