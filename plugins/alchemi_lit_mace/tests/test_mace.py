"""MACE plugin: random MACE-MP-0 architecture, parity with mace's own calculator, safety.

Parity: the same weights, in a module whose e3nn code is left untouched (ours runs it
slimmed, see alchemi_lit.models.fx_slim), evaluated by ``mace.calculators.MACECalculator``
one structure at a time -- mace's own graph construction (matscipy), edge vectors from
positions and shifts, forces and stress from its own autograd on positions and a
symmetric strain -- against one forward of our batch, all in float64.  Measured
differences are at float64 round-off (5e-18 eV, 2e-18 eV/Å, 3e-19 eV/Å^3, with forces
of ~1e-3 eV/Å from the random weights); asserted: 1e-10, i.e. relative agreement of
~1e-7 on the forces (the required 1e-6 absolute would be loose for such small forces).

The model is a random initialisation (no weights ship with mace-torch), so the test
compares the code paths, not physics.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
from importlib import metadata

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.build import bulk, molecule

# find_spec, not importorskip: importing mace here, unguarded, would set the very
# environment variable the tests below check.
# (make test installs both; the commands are in scripts/install_mace.sh and the README)
if importlib.util.find_spec("mace") is None:
    pytest.skip(
        "mace-torch is not installed (see plugins/alchemi_lit_mace/README.md, Install)",
        allow_module_level=True,
    )
try:
    metadata.distribution("alchemi-lit-mace")
except metadata.PackageNotFoundError:
    pytest.skip(
        "the alchemi-lit-mace plugin is not installed "
        "(pip install --no-deps -e plugins/alchemi_lit_mace)",
        allow_module_level=True,
    )

from alchemi_lit_mace import (
    MACE,
    UnsafeCheckpointError,
    load_model,
    mace_import_guard,
    num_parameters,
    save_checkpoint,
)

from alchemi_lit.core.registry import get
from alchemi_lit.core.state import Batch

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")

ENV_VAR = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"
TOL = 1e-10


def environ() -> dict[str, str]:
    """``os.environ`` less the variable pytest itself sets per test."""
    return {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}


def structures() -> list[Atoms]:
    rng = np.random.default_rng(0)
    si = bulk("Si", "diamond", a=5.43, cubic=True)
    nacl = bulk("NaCl", "rocksalt", a=5.64, cubic=True)
    cu = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 1, 1))
    mol = molecule("H2O")
    mol.center(vacuum=4.0)
    mol.pbc = False
    out = [si, nacl, cu, mol]
    for atoms in out:
        atoms.positions += rng.normal(scale=0.05, size=atoms.positions.shape)
    return out


@pytest.fixture(scope="module")
def built() -> dict:
    """The model, with the environment just before and just after building it (the
    first build imports mace; snapshots are taken here because other libraries in the
    same test session may set unrelated variables between tests)."""
    before = environ()
    model = MACE(random_init="small", seed=0)
    return {"model": model, "env_before": before, "env_after": environ()}


@pytest.fixture(scope="module")
def model(built: dict) -> MACE:
    return built["model"]


@pytest.fixture(scope="module")
def untouched_net(model: MACE) -> torch.nn.Module:
    """The reference network: ``model``'s weights with mace's e3nn code as generated."""
    assert model.slim_graphs
    return MACE(random_init="small", seed=0, slim_graphs=False).net.to(torch.float64)


def test_random_small_is_the_mace_mp_small_architecture(model: MACE) -> None:
    assert num_parameters(model.net) == 3_847_696  # MACE-MP-0 small: 3.85 M
    assert model.cutoff == 6.0
    assert len(model.supported_elements) == 89
    assert type(model.net).__name__ == "ScaleShiftMACE"
    assert get("model", "mace-mp-small-random").preset_args == {"random_init": "small"}


def test_environment_and_torch_load_default_unchanged(built: dict, tmp_path) -> None:
    assert built["env_after"] == built["env_before"]
    if built["env_before"].get(ENV_VAR):
        pytest.skip(f"{ENV_VAR} was already set before the model was built")
    assert os.environ.get(ENV_VAR) is None
    # torch.load without weights_only must still refuse arbitrary objects
    path = tmp_path / "obj.pt"
    torch.save({"x": torch.zeros(1), "f": np.random.default_rng}, path)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path)
    # ... also after mace's calculator module (which sets the variable too) is imported
    before = environ()
    with mace_import_guard():
        import mace.calculators  # noqa: F401
    assert environ() == before
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path)


def test_batch_matches_mace_calculator_float64(model: MACE, untouched_net) -> None:
    with mace_import_guard():
        from mace.calculators import MACECalculator

    atoms = structures()
    batch = Batch.from_atoms(atoms, dtype=torch.float64)
    out = model(batch)  # four structures, one forward; the network follows the batch dtype
    assert model.net_dtype == torch.float64
    calc = MACECalculator(models=untouched_net, device="cpu", default_dtype="float64")
    ptr = batch.ptr.tolist()
    for b, a in enumerate(atoms):
        a = a.copy()
        a.calc = calc
        e_ref, f_ref = a.get_potential_energy(), a.get_forces()
        # random weights give small forces (~1e-3 eV/Å), so the bound is far below 1e-6
        assert abs(float(out["energy"][b]) - e_ref) < TOL
        np.testing.assert_allclose(out["forces"][ptr[b] : ptr[b + 1]].numpy(), f_ref, atol=TOL)
        assert np.abs(f_ref).max() > 1e-4  # a non-trivial comparison
        if a.pbc.all():  # mace reports zero stress without periodic cell
            s_ref = a.get_stress(voigt=False)
            np.testing.assert_allclose(out["stress"][b].numpy(), s_ref, atol=TOL)


def test_safe_checkpoint_roundtrip(model: MACE, tmp_path) -> None:
    path = tmp_path / "mace_safe.pt"
    save_checkpoint(model.net, path)
    payload = torch.load(path, weights_only=True)  # plain data: no allowlist needed
    assert payload["format"] == "alchemi_lit_mace/1"
    reloaded = MACE(model_path=str(path))
    batch = Batch.from_atoms(structures()[:2], dtype=torch.float64)
    a, b = model(batch), reloaded(batch)
    torch.testing.assert_close(a["energy"], b["energy"], rtol=0, atol=1e-12)
    torch.testing.assert_close(a["forces"], b["forces"], rtol=0, atol=1e-12)


def test_pickled_module_needs_explicit_trust(model: MACE, tmp_path) -> None:
    path = tmp_path / "whole.model"
    torch.save(model.net, path)  # how mace_run_train writes *.model files
    with pytest.raises(UnsafeCheckpointError, match="trust_pickle"):
        MACE(model_path=str(path))
    before = environ()
    assert type(load_model(path, trust_pickle=True)).__name__ == "ScaleShiftMACE"
    assert environ() == before


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="model_path"):
        MACE()
    with pytest.raises(ValueError, match="dtype"):
        MACE(random_init="small", dtype="float16")  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError):
        MACE(model_path="/nonexistent/model.pt")


def test_stress_matches_mace_calculator_on_strained_triclinic_cells(
    model: MACE, untouched_net
) -> None:
    """Stress drives the cell filters: checked on sheared primitive cells (float64)."""
    with mace_import_guard():
        from mace.calculators import MACECalculator

    rng = np.random.default_rng(3)
    atoms = []
    for cell_of in (bulk("Si", "diamond", a=5.43), bulk("NaCl", "rocksalt", a=5.64) * 2):
        a = cell_of.copy()
        a.set_cell(a.cell.array @ (np.eye(3) + rng.uniform(-0.06, 0.06, (3, 3))), True)
        a.positions += rng.normal(scale=0.05, size=a.positions.shape)
        atoms.append(a)
    out = model(Batch.from_atoms(atoms, dtype=torch.float64))
    calc = MACECalculator(models=untouched_net, device="cpu", default_dtype="float64")
    for b, a in enumerate(atoms):
        a.calc = calc
        ref = a.get_stress(voigt=False)
        assert np.abs(ref).max() > 1e-5  # random weights: small but non-trivial stresses
        np.testing.assert_allclose(out["stress"][b].numpy(), ref, rtol=0, atol=TOL)


def calculator_results(net: torch.nn.Module, atoms: list, dtype: str) -> list:
    """Energy and forces of each structure from ``mace.calculators.MACECalculator``."""
    with mace_import_guard():
        from mace.calculators import MACECalculator

    calc = MACECalculator(models=net, device="cpu", default_dtype=dtype)
    out = []
    for a in atoms:
        a = a.copy()
        a.calc = calc
        out.append((a.get_potential_energy(), a.get_forces()))
    return out


def test_pinned_float32_network_with_a_float64_batch(untouched_net) -> None:
    """``dtype="float32"`` pins the network: a float64 batch leaves it in float32 and gets
    float64 results back, equal to mace's calculator running the same weights in float32.
    Measured: energies equal, forces 3e-9 eV/Å (float32 round-off of two summation
    orders; forces ~1e-3 eV/Å); bound 1e-5 eV and 1e-7 eV/Å.  float32 and float64 runs
    differ by less than that too, so the precision itself is pinned by the dtype checks."""
    import copy

    pinned = MACE(random_init="small", seed=0, dtype="float32")
    atoms = structures()[:2]
    batch = Batch.from_atoms(atoms, dtype=torch.float64)
    out = pinned(batch)
    assert pinned.net_dtype == torch.float32
    assert out["energy"].dtype == torch.float64 and out["forces"].dtype == torch.float64
    ref = calculator_results(copy.deepcopy(untouched_net).float(), atoms, "float32")
    ptr = batch.ptr.tolist()
    for b, (e_ref, f_ref) in enumerate(ref):
        assert abs(float(out["energy"][b]) - e_ref) < 1e-5
        np.testing.assert_allclose(out["forces"][ptr[b] : ptr[b + 1]].numpy(), f_ref, atol=1e-7)


def test_bare_state_dict_loads_strictly_into_the_architecture(
    model: MACE, untouched_net, tmp_path
) -> None:
    """A bare ``state_dict`` with ``random_init`` gives that architecture with the file's
    weights (another seed, so nothing comes from the initialisation): energies equal
    mace's calculator on the original weights (float64, bound as TOL).  A file missing one
    tensor is refused rather than leaving that tensor randomly initialised."""
    state = model.net.state_dict()
    path = tmp_path / "state.pt"
    torch.save(state, path)
    loaded = MACE(model_path=str(path), random_init="small", seed=1)
    atoms = structures()[:1]
    out = loaded(Batch.from_atoms(atoms, dtype=torch.float64))
    (e_ref, f_ref), = calculator_results(untouched_net, atoms, "float64")
    assert abs(float(out["energy"][0]) - e_ref) < TOL
    np.testing.assert_allclose(out["forces"].numpy(), f_ref, atol=TOL)
    partial = dict(state)
    partial.pop(next(k for k in partial if "weight" in k))
    torch.save(partial, path)
    with pytest.raises(RuntimeError, match="Missing key"):
        MACE(model_path=str(path), random_init="small", seed=1)


def test_random_init_follows_its_seed_and_leaves_the_global_rng_alone(model: MACE) -> None:
    """``build_mace_mp`` is deterministic per seed *and* uses only a forked RNG: another
    seed gives other weights (the seed is used), and the global torch RNG state is the
    same before and after the build (the caller's random stream is not consumed)."""
    from alchemi_lit_mace import build_mace_mp

    with torch.random.fork_rng(devices=[]):  # a state no earlier build can have left
        torch.manual_seed(12345)
        before = torch.random.get_rng_state()
        other = build_mace_mp("small", seed=1)
        assert torch.equal(torch.random.get_rng_state(), before)
    theirs, ours = dict(other.named_parameters()), dict(model.net.named_parameters())
    name = next(k for k in ours if ours[k].numel() > 100)
    assert not torch.equal(theirs[name].to(ours[name].dtype), ours[name])


def test_damaged_files_are_refused(model: MACE, tmp_path) -> None:
    """A safe checkpoint missing one tensor is refused (strict load: the tensor would
    otherwise keep its random initialisation), and a trusted pickle that holds no
    module is named as such rather than returned as the "model"."""
    path = tmp_path / "safe.pt"
    save_checkpoint(model.net, path)
    payload = torch.load(path, weights_only=True)
    payload["state_dict"].pop(next(k for k in payload["state_dict"] if "weight" in k))
    torch.save(payload, path)
    with pytest.raises(RuntimeError, match="Missing key"):
        load_model(path)
    other = tmp_path / "not_a_module.model"
    torch.save({"x": torch.zeros(1), "f": np.random.default_rng}, other)  # needs unpickling
    with pytest.raises(ValueError, match="not a MACE module"):
        load_model(other, trust_pickle=True)


def test_network_sees_only_the_pairs_within_r_max(model: MACE) -> None:
    """The Verlet list's skin pairs (r_max < r <= r_max + skin) are dropped before the
    network: it gets exactly the directed edges ASE's ``neighbor_list`` finds within
    r_max = 6 Å.  (MACE's envelope zeroes the skin pairs, so only this count -- and the
    ~40 % of edge work they would cost -- shows whether they were dropped.)"""
    from ase.neighborlist import neighbor_list

    seen: list[int] = []
    hook = model.net.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(args[0]["edge_index"].shape[1]),
        with_kwargs=True,
    )
    try:
        for atoms in structures()[:2]:
            model(Batch.from_atoms([atoms], dtype=torch.float64))
            assert seen[-1] == len(neighbor_list("i", atoms, 6.0)) > 0
    finally:
        hook.remove()
