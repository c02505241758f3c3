"""TorchSim plugin: Batch <-> SimState conversion and TorchSimModel against the wrapped
TorchSim model's own numbers.

The reference for every number is the wrapped TorchSim model evaluated on the state
TorchSim itself builds from the same ``ase.Atoms`` (``torch_sim.initialize_state``): the
adapter must reproduce it exactly, whatever the model computes.  (torch-sim-atomistic
0.3.0's Lennard-Jones model returns forces twice too large, and wrong energies for
triclinic cells; that is the wrapped model's business, not the adapter's, so these tests
compare with it and never with ASE.)  Triclinic cells check the cell convention: TorchSim
stores lattice vectors as columns.
"""

from __future__ import annotations

import importlib.util
import warnings
from importlib import metadata

import numpy as np
import pytest
import torch
from ase.build import bulk
from ase.cluster import Icosahedron

if importlib.util.find_spec("torch_sim") is None:
    pytest.skip(
        "torch-sim-atomistic is not installed (scripts/install_extra_models.sh installs it)",
        allow_module_level=True,
    )
try:
    metadata.distribution("alchemi-lit-torchsim")
except metadata.PackageNotFoundError:
    pytest.skip(
        "the alchemi-lit-torchsim plugin is not installed "
        "(pip install --no-deps -e plugins/alchemi_lit_torchsim)",
        allow_module_level=True,
    )

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # torch_sim warns about optional model packages
    import torch_sim as ts
    from torch_sim.models.lennard_jones import LennardJonesModel

from alchemi_lit_torchsim import TorchSimModel, build_model, from_sim_state, to_sim_state

from alchemi_lit.core.errors import ConfigError, ModelError
from alchemi_lit.core.registry import get
from alchemi_lit.core.state import Batch
from alchemi_lit.testing import check_pipeline_equals_fused

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")



def argon() -> list:
    """A rattled cubic argon crystal and a strained triclinic one."""
    rng = np.random.default_rng(0)
    cubic = bulk("Ar", "fcc", a=5.26, cubic=True).repeat((2, 2, 2))
    tri = bulk("Ar", "fcc", a=5.26).repeat((3, 3, 3))
    tri.set_cell(tri.cell.array @ (np.eye(3) + 0.05 * rng.normal(size=(3, 3))), scale_atoms=True)
    for a in (cubic, tri):
        a.positions += rng.normal(scale=0.08, size=a.positions.shape)
    return [cubic, tri]


def lj(dtype: torch.dtype = torch.float64, stress: bool = True) -> LennardJonesModel:
    return LennardJonesModel(
        sigma=3.40, epsilon=0.0104, cutoff=6.0, dtype=dtype, compute_stress=stress
    )


def own(model, atoms: list) -> dict[str, torch.Tensor]:
    """The wrapped model's numbers on TorchSim's own state of ``atoms``."""
    return model(ts.initialize_state(atoms, device=torch.device("cpu"), dtype=model.dtype))


def test_sim_state_views_the_batch() -> None:
    atoms = argon()
    batch = Batch.from_atoms(atoms)
    state = to_sim_state(batch)
    ref = ts.initialize_state(atoms, device=torch.device("cpu"), dtype=torch.float64)
    for name in ("positions", "masses", "cell", "atomic_numbers", "system_idx"):
        assert torch.equal(getattr(state, name), getattr(ref, name)), name
        assert getattr(state, name).data_ptr() == getattr(batch, name).data_ptr(), name
    assert torch.equal(state.row_vector_cell, batch.cell)  # columns in TorchSim, rows here
    assert not torch.equal(state.cell, batch.cell)  # the triclinic cell tells them apart
    cast = to_sim_state(batch, dtype=torch.float32)  # another dtype: a copy, ints kept
    assert cast.positions.dtype == torch.float32 and cast.system_idx is batch.system_idx


