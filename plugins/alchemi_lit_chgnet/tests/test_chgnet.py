"""CHGNet plugin: parity with chgnet's own ASE calculator, batching, fused plans, pipelines.

The reference is ``chgnet.model.dynamics.CHGNetCalculator`` on each structure alone
(pymatgen neighbour list, CHGNet's C graph builder, its ``BatchedGraph`` and autograd
with respect to positions and strain).

Why two precisions: CHGNet and its calculator run in float32, where two correct
implementations that sum in different orders differ by float32 round-off.  So the
tight check (1e-6 eV/atom, 1e-5 eV/Å) runs both in float64: the plugin with a float64
batch, and the calculator with CHGNet's float32 constants (``TORCH_DTYPE`` and the
composition model's features) switched to float64 for the test only -- the same code
path, in double precision.  Measured there on these four structures: energies equal,
forces 2e-14 eV/Å, stress 3e-16 eV/Å^3.  Against the unmodified float32 calculator with
a float32 batch: 4.8e-7 eV/atom, 6.4e-6 eV/Å, 7.1e-8 eV/Å^3; asserted at 2e-6, 5e-5
and 1e-6.
"""

from __future__ import annotations

import importlib.util
import warnings
from importlib import metadata

import numpy as np
import pytest
import torch
from ase.build import bulk, fcc111

if importlib.util.find_spec("chgnet") is None:
    pytest.skip(
        "chgnet is not installed (pip install -e plugins/alchemi_lit_chgnet pulls it)",
        allow_module_level=True,
    )
try:
    metadata.distribution("alchemi-lit-chgnet")
except metadata.PackageNotFoundError:
    pytest.skip(
        "the alchemi-lit-chgnet plugin is not installed "
        "(pip install -e plugins/alchemi_lit_chgnet)",
        allow_module_level=True,
    )

from alchemi_lit_chgnet import CHGNet, checkpoint_path, load_network

from alchemi_lit.core.registry import get
from alchemi_lit.core.state import Batch
from alchemi_lit.testing import check_pipeline_equals_fused

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")



def structures() -> list:
    """A rattled Si crystal, a strained NaCl crystal (triclinic), a Cu(111) slab
    (pbc T,T,F) and a Li supercell."""
    rng = np.random.default_rng(0)
    si = bulk("Si", "diamond", a=5.43, cubic=True)
    nacl = bulk("NaCl", "rocksalt", a=5.64, cubic=True)
    nacl.set_cell(nacl.cell.array @ (np.eye(3) + 0.02 * rng.normal(size=(3, 3))), True)
    cu = fcc111("Cu", size=(2, 2, 3), vacuum=5.0)
    li = bulk("Li", "bcc", a=3.5).repeat((2, 2, 2))
    out = [si, nacl, cu, li]
    for a in out:
        a.positions += rng.normal(scale=0.05, size=a.positions.shape)
    return out


@pytest.fixture(scope="module")
def model() -> CHGNet:
    return CHGNet()


def _reference(atoms: list, dtype: torch.dtype, monkeypatch) -> list:
    """Energy, forces and 3x3 stress of each structure from CHGNet's ASE calculator,
    with its float32 constants switched to ``dtype``."""
    import chgnet.graph.converter
    import chgnet.model.model
    from chgnet.model.composition_model import AtomRef
    from chgnet.model.dynamics import CHGNetCalculator

    def composition(self, graphs):  # AtomRef's features, without its final .float()
        dt = self.fc.weight.dtype
        rows = [
            torch.bincount(g.atomic_number - 1, minlength=self.max_num_elements) for g in graphs
        ]
        rows = [
            r.to(dt) / (len(g.atomic_number) if self.is_intensive else 1)
            for r, g in zip(rows, graphs)
        ]
        return torch.stack(rows)

    if dtype == torch.float64:
        monkeypatch.setattr(chgnet.graph.converter, "TORCH_DTYPE", dtype)
        monkeypatch.setattr(chgnet.model.model, "TORCH_DTYPE", dtype)
        monkeypatch.setattr(AtomRef, "_assemble_graphs", composition)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        calc = CHGNetCalculator(model=load_network("0.3.0").to(dtype), use_device="cpu")
    out = []
    for a in atoms:
        a = a.copy()
        a.calc = calc
        out.append((a.get_potential_energy(), a.get_forces(), a.get_stress(voigt=False)))
    return out


