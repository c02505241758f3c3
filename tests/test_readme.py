"""The README's Python examples run as written (sizes shrunk so the test stays fast).

Unmarked blocks run in order in one namespace (later ones continue the quick start);
blocks marked ``<!-- example: NAME -->`` must be self-contained and run alone, and the
tests below check what they compute.  The custom integrator's block is checked in
``test_custom_integrator.py``.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from ase import Atoms

from conftest import README, readme_blocks

# Shrink the examples; everything else runs verbatim.
SHRINK = [
    ("n_systems=32, repeat=3", "n_systems=3, repeat=2"),
    ("max_steps=500", "max_steps=40"),
    ("steps=500", "steps=10"),
    (
        'comm_mode="async_recv",',
        'comm_mode="async_recv", start_method="fork",',
    ),  # not popen under pytest
    ("every_n_steps=1000", "every_n_steps=5"),
]
SKIP = ("my_package", "alchemi_lit_sevenn", "alchemi_lit_chgnet", "alchemi_lit_torchsim")
# (illustrative plugin code / plugins' examples, covered by their own tests)


def shrink(block: str) -> str:
    for old, new in SHRINK:
        block = block.replace(old, new)
    return block


def python_blocks() -> list[str]:
    """The unmarked blocks, shrunk."""
    marked = set(readme_blocks().values())
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    return [shrink(b) for b in blocks if b not in marked and not any(s in b for s in SKIP)]


def run_block(block: str, name: str, namespace: dict | None = None) -> dict:
    namespace = {"__name__": f"readme_{name}"} if namespace is None else namespace
    try:
        exec(compile(block, f"README block {name}", "exec"), namespace)
    except Exception as exc:  # pragma: no cover - the message names the block
        raise AssertionError(f"README python block {name} failed:\n{block}") from exc
    return namespace


@pytest.mark.timeout(300)
def test_readme_python_examples_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blocks = python_blocks()
    assert len(blocks) >= 3
    namespace: dict = {"__name__": "readme"}
    for k, block in enumerate(blocks):
        run_block(block, str(k), namespace)
    assert (tmp_path / "results.zarr").exists()
    # the marked blocks run alone, each in its own test (a name borrowed from another
    # block fails there)
    assert set(readme_blocks()) == {
        "accelerator",
        "checkpoint",
        "custom-cli",
        "custom-integrator",
        "custom-md",
        "model",
        "properties",
    }


def test_readme_accelerator_path(tmp_path, monkeypatch):
    """The accelerator block, alone: the probe counted every step, nine in ten read
    nothing, and the switch is off again afterwards."""
    from alchemi_lit.core import tensor_ops

    monkeypatch.chdir(tmp_path)
    ns = run_block(readme_blocks()["accelerator"], "accelerator")
    assert len(ns["probe"].reads_per_step) >= 60
    assert ns["probe"].share_without_reads() >= 0.9
    assert tensor_ops.CPU_READS_FREE


def test_readme_checkpoint_resume(tmp_path, monkeypatch):
    """The Checkpoint block, alone: the resumed run continues from the last checkpoint
    of the first and gives the same results, each system once."""
    monkeypatch.chdir(tmp_path)
    ns = run_block(shrink(readme_blocks()["checkpoint"]), "checkpoint")
    results, resumed = ns["results"], ns["resumed"]
    assert sorted((tmp_path / "ckpt").glob("*.ckpt")), "no checkpoint written"
    assert (tmp_path / "results.zarr").exists()
    assert sorted(resumed.system_id.tolist()) == list(range(3))
    order, resumed_order = results.system_id.argsort(), resumed.system_id.argsort()
    torch.testing.assert_close(
        resumed.energy[resumed_order], results.energy[order], rtol=0, atol=1e-12
    )
    torch.testing.assert_close(resumed.batch.positions, results.batch.positions, rtol=0, atol=1e-10)


def test_readme_model_matches_analytic_springs():
    """The ``Harmonic`` model of the README: energies and forces of pair springs
    ``k/2 (r - r0)^2`` against the analytic values, two systems in one batch, with a
    pair inside the neighbour list's skin but beyond the cutoff that must not count."""
    from alchemi_lit.core.state import Batch

    ns = run_block(readme_blocks()["model"], "model")
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
def test_readme_properties_workflows(tmp_path, monkeypatch):
    """The materials-properties block, alone (phonopy's supercells shrunk: its symmetry
    set-up of 216-atom supercells takes seconds each); the reference checks are in
    tests/workflows/."""
    pytest.importorskip("phonopy")
    monkeypatch.chdir(tmp_path)
    block = readme_blocks()["properties"]
    fast = 'supercell=2, min_width=0, mesh=[5, 5, 5], npoints=5'
    ns = run_block(block.replace('supercell="auto"', fast), "properties")
    assert list(ns["eos"].to_pandas()["formula"]) == ["Cu", "Al", "Ni", "Ag"]
    elastic = ns["elastic"].to_pandas()
    assert elastic["error"].isna().all() and elastic["born_stable"].all()
    assert (elastic["C11"] > elastic["C12"]).all()  # cubic and stable
    assert type(ns["ph"]).__name__ == "Phonopy"
    assert (tmp_path / "properties" / "elastic.csv").exists()
    assert (tmp_path / "properties" / "elastic" / "0_Cu.json").exists()