def test_from_sim_state_round_trip() -> None:
    atoms = argon()
    state = ts.initialize_state(atoms, device=torch.device("cpu"), dtype=torch.float64)
    batch = from_sim_state(state)
    ref = Batch.from_atoms(atoms)
    assert batch.positions is state.positions and batch.system_idx is state.system_idx
    for name in ("positions", "masses", "atomic_numbers", "cell", "pbc", "n_atoms"):
        assert torch.equal(getattr(batch, name), getattr(ref, name)), name
    back = to_sim_state(batch)
    assert torch.equal(back.cell, state.cell)


@pytest.mark.parametrize("model_dtype", [torch.float64, torch.float32], ids=str)
def test_equals_the_wrapped_model(model_dtype: torch.dtype) -> None:
    atoms = argon()
    model = lj(model_dtype)
    out = TorchSimModel(model)(Batch.from_atoms(atoms))  # float64 batch
    ref = own(model, atoms)
    assert all(v.dtype == torch.float64 for v in out.values())
    n = torch.tensor([len(a) for a in atoms])
    assert ((out["energy"] - ref["energy"].double()).abs() / n).max() < 1e-6
    torch.testing.assert_close(out["forces"], ref["forces"].double(), rtol=0, atol=1e-5)
    torch.testing.assert_close(out["stress"], ref["stress"].double(), rtol=0, atol=1e-7)


def test_systems_of_different_pbc_are_evaluated_apart() -> None:
    """Two crystals around a cluster without a cell: one SimState per pbc pattern (a
    SimState has one pbc), results put back in place; the cluster's stress is zero
    (TorchSim divides by its zero volume)."""
    cluster = Icosahedron("Ar", 2, latticeconstant=5.26)
    cluster.set_cell(np.zeros((3, 3)))
    cluster.pbc = False
    atoms = [argon()[0], cluster, argon()[1]]
    model = lj()
    batch = Batch.from_atoms(atoms)
    out = TorchSimModel(model)(batch)
    ptr = batch.ptr.tolist()
    for b, a in enumerate(atoms):
        ref = own(model, [a])
        torch.testing.assert_close(out["energy"][b], ref["energy"][0], rtol=0, atol=1e-12)
        torch.testing.assert_close(
            out["forces"][ptr[b] : ptr[b + 1]], ref["forces"], rtol=0, atol=1e-12
        )
    assert torch.equal(out["stress"][1], torch.zeros(3, 3, dtype=torch.float64))
    assert torch.isfinite(out["stress"]).all()


def test_mace_through_torchsim_equals_both_maces() -> None:
    """TorchSim's MaceModel around a real MACE network (the MACE-MP-0 small architecture,
    random weights: no weights are available offline) through the adapter equals
    TorchSim's own numbers and the MACE plugin's independent batched evaluation."""
    if importlib.util.find_spec("alchemi_lit_mace") is None:
        pytest.skip("the alchemi-lit-mace plugin is not installed (scripts/install_mace.sh)")
    from alchemi_lit_mace import MACE
    from torch_sim.models.mace import MaceModel

    plugin = MACE(random_init="small", dtype="float64", seed=0)
    wrapped = MaceModel(model=plugin.net, device=torch.device("cpu"), dtype=torch.float64)
    atoms = [argon()[1][:12]]  # 12 atoms of the triclinic cell, which stays periodic
    atoms[0].numbers[:6] = 29  # Cu and Ar
    batch = Batch.from_atoms(atoms)
    out = TorchSimModel(wrapped)(batch)
    ref = own(wrapped, atoms)
    for key in ("energy", "forces", "stress"):
        torch.testing.assert_close(out[key], ref[key], rtol=0, atol=1e-10, msg=key)
    theirs = plugin(batch)
    for key in ("energy", "forces", "stress"):
        torch.testing.assert_close(out[key], theirs[key], rtol=0, atol=1e-8, msg=key)


def test_fused_plan_and_pipeline() -> None:
    """FIRE with the adapter: the results it records are the wrapped model's own numbers
    on the final structures, and a two-rank pipeline gives bitwise the fused run."""
    fused = check_pipeline_equals_fused(TorchSimModel(lj()), argon(), steps=(6, 4))
    ref = own(lj(), fused.to_atoms())
    torch.testing.assert_close(fused.batch.energy, ref["energy"], rtol=0, atol=1e-12)
    torch.testing.assert_close(fused.batch.forces, ref["forces"], rtol=0, atol=1e-12)