@pytest.mark.parametrize(
    ("dtype", "tol"),
    [(torch.float64, (1e-6, 1e-5, 1e-6)), (torch.float32, (2e-6, 5e-5, 1e-6))],
    ids=["float64", "float32"],
)
def test_parity_with_chgnet_calculator(model: CHGNet, monkeypatch, dtype, tol) -> None:
    atoms = structures()
    batch = Batch.from_atoms(atoms, dtype=dtype)
    out = model(batch)  # all four structures in one forward
    assert out["energy"].dtype == dtype and out["forces"].dtype == dtype
    ptr = batch.ptr.tolist()
    for b, (a, (e, f, s)) in enumerate(zip(atoms, _reference(atoms, dtype, monkeypatch))):
        assert abs(float(out["energy"][b]) - e) / len(a) < tol[0], (b, float(out["energy"][b]), e)
        np.testing.assert_allclose(out["forces"][ptr[b] : ptr[b + 1]].double(), f, 0, tol[1])
        np.testing.assert_allclose(out["stress"][b].double(), s, 0, tol[2])


def test_batch_equals_single(model: CHGNet) -> None:
    atoms = structures()
    together = model(Batch.from_atoms(atoms))
    ptr = Batch.from_atoms(atoms).ptr.tolist()
    b = 2  # the slab, between two crystals
    alone = model(Batch.from_atoms([atoms[b]]))
    assert abs(float(alone["energy"][0]) - float(together["energy"][b])) < 1e-10
    torch.testing.assert_close(
        alone["forces"], together["forces"][ptr[b] : ptr[b + 1]], rtol=0, atol=1e-10
    )


def test_registered_and_loaded_from_the_wheel(tmp_path) -> None:
    entry = get("model", "chgnet-mptrj")
    assert entry.cls is CHGNet and entry.preset_args == {"model": "0.3.0"}
    assert entry.source in ("alchemi-lit-chgnet", "alchemi_lit_chgnet")
    path = checkpoint_path("0.3.0")
    assert "chgnet" in path and path.endswith(".pth.tar")  # inside the installed package
    bad = tmp_path / "code.pth.tar"
    torch.save({"model": {"state_dict": {}}, "hook": np.random.default_rng}, bad)
    with pytest.raises(RuntimeError, match="weights_only=True"):
        load_network(str(bad))
    with pytest.raises(ValueError, match="unknown CHGNet model"):
        checkpoint_path("0.9.9")


def test_unsupported_element_is_named(model: CHGNet) -> None:
    from ase import Atoms

    from alchemi_lit.core.errors import ModelError

    og = Atoms("Og2", positions=[[0, 0, 0], [0, 0, 2.5]], cell=[8, 8, 8], pbc=True)
    with pytest.raises(ModelError, match="Og"):
        model.check_batch(Batch.from_atoms([og]))


def test_fire_and_pipeline(model: CHGNet) -> None:
    """A fused FIRE run lowers the energy; the same plan split over two forked ranks
    gives bitwise the fused run's results."""
    atoms = structures()[:2]
    e0 = model(Batch.from_atoms(atoms))["energy"]
    fused = check_pipeline_equals_fused(model, atoms)
    assert torch.all(fused.batch.energy < e0 - 1e-3), (e0, fused.batch.energy)


def test_supported_elements_are_hydrogen_to_plutonium(model: CHGNet) -> None:
    """CHGNet embeds element ``Z`` at row ``Z - 1`` of its 94-row embedding, so the
    supported atomic numbers are 1..94 (H-Pu): Pu is accepted, Z = 0 is not."""
    assert model.net.atom_embedding.embedding.num_embeddings == 94
    assert model.supported_elements == frozenset(range(1, 95))


