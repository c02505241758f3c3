"""What the marked examples of the docs compute, checked (each block run alone, as written).

A block marked ``<!-- example: NAME -->`` on the line before its fence must run on its
own; tests/docs/test_code_blocks.py runs every block of every page in order, and the
tests here check what these compute.  The custom integrator's blocks are checked in
``tests/integrators/test_custom_integrator.py``, the CLI's in ``tests/cli/test_cli_class.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ase import Atoms

from conftest import doc_blocks


def run_block(block: str, name: str) -> dict:
    """Run one marked block in a namespace of its own (a name borrowed from another
    block fails here)."""
    namespace = {"__name__": f"docs_{name}"}
    try:
        exec(compile(block, f"docs block {name}", "exec"), namespace)
    except Exception as exc:  # pragma: no cover - the message names the block
        raise AssertionError(f"docs python block {name} failed:\n{block}") from exc
    return namespace


def test_marked_examples_are_the_checked_ones():
    """Every marked block has its test (here or named above), and no name is lost."""
    assert set(doc_blocks()) == {
        "accelerator",
        "checkpoint",
        "custom-cli",
        "custom-integrator",
        "custom-md",
        "model",
        "properties",
    }


def test_docs_accelerator_path(tmp_path, monkeypatch):
    """The accelerator block, alone: the probe counted every step, nine in ten read
    nothing, and the switch is off again afterwards."""
    from alchemi_lit.core import tensor_ops

    monkeypatch.chdir(tmp_path)
    ns = run_block(doc_blocks()["accelerator"], "accelerator")
    assert len(ns["probe"].reads_per_step) >= 60
    assert ns["probe"].share_without_reads() >= 0.9
    assert tensor_ops.CPU_READS_FREE


def test_docs_checkpoint_resume(tmp_path, monkeypatch):
    """The Checkpoint block, alone: the resumed run continues from the last checkpoint
    of the first and gives the same results, each system once."""
    monkeypatch.chdir(tmp_path)
    ns = run_block(doc_blocks()["checkpoint"], "checkpoint")
    results, resumed = ns["results"], ns["resumed"]
    assert sorted((tmp_path / "ckpt").glob("*.ckpt")), "no checkpoint written"
    assert (tmp_path / "results.zarr").exists()
    assert sorted(resumed.system_id.tolist()) == list(range(4))
    order, resumed_order = results.system_id.argsort(), resumed.system_id.argsort()
    torch.testing.assert_close(
        resumed.energy[resumed_order], results.energy[order], rtol=0, atol=1e-12
    )
    torch.testing.assert_close(resumed.batch.positions, results.batch.positions, rtol=0, atol=1e-10)


def test_docs_model_matches_analytic_springs():
    """The ``Harmonic`` model of the model-plugin tutorial: energies and forces of pair springs
    ``k/2 (r - r0)^2`` against the analytic values, two systems in one batch, with a
    pair inside the neighbour list's skin but beyond the cutoff that must not count."""
    from alchemi_lit.core.state import Batch

    ns = run_block(doc_blocks()["model"], "model")
    k, r0, cutoff = 2.0, 1.0, 2.0
    model = ns["Harmonic"](k=k, r0=r0, cutoff=cutoff)
    dimer = Atoms("Ar2", positions=[[0, 0, 0], [1.3, 0, 0]], pbc=False)
    # a bent trimer: pairs 0-1 (1.2 Å) and 1-2 (1.1 Å) are springs, 0-2 (2.25 Å) is not
    p2 = np.array([1.2, 0, 0]) + 1.1 * np.array([np.cos(0.3), np.sin(0.3), 0])
    trimer = Atoms("Ar3", positions=[[0, 0, 0], [1.2, 0, 0], p2], pbc=False)
    assert cutoff < trimer.get_distance(0, 2) < cutoff + model.neighbors.skin
    batch = Batch.from_atoms([dimer, trimer], dtype=torch.float64)
    out = model(batch)

    def springs(atoms, pairs):
        e, f = 0.0, np.zeros((len(atoms), 3))
        for i, j in pairs:
            d = atoms.positions[j] - atoms.positions[i]
            r = np.linalg.norm(d)
            e += 0.5 * k * (r - r0) ** 2
            f[i] += k * (r - r0) * d / r  # a stretched spring pulls i towards j
            f[j] -= k * (r - r0) * d / r
        return e, f

    e_ref, f_ref = zip(springs(dimer, [(0, 1)]), springs(trimer, [(0, 1), (1, 2)]))
    np.testing.assert_allclose(out["energy"].numpy(), e_ref, rtol=1e-12, atol=0)
    np.testing.assert_allclose(out["forces"].numpy(), np.concatenate(f_ref), rtol=0, atol=1e-12)
    assert abs(e_ref[0] - 0.5 * k * 0.3**2) < 1e-12  # the dimer, by hand


@pytest.mark.timeout(300)
def test_docs_properties_workflows(tmp_path, monkeypatch):
    """The materials-properties block, alone (phonopy's supercells shrunk: its symmetry
    set-up of 216-atom supercells takes seconds each); the reference checks are in
    tests/workflows/."""
    pytest.importorskip("phonopy")
    monkeypatch.chdir(tmp_path)
    block = doc_blocks()["properties"]
    fast = 'supercell=2, min_width=0, mesh=[5, 5, 5], npoints=5'
    ns = run_block(block.replace('supercell="auto"', fast), "properties")
    assert list(ns["eos"].to_pandas()["formula"]) == ["Cu", "Al", "Ni", "Ag"]
    elastic = ns["elastic"].to_pandas()
    assert elastic["error"].isna().all() and elastic["born_stable"].all()
    assert (elastic["C11"] > elastic["C12"]).all()  # cubic and stable
    assert type(ns["ph"]).__name__ == "Phonopy"
    assert (tmp_path / "properties" / "elastic.csv").exists()
    assert (tmp_path / "properties" / "elastic" / "0_Cu.json").exists()