def test_built_from_a_config_path() -> None:
    assert get("model", "TorchSimModel").cls is TorchSimModel
    model = TorchSimModel(
        "torch_sim.models.lennard_jones.LennardJonesModel",
        {"sigma": 3.4, "epsilon": 0.0104, "cutoff": 6.0, "dtype": "float64"},
    )
    assert model.wrapped.dtype == torch.float64 and model.cutoff == 6.0
    assert (
        build_model(
            "torch_sim.models.lennard_jones.LennardJonesModel", {"dtype": "torch.float32"}
        ).dtype
        == torch.float32
    )


@pytest.mark.parametrize(
    ("make", "error", "words"),
    [
        (lambda: TorchSimModel("torch_sim.models.nothing.Model"), ConfigError, "cannot import"),
        (lambda: TorchSimModel(lj(), {"sigma": 1.0}), ConfigError, "already built"),
        (lambda: TorchSimModel(torch.nn.Linear(2, 2)), TypeError, "ModelInterface"),
        (
            lambda: build_model(
                "torch_sim.models.lennard_jones.LennardJonesModel", {"dtype": "f64"}
            ),
            ConfigError,
            "not a torch dtype",
        ),
    ],
)
def test_bad_model_is_named(make, error, words) -> None:
    with pytest.raises(error, match=words):
        make()


def test_missing_stress_is_named_with_the_fix() -> None:
    batch = Batch.from_atoms(argon())
    with pytest.raises(ModelError, match="compute_stress=True"):
        TorchSimModel(lj(stress=False), compute_stress=True)(batch)
    out = TorchSimModel(lj(stress=False))(batch)  # follows the model: no stress asked
    assert "stress" not in out


def mixed_pbc_atoms() -> list:
    """Two argon crystals around an argon cluster without a cell (two pbc patterns)."""
    cluster = Icosahedron("Ar", 2, latticeconstant=5.26)
    cluster.set_cell(np.zeros((3, 3)))
    cluster.pbc = False
    return [argon()[0], cluster, argon()[1]]


def test_mixed_pbc_batch_in_reverse_id_order_keeps_each_systems_numbers() -> None:
    """A mixed-pbc batch is split per pbc pattern and put back by *row*: with the rows in
    reverse ``system_id`` order (as after a scheduler's reordering) every row's energy,
    forces and stress are those TorchSim computes for that structure alone, and the
    crystals keep their own (non-zero) stress -- only the cell-less cluster gets zero."""
    atoms = mixed_pbc_atoms()
    model = lj()
    batch = Batch.from_atoms(atoms).select([2, 1, 0])  # rows hold system_id 2, 1, 0
    assert batch.system_id.tolist() == [2, 1, 0]
    out = TorchSimModel(model)(batch)
    ptr = batch.ptr.tolist()
    for row, sid in enumerate(batch.system_id.tolist()):
        ref = own(model, [atoms[sid]])
        torch.testing.assert_close(out["energy"][row], ref["energy"][0], rtol=0, atol=1e-12)
        torch.testing.assert_close(
            out["forces"][ptr[row] : ptr[row + 1]], ref["forces"], rtol=0, atol=1e-12
        )
        if atoms[sid].pbc.all():
            assert float(ref["stress"][0].abs().max()) > 1e-5  # a non-trivial comparison
            torch.testing.assert_close(out["stress"][row], ref["stress"][0], rtol=0, atol=1e-12)
        else:
            assert torch.equal(out["stress"][row], torch.zeros(3, 3, dtype=torch.float64))


def test_to_sim_state_refuses_systems_of_different_pbc() -> None:
    """A SimState has one pbc for all its systems: converting a crystal and a cell-less
    cluster together must fail with the fix named, not silently give the cluster the
    crystal's periodicity."""
    with pytest.raises(ModelError, match="one pbc"):
        to_sim_state(Batch.from_atoms(mixed_pbc_atoms()))