def test_structure_without_angles_matches_chgnet_calculator(model: CHGNet, monkeypatch) -> None:
    """bcc Li at a = 3.5 Å has no bond shorter than CHGNet's 3 Å bond-graph cutoff
    (nearest neighbours at sqrt(3)/2 a = 3.03 Å), so its bond graph is empty: alone in a
    batch it takes the no-angle branch, and must still equal the calculator (float64,
    bounds of the parity test)."""
    li = bulk("Li", "bcc", a=3.5, cubic=True)
    out = model(Batch.from_atoms([li], dtype=torch.float64))
    ((e, f, s),) = _reference([li], torch.float64, monkeypatch)
    assert abs(float(out["energy"][0]) - e) / len(li) < 1e-6
    np.testing.assert_allclose(out["forces"].double(), f, 0, 1e-5)
    np.testing.assert_allclose(out["stress"][0].double(), s, 0, 1e-6)


def test_bond_graph_has_as_many_angles_as_chgnets_own(model: CHGNet, monkeypatch) -> None:
    """The angles built here are CHGNet's bond graph: for each structure alone, as many
    (ordered pairs of bonds shorter than the 3 Å bond cutoff around one atom) as CHGNet's
    own ``CrystalGraphConverter`` puts in ``bond_graph`` for the pymatgen structure.
    (Angles with a longer bond would add nothing to the energy, so only their number
    shows them, and the cost: they grow with the square of the 6 Å neighbour count.)"""
    import alchemi_lit_chgnet.model as plugin
    from pymatgen.io.ase import AseAtomsAdaptor

    counts: list[int] = []

    def spy(*args):
        first, second = pairs(*args)
        counts.append(len(first))
        return first, second

    pairs = plugin._angle_pairs
    monkeypatch.setattr(plugin, "_angle_pairs", spy)
    for atoms in structures()[:2]:  # Si (4 bonds < 3 Å per atom), strained NaCl
        model(Batch.from_atoms([atoms], dtype=torch.float64))
        graph = model.net.graph_converter(AseAtomsAdaptor.get_structure(atoms))
        assert counts[-1] == len(graph.bond_graph) > 0


def test_checkpoint_without_model_is_refused_with_the_format_named(tmp_path) -> None:
    """A plain-data file that is not a CHGNet checkpoint (no ``model`` entry) fails with
    the expected format named, not with a bare KeyError."""
    bad = tmp_path / "other.pth.tar"
    torch.save({"state_dict": {"w": torch.zeros(1)}}, bad)
    with pytest.raises(RuntimeError, match="model/state_dict"):
        load_network(str(bad))



@pytest.mark.parametrize("a", [2.0, 3.0])
def test_a_shell_at_exactly_a_cutoff_matches_the_calculator(model: CHGNet, monkeypatch, a) -> None:
    """Simple-cubic Cu with a = 2 or 3 Å has a neighbour shell at exactly the 6 Å atom-graph
    cutoff (and at a = 3, one at exactly the 3 Å bond-graph cutoff).  CHGNet's converter
    (pymatgen's neighbour list) keeps pairs at r == cutoff, our adapter keeps r < cutoff:
    the results must still agree, as CHGNet's smooth cutoffs vanish there (float64, the
    parity test's bounds)."""
    from ase import Atoms

    cu = Atoms("Cu", cell=[a, a, a], pbc=True)
    out = model(Batch.from_atoms([cu], dtype=torch.float64, validate=False))
    ((e, f, s),) = _reference([cu], torch.float64, monkeypatch)
    assert abs(float(out["energy"][0]) - e) < 1e-6
    np.testing.assert_allclose(out["forces"].double(), f, 0, 1e-5)
    np.testing.assert_allclose(out["stress"][0].double(), s, 0, 1e-6)
