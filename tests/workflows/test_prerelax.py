"""A workflow's pre-relaxation (workflows/prerelax.py): FixSymmetry keeps the space group a
free relaxation breaks (NiAs-type NiAl perturbed by 0.1 mÅ, EMT; spglib the reference),
the table says which, and the report's summary counts it."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from alchemi_lit.core.errors import ConfigError
from alchemi_lit.integrators import FIRE
from alchemi_lit.models import EMT
from alchemi_lit.report import summarize, summary_table
from alchemi_lit.workflows import eos

sys.path.insert(0, str(Path(__file__).parents[1] / "integrators"))
from prototypes import perturbed, prototypes


def test_eos_prerelax_keeps_the_space_group() -> None:
    kept = eos(perturbed(prototypes())[14:15], EMT(), n_points=5, prerelax=True, precision="64")
    table = kept.to_pandas()
    assert table.symmetry.tolist() == ["kept"] and table.spacegroup_final.tolist() == [194]
    assert table.prerelax_converged.all() and np.isfinite(table.B0).all()
    assert kept.settings["fix_symmetry"] and kept.settings["prerelax"].startswith("FIRE")


@pytest.mark.slow
def test_without_fix_symmetry_the_prerelax_breaks_it() -> None:
    nias = perturbed(prototypes())[14:15]
    free = eos(nias, EMT(), n_points=5, prerelax=True, fix_symmetry=False, precision="64")
    assert free.to_pandas().symmetry.tolist() == ["broken"]
    assert free.to_pandas().spacegroup_final.tolist() == [11]
    plain = eos(nias, EMT(), n_points=5, precision="64").to_pandas()  # no pre-relaxation
    assert "symmetry" not in plain


def test_prerelax_must_relax_the_cell() -> None:
    with pytest.raises(ConfigError, match="relaxes no cell"):
        eos(perturbed(prototypes())[:1], EMT(), prerelax=FIRE(fmax=0.01))


def test_the_summary_counts_kept_and_broken_space_groups() -> None:
    systems = {
        "energy": np.zeros(3), "n_atoms": np.ones(3, int), "exit_code": np.zeros(3, int),
        "converged": np.ones(3, bool), "system_id": np.array([4, 5, 6]),
        "spacegroup_initial": np.array([225, 194, 160]),
        "spacegroup_final": np.array([225, 11, 221]),
    }  # fmt: skip
    summary = summarize(systems, optimizers=[True])
    assert summary["symmetry"] == {"broken": 1, "kept": 1, "raised": 1, "broken_ids": [5]}
    what, value = (c._cells for c in summary_table(summary).columns)
    rows = dict(zip(what, value))
    assert rows["space group"] == "broken=1, kept=1, raised=1 (system_id 5)"
    assert "symmetry" not in summarize(systems, optimizers=[False])  # MD: nothing relaxed