def test_from_sim_state_of_a_cluster_is_not_periodic() -> None:
    """TorchSim's state of a non-periodic cluster converts to a batch whose pbc is
    (False, False, False), as ``Batch.from_atoms`` gives for the same ``ase.Atoms``."""
    cluster = mixed_pbc_atoms()[1]
    state = ts.initialize_state([cluster], device=torch.device("cpu"), dtype=torch.float64)
    batch = from_sim_state(state)
    assert torch.equal(batch.pbc, Batch.from_atoms([cluster]).pbc)
    assert not bool(batch.pbc.any())


def test_from_sim_state_velocities_are_momenta_over_masses() -> None:
    """An MD state's momenta become velocities ``p / m``: the batch's kinetic energy per
    system equals TorchSim's ``calc_kinetic_energy`` of the same momenta and masses
    (both 1/2 sum p^2/m, in the same units)."""
    from torch_sim.integrators import MDState

    atoms = argon()
    base = ts.initialize_state(atoms, device=torch.device("cpu"), dtype=torch.float64)
    momenta = torch.randn(base.positions.shape, dtype=torch.float64,
                          generator=torch.Generator().manual_seed(0))  # fmt: skip
    state = MDState(
        positions=base.positions, masses=base.masses, cell=base.cell, pbc=base.pbc,
        atomic_numbers=base.atomic_numbers, system_idx=base.system_idx, momenta=momenta,
        energy=torch.zeros(2, dtype=torch.float64), forces=torch.zeros_like(momenta),
    )  # fmt: skip
    batch = from_sim_state(state)
    torch.testing.assert_close(batch.velocities * batch.masses.unsqueeze(-1), momenta)
    ref = ts.quantities.calc_kinetic_energy(
        masses=base.masses, momenta=momenta, system_idx=base.system_idx
    )
    torch.testing.assert_close(batch.kinetic_energy(), ref, rtol=1e-12, atol=0)


def test_stress_asked_off_is_not_returned() -> None:
    """``compute_stress=False`` in the call wins over the wrapper's default: no stress is
    returned (so no stage pays for it), while the energy and forces are the model's."""
    batch = Batch.from_atoms(argon())
    out = TorchSimModel(lj(stress=True))(batch, compute_stress=False)
    assert "stress" not in out
    torch.testing.assert_close(out["energy"], own(lj(), argon())["energy"], rtol=0, atol=1e-12)


def test_slab_next_to_a_crystal_is_never_given_zeros() -> None:
    """pbc patterns are whole rows: a slab (T, T, F) next to a crystal (T, T, T) is its own
    pattern, not merged into "True"/"False" flags, so it is evaluated (TorchSim >= 0.4.1:
    TorchSim's own numbers) or refused with the fix named (older TorchSim: one flag for
    all axes) -- never left with a zero energy."""
    from alchemi_lit_torchsim.model import _per_axis_pbc

    slab = argon()[0].copy()
    slab.pbc = (True, True, False)
    atoms = [argon()[1], slab]
    model = lj()
    batch = Batch.from_atoms(atoms)
    if not _per_axis_pbc():
        with pytest.raises(ModelError, match="slab"):
            TorchSimModel(model)(batch)
        return
    out = TorchSimModel(model)(batch)
    for b, a in enumerate(atoms):
        ref = own(model, [a])["energy"][0]
        torch.testing.assert_close(out["energy"][b], ref, rtol=0, atol=1e-12)


def test_float32_model_gets_a_float32_state_and_float64_results() -> None:
    """A float32 TorchSim model is handed a float32 state (what its dtype says it takes:
    a real MLIP's float32 weights would refuse or silently upcast float64 inputs) and its
    results come back in the float64 batch's dtype."""
    seen: list[torch.dtype] = []

    class Spy(LennardJonesModel):
        def forward(self, state, **kwargs):  # type: ignore[override]
            seen.append(state.positions.dtype)
            return super().forward(state, **kwargs)

    spy = Spy(sigma=3.40, epsilon=0.0104, cutoff=6.0, dtype=torch.float32, compute_stress=True)
    out = TorchSimModel(spy)(Batch.from_atoms(argon()))
    assert seen == [torch.float32]
    assert all(v.dtype == torch.float64 for v in out.values())
